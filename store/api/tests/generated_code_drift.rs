//! Fails when the checked-in tonic/prost code no longer matches `proto/`.
//!
//! Regenerate with `KILN_BLESS=1 cargo test -p kiln-api --test generated_code_drift`.
//! Needs `protoc` (Debian `protobuf-compiler`).

use std::path::Path;

/// The generated files, one per protobuf package.
const GENERATED_FILES: [&str; 12] = [
    "kiln.otlp.v1_10.rs",
    "kiln.otlp.v1_7.rs",
    "kiln.otlp.v1_8.rs",
    "kiln.otlp.v1_9.rs",
    "kiln.query.v1.rs",
    "opentelemetry.proto.collector.profiles.v1development.rs",
    "opentelemetry.proto.common.v1.rs",
    "opentelemetry.proto.resource.v1.rs",
    "parca.profilestore.v1alpha1.rs",
    "push.v1.rs",
    "querier.v1.rs",
    "types.v1.rs",
];

#[test]
fn checked_in_tonic_code_matches_the_proto_schemas() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto_dir = crate_dir.join("proto");
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir.path())
        .compile_protos(
            &[
                proto_dir.join("kiln/otlp/v1_7/profiles.proto"),
                proto_dir.join("kiln/otlp/v1_8/profiles.proto"),
                proto_dir.join("kiln/otlp/v1_9/profiles.proto"),
                proto_dir.join("kiln/otlp/v1_10/profiles.proto"),
                proto_dir.join(
                    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
                ),
                proto_dir.join("kiln/query/v1/query.proto"),
                proto_dir.join("parca/profilestore/v1alpha1/profilestore.proto"),
                proto_dir.join("push/v1/push.proto"),
                proto_dir.join("querier/v1/querier.proto"),
                proto_dir.join("types/v1/types.proto"),
            ],
            std::slice::from_ref(&proto_dir),
        )
        .expect("protoc is needed to check generated code (apt-get install protobuf-compiler)");
    let bless = std::env::var_os("KILN_BLESS").is_some();
    let mut stale = Vec::new();
    for file in GENERATED_FILES {
        let fresh = std::fs::read_to_string(out_dir.path().join(file))
            .unwrap_or_else(|e| panic!("protoc did not produce {file}: {e}"));
        let checked_in_path = crate_dir.join("src/generated").join(file);
        if bless {
            std::fs::write(&checked_in_path, &fresh).expect("write the generated file");
            continue;
        }
        let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
        if checked_in != fresh {
            stale.push(checked_in_path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated code {stale:?}: run KILN_BLESS=1 cargo test -p kiln-api --test generated_code_drift and commit it"
    );
}
