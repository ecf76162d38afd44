//! Finding the tools the UI tests run (node, Chromium, playwright-core),
//! with the house rule: outside CI a missing tool skips the test with a
//! message; in CI (`CI=true`) it fails, because `./kiln-dev test` installs
//! them.
// Shared by the UI and CLI test crates; each uses only a part.
#![allow(dead_code)]

use std::io::Write;
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
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what}; run ./kiln-dev test to install it"
    );
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

/// The cargo target directory the tests were built into (the test binary
/// lives in `<target>/<profile>/deps/`).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.ancestors()
        .nth(3)
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
}

/// A binary built by cargo next to this test's profile directory, e.g.
/// `kiln-store`; `env_override` names a variable that may point elsewhere.
pub fn built_binary(name: &str, env_override: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env_override) {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().expect("the test binary has a path");
    let profile_dir = exe.parent().and_then(Path::parent)?;
    let path = profile_dir.join(name);
    if path.is_file() {
        Some(path)
    } else {
        missing(&format!(
            "{} is not built; run `cargo build -p {name}` first (./kiln-dev test does)",
            path.display()
        ))
    }
}

/// `<repo>/../shared/testdata/profiles`, if present (never required in CI).
pub fn profile_fixtures() -> Option<PathBuf> {
    let dir = crate_dir().join("../../../shared/testdata/profiles");
    if dir.is_dir() {
        Some(dir)
    } else {
        let _ = writeln!(std::io::stderr(), "SKIPPED: {} is absent", dir.display());
        None
    }
}
