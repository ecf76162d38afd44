//! Every real fixture in `../shared/testdata/profiles` either decodes or is
//! refused with a clear error, as SOURCES.md says it should be.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::io::Write;
use std::path::PathBuf;

use kiln_pprof::{DecodeLimits, PprofError, decode};

fn fixtures_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/profiles");
    if dir.is_dir() {
        Some(dir)
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: ../shared/testdata/profiles is not present in this checkout"
        );
        None
    }
}

const VALID: &[&str] = &[
    "google-pprof/large.cpu.pb.gz",
    "google-pprof/sample.cpu.pb.gz",
    "google-pprof/go.nomappings.crash.pb.gz",
    "google-pprof/cppbench.cpu.pb.gz",
    "google-pprof/cppbench.heap.pb.gz",
    "google-pprof/java.cpu.pb.gz",
    "parca/alloc_objects.pb.gz",
    "parca/labels.pb.gz",
    "parca/profile-with-labels.pb.gz",
    "parca/node-profile.pb.gz",
    "parca/stripped-cpu.stripped.pprof",
    "parca/fgprof.pb.gz",
    "parca/two-stacks.pb.gz",
    "parca/many/1644509272337470000.pb.gz",
    "parca/many/1644509287338709000.pb.gz",
    "parca/many/1644509299337903000.pb.gz",
    "grafana-pyroscope/go.cpu.labels.pb.gz",
    "grafana-pyroscope/heap.pb.gz",
    "grafana-pyroscope/heap_go_truncated_3.pb.gz",
    "grafana-pyroscope/profile_java.pb.gz",
    "grafana-pyroscope/profile_python.pb.gz",
    "grafana-pyroscope/profile_rust.pb.gz",
    "grafana-pyroscope/dotnet.labels.pb",
    "grafana-pyroscope/cpu-unknown.pb.gz",
    // Invalid UTF-8 in the string table is replaced, not refused.
    "grafana-pyroscope/invalid_utf8.pb.gz",
];

#[test]
fn every_valid_fixture_decodes() {
    let Some(dir) = fixtures_dir() else { return };
    for name in VALID {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let profile =
            decode(&bytes, &DecodeLimits::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!profile.sample_types().is_empty(), "{name}");
        assert!(!profile.samples().is_empty(), "{name}");
    }
}

#[test]
fn legacy_and_foreign_formats_are_refused_as_not_protobuf() {
    let Some(dir) = fixtures_dir() else { return };
    for name in [
        "google-pprof/cppbench.cpu.legacy",
        "grafana-pyroscope/dump2.jfr.gz",
    ] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let error = decode(&bytes, &DecodeLimits::default()).unwrap_err();
        assert!(
            matches!(error, PprofError::Protobuf { .. }),
            "{name}: {error}"
        );
    }
}
