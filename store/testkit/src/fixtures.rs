//! The real fixtures in `../shared/testdata` beside the repository: captured
//! client requests and real profiles, written elsewhere and never copied
//! into the repository. A user's clone does not have them, so every test
//! that reads them has a twin that makes its own input; here they are extra
//! coverage, and their absence is a visible skip, never a CI failure.

use std::io::Write;
use std::path::{Path, PathBuf};

/// `<repo>/../shared/testdata`, whether or not it exists.
pub fn shared_testdata_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata")
}

/// `<repo>/../shared/testdata/<sub>` (e.g. `profiles`, `clients`), or `None`
/// after saying on stderr, past libtest's capture, that it is absent.
pub fn shared_testdata(sub: &str) -> Option<PathBuf> {
    let dir = shared_testdata_root().join(sub);
    if dir.is_dir() {
        Some(dir)
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {} is not present (real fixtures are extra coverage, never copied into the repository)",
            dir.display()
        );
        None
    }
}

/// The profiles under `shared_testdata("profiles")` that every decoder must
/// take (pprof's, Parca's and Pyroscope's own test profiles, truncated and
/// odd ones included), relative to that folder.
pub const VALID_PROFILES: &[&str] = &[
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
