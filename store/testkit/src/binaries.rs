//! The binaries cargo built, as a test outside their crate finds them (a
//! crate's own tests use `env!("CARGO_BIN_EXE_<name>")` instead).

use std::path::{Path, PathBuf};

use crate::prerequisites::missing;

/// The cargo target directory the running test was built into (its binary
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

/// A binary built by cargo into this test's profile directory, e.g.
/// `kiln-store`; `env_override` names a variable that may point elsewhere.
/// Absent, it is a missing prerequisite (`cargo build -p <name>` makes it).
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
