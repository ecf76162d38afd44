//! Finding the tools the UI tests run (node, Chromium, playwright-core),
//! with the house rule: outside CI a missing tool skips the test with a
//! message; in CI (`CI=true`) it fails, because `./kiln-dev test` installs
//! them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// True when running in CI, where missing prerequisites are failures.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Reports a missing prerequisite: panics in CI, prints a skip otherwise.
/// Returns `None` so callers can `return` on it.
pub fn missing<T>(what: &str) -> Option<T> {
    if in_ci() {
        panic!("{what} (CI=true: ./kiln-dev test installs it)");
    }
    eprintln!("SKIPPED: {what}; run ./kiln-dev test to install it");
    None
}

/// The `node` binary, if it runs.
pub fn node() -> Option<PathBuf> {
    let node = PathBuf::from(std::env::var_os("KILN_NODE").unwrap_or_else(|| "node".into()));
    match Command::new(&node).arg("--version").output() {
        Ok(out) if out.status.success() => Some(node),
        _ => missing("node (Node.js 18 or newer) is not installed"),
    }
}

/// The UI crate's directory.
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}
