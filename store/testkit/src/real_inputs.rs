//! Real inputs made at test time, so that a clone without `../shared` tests
//! what the `../shared` fixtures test: profiles a Go program writes with
//! `runtime/pprof` ([`go_profiles`]), `perf` recordings of a C program and
//! their folded stacks ([`perf_recordings`]), a Java Flight Recorder
//! file, a format that is not pprof ([`jfr_recordings`]), and the requests
//! of real Pyroscope SDKs: pyroscope-go ([`pyroscope_go`]), pyroscope-go
//! with OpenTelemetry span ids ([`span_profiles`]) and the Node.js SDK
//! ([`pyroscope_node`]).
//!
//! Every maker writes into a directory the caller gives (a tempdir), never
//! into the clone, and returns `None` after
//! [`missing`](crate::prerequisites::missing) when its tool is absent: a
//! visible skip outside CI, a failure under `CI=true`.
//!
//! The programs they run live in `store/testkit/programs/`.

pub mod go_profiles;
pub mod jfr_recordings;
pub mod perf_recordings;
pub mod pyroscope_go;
pub mod pyroscope_node;
pub mod span_profiles;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::binaries::target_dir;
use crate::prerequisites::missing;
use crate::tools::go;

/// A checked-in program of this crate, `store/testkit/programs/<name>`.
fn program(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("programs")
        .join(name)
}

/// `Some(())` when `tool --version`-like `probe` runs, otherwise the house
/// rule for a missing prerequisite.
fn tool(tool: &str, probe: &[&str], package: &str) -> Option<()> {
    let runs = Command::new(tool)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if runs {
        Some(())
    } else {
        missing(&format!("{tool} ({package}) is not installed"))
    }
}

/// Runs `command` and returns its output, panicking with its stderr when it
/// cannot start or fails: a tool that is present but broken is a failure,
/// not a skip.
#[track_caller]
fn run(command: &mut Command, what: &str) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Builds the Go module `programs/<name>` (pinned by its `go.mod` and
/// `go.sum`) into `dir/<name>`; the first build downloads its modules
/// through the Go module proxy into a cache under the target directory.
/// `None` (after the house rule) without Go, or when the proxy cannot be
/// reached.
pub(crate) fn build_go_module(name: &str, dir: &Path) -> Option<PathBuf> {
    let binary = dir.join(name);
    build_go_package(name, ".", &[], &binary)?;
    Some(binary)
}

/// Builds `package` (`.`, or an import path the module `programs/<module>`
/// requires, as a `tool` directive does) with build `tags` into `binary`,
/// with the same caches and the same house rule as [`build_go_module`].
pub(crate) fn build_go_package(
    module: &str,
    package: &str,
    tags: &[&str],
    binary: &Path,
) -> Option<()> {
    let go = go()?;
    let cache = target_dir().join("tmp");
    // Go wants a writable HOME even with every cache set; the binary's
    // directory is one the caller owns.
    let home = binary.parent().unwrap_or(Path::new("."));
    let build = Command::new(&go)
        .arg("build")
        .arg(format!("-tags={}", tags.join(",")))
        .arg("-o")
        .arg(binary)
        .arg(package)
        // Module mode needs the program's own directory, with its go.mod.
        .current_dir(program(module))
        .env("GOCACHE", cache.join("go-build-cache"))
        .env("GOMODCACHE", cache.join("go-mod-cache"))
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("GOTOOLCHAIN", "local")
        .env("HOME", home)
        .output()
        .unwrap_or_else(|e| panic!("go build: cannot start: {e}"));
    if !build.status.success() {
        let stderr = String::from_utf8_lossy(&build.stderr);
        if stderr.contains("dial tcp") || stderr.contains("lookup ") {
            return missing(&format!(
                "the Go module proxy is unreachable, so {module}'s modules were not fetched: {}",
                stderr.trim()
            ));
        }
        panic!("go build of {package} in {module} failed: {stderr}");
    }
    Some(())
}
