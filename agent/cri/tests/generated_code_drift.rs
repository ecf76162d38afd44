//! Fails when the checked-in tonic/prost code no longer matches `proto/`.
//!
//! Regenerate with `KILN_BLESS=1 cargo test -p kiln-cri --test generated_code_drift`.
//! Needs `protoc` (Debian `protobuf-compiler`).

use std::path::Path;

const GENERATED_FILE: &str = "runtime.v1.rs";

#[test]
fn checked_in_cri_code_matches_the_proto_schema() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto_dir = crate_dir.join("proto");
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir.path())
        .compile_protos(
            &[proto_dir.join("runtime/v1/api.proto")],
            std::slice::from_ref(&proto_dir),
        )
        .expect("protoc is needed to check generated code (apt-get install protobuf-compiler)");
    let fresh = std::fs::read_to_string(out_dir.path().join(GENERATED_FILE))
        .expect("protoc produced runtime.v1.rs");
    let checked_in_path = crate_dir.join("src/generated").join(GENERATED_FILE);
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&checked_in_path, &fresh).expect("write the generated file");
        return;
    }
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "stale generated code {}: run KILN_BLESS=1 cargo test -p kiln-cri --test generated_code_drift and commit it",
        checked_in_path.display()
    );
}
