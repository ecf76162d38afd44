//! The external tools some tests run, found under the house rule of
//! [`crate::prerequisites`]: absent, they skip the test visibly, or fail it
//! in CI.

use std::path::PathBuf;
use std::process::Command;

use crate::prerequisites::missing;

/// Where `./kiln-dev test` installs the tools that are not Debian packages
/// (`$KILN_TOOLS_DIR`, by default `/var/tmp/kiln-tools`).
pub fn tools_dir() -> PathBuf {
    std::env::var_os("KILN_TOOLS_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp/kiln-tools"), PathBuf::from)
}

/// True when `program --version`-style `args` run and succeed.
fn runs(program: &std::path::Path, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The `node` binary (`$KILN_NODE`, or `node` on the path), if it runs.
pub fn node() -> Option<PathBuf> {
    let node = PathBuf::from(std::env::var_os("KILN_NODE").unwrap_or_else(|| "node".into()));
    if runs(&node, &["--version"]) {
        Some(node)
    } else {
        missing("node (Node.js 18 or newer) is not installed")
    }
}

/// The Go toolchain's `go`, if it runs.
pub fn go() -> Option<PathBuf> {
    let go = PathBuf::from("go");
    if runs(&go, &["version"]) {
        Some(go)
    } else {
        missing("go (the Go toolchain, Debian golang-go) is not installed")
    }
}

/// The Python of the virtual environment `venv` under [`tools_dir`] (e.g.
/// `pyroscope-io-1`, with a real Pyroscope client installed), if present.
pub fn venv_python(venv: &str) -> Option<PathBuf> {
    let python = tools_dir().join(venv).join("bin/python");
    if python.is_file() {
        Some(python)
    } else {
        missing(&format!("{} (a Python venv)", python.display()))
    }
}
