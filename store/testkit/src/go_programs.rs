//! Real Go programs built and run at test time, so that tests get real
//! `runtime/pprof` profiles without any fixture from `../shared`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::binaries::target_dir;
use crate::tools::go;

/// The services the UI's `workload` program can play; each has its own
/// handler and shares `main.hashItems` (called from its handler and from
/// `main.auditLog`).
pub const SERVICES: [&str; 3] = ["checkout", "search", "ingest"];

/// Builds the Go program `source` (a `main.go`) into `dir/<name>` and
/// returns the binary, or `None` (a missing prerequisite) without Go. The
/// program is compiled together with the kit's `programs/cpu_deadline.go`
/// (its `deadline` burns CPU time, not wall time), so no program carries a
/// copy. The build cache lives in the target directory, so reruns are quick.
#[track_caller]
pub fn build(source: &Path, dir: &Path, name: &str) -> Option<PathBuf> {
    let go = go()?;
    let binary = dir.join(name);
    // `go build` takes named files from one directory only.
    let sources = dir.join(format!("{name}.src"));
    std::fs::create_dir_all(&sources).unwrap_or_else(|e| panic!("{}: {e}", sources.display()));
    let main = sources.join("main.go");
    std::fs::copy(source, &main).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    let shared = sources.join("cpu_deadline.go");
    let kit_deadline = Path::new(env!("CARGO_MANIFEST_DIR")).join("programs/cpu_deadline.go");
    std::fs::copy(&kit_deadline, &shared)
        .unwrap_or_else(|e| panic!("{}: {e}", kit_deadline.display()));
    let cache = target_dir().join("tmp").join("go-build-cache");
    let build = Command::new(go)
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(&main)
        .arg(&shared)
        .env("GOCACHE", &cache)
        .env("HOME", dir)
        .output()
        .expect("go build runs");
    assert!(
        build.status.success(),
        "go build of {} failed: {}",
        source.display(),
        String::from_utf8_lossy(&build.stderr)
    );
    Some(binary)
}

/// Builds `store/ui/tests/programs/workload` into `dir` and runs every
/// service in parallel, each writing its own `runtime/pprof` CPU profile;
/// returns `(service, CPU profile path)`, or `None` (said so) without Go.
#[track_caller]
pub fn workload_cpu_profiles(dir: &Path) -> Option<Vec<(&'static str, PathBuf)>> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ui/tests/programs/workload/main.go")
        .canonicalize()
        .expect("the workload program is checked in");
    let binary = build(&source, dir, "workload")?;
    let runs: Vec<_> = SERVICES
        .iter()
        .map(|&service| {
            let profile = dir.join(format!("{service}.pprof"));
            let child = Command::new(&binary)
                .arg(service)
                .arg(&profile)
                .spawn()
                .expect("the workload starts");
            (service, profile, child)
        })
        .collect();
    let mut profiles = Vec::new();
    for (service, profile, mut child) in runs {
        let status = child.wait().expect("the workload runs");
        assert!(status.success(), "workload {service} failed: {status}");
        profiles.push((service, profile));
    }
    Some(profiles)
}
