//! Real inputs made at test time, so that a clone without `../shared` tests
//! what the `../shared` fixtures test: profiles a Go program writes with
//! `runtime/pprof` ([`go_profiles`]), `perf` recordings of a C program and
//! their folded stacks ([`perf_recordings`]), a Java Flight Recorder
//! file, a format that is not pprof ([`jfr_recordings`]), and the requests
//! of real Pyroscope SDKs: pyroscope-go ([`pyroscope_go`]) and the Node.js
//! SDK ([`pyroscope_node`]).
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

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::prerequisites::missing;

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
