//! Real CPU profiles of distinct processes, made at test time: builds
//! `tests/programs/workload` with the Go toolchain and runs each service
//! once, each writing its own `runtime/pprof` CPU profile. No ../shared.
// Shared by the UI and CLI test crates; each uses only a part.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The services `workload` can play; each has its own handler and shares
/// `main.hashItems` (called from its handler and from `main.auditLog`).
pub const SERVICES: [&str; 3] = ["checkout", "search", "ingest"];

/// Builds the workload into `dir` and runs every service in parallel;
/// returns `(service, CPU profile path)`, or `None` (said so) without Go.
pub fn cpu_profiles(dir: &Path) -> Option<Vec<(&'static str, PathBuf)>> {
    let go_runs = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !go_runs {
        return crate::prerequisites::missing("go (the Go toolchain) is not installed");
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ui/tests/programs/workload/main.go")
        .canonicalize()
        .expect("the workload program is checked in");
    let binary = dir.join("workload");
    // The build cache lives in the target directory so reruns are quick.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build-cache");
    let build = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .env("GOCACHE", &cache)
        .env("HOME", dir)
        .output()
        .expect("go build runs");
    assert!(
        build.status.success(),
        "go build of the workload failed: {}",
        String::from_utf8_lossy(&build.stderr)
    );
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
