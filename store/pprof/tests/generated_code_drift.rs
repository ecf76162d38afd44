//! Fails when the checked-in prost code no longer matches `proto/profile.proto`.
//!
//! Regenerate with `KILN_BLESS=1 cargo test -p kiln-pprof --test generated_code_drift`.
//! Needs `protoc` (Debian `protobuf-compiler`).

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::path::Path;

#[test]
fn checked_in_prost_code_matches_the_proto_schema() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = tempfile::tempdir().unwrap();
    prost_build::Config::new()
        .out_dir(out_dir.path())
        .compile_protos(
            &[crate_dir.join("proto/profile.proto")],
            &[crate_dir.join("proto")],
        )
        .expect("protoc is needed to check generated code (apt-get install protobuf-compiler)");
    let fresh = std::fs::read_to_string(out_dir.path().join("perftools.profiles.rs")).unwrap();
    let checked_in_path = crate_dir.join("src/generated/perftools.profiles.rs");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&checked_in_path, &fresh).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "{} is stale: run KILN_BLESS=1 cargo test -p kiln-pprof --test generated_code_drift and commit it",
        checked_in_path.display()
    );
}
