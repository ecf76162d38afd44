//! The house rule for tests that need a tool, a privilege or a file: outside
//! CI a missing prerequisite skips the test with a line a person sees; under
//! `CI=true` it fails, because `./kiln-dev test` installs everything.

use std::io::Write;

/// True when running in CI (`CI=true` or `CI=1`), where a missing
/// prerequisite is a failure, never a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true" || value == "1")
}

/// Prints `message` where a person running `cargo test` sees it: libtest
/// captures `eprintln!` of passing tests, but not direct writes to stderr.
pub fn visible_skip(message: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED: {message}");
}

/// Reports a missing prerequisite: panics in CI, prints a visible skip
/// otherwise. Returns `None` so that callers can `return` on it.
#[track_caller]
pub fn missing<T>(what: &str) -> Option<T> {
    if in_ci() {
        panic!("prerequisite missing in CI: {what} (./kiln-dev test installs it)");
    }
    visible_skip(&format!("{what} (./kiln-dev test installs it)"));
    None
}
