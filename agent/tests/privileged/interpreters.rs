//! Where the agent's Python tests find CPython interpreters and headers.
//!
//! Debian's own `python3` (3.11) and `python3-dev` are installed system-wide.
//! `./kiln-dev test` unpacks two more minor versions from Debian's archive
//! under `$KILN_TOOLS_DIR/debian-python` (never installed): bullseye's 3.9,
//! which runs here, and the 3.9 and 3.13 development headers. Debian has
//! never shipped 3.10 or 3.12, so their headers are not to be had here.
//! It also unpacks Debian forky's 3.13, 3.14 and 3.15 with forky's libc
//! into a root filesystem of their own, `$KILN_TOOLS_DIR/debian-forky-python`,
//! which `python_forky.rs` runs them in.

use std::path::{Path, PathBuf};

pub fn tools_dir() -> PathBuf {
    std::env::var_os("KILN_TOOLS_DIR")
        .unwrap_or_else(|| "/var/tmp/kiln-tools".into())
        .into()
}

/// The root the Debian packages are unpacked into.
pub fn debian_root() -> PathBuf {
    tools_dir().join("debian-python")
}

/// The root filesystem of Debian forky's CPythons (and their libc).
pub fn forky_root() -> PathBuf {
    tools_dir().join("debian-forky-python")
}

/// The minor versions `./kiln-dev test` unpacks from forky, each at
/// `/usr/bin/python3.x` beneath [`forky_root`].
pub const FORKY_MINORS: [u8; 3] = [13, 14, 15];

/// The minor versions whose headers Debian ships (bullseye, bookworm,
/// trixie); `./kiln-dev test` provides each.
pub const HEADERS_FROM_DEBIAN: [u8; 3] = [9, 11, 13];

/// The interpreters every privileged Python test runs: Debian's `python3`
/// and the bullseye 3.9 that `./kiln-dev test` unpacks.
pub fn required_interpreters() -> [PathBuf; 2] {
    [
        PathBuf::from("/usr/bin/python3"),
        debian_root().join("usr/bin/python3.9"),
    ]
}

/// Compiler include flags for CPython 3.`minor`'s headers, internal ones
/// included: the system's first, then the unpacked packages'. Debian's
/// `pyconfig.h` includes a multiarch one relative to the include root.
pub fn header_flags(minor: u8) -> Option<Vec<String>> {
    let roots = [
        PathBuf::from("/usr/include"),
        debian_root().join("usr/include"),
    ];
    roots.iter().find_map(|root| {
        let dir = root.join(format!("python3.{minor}"));
        let complete = dir.join("Python.h").is_file() && dir.join("internal").is_dir();
        complete.then(|| flags(&dir, root))
    })
}

fn flags(dir: &Path, root: &Path) -> Vec<String> {
    [dir.to_path_buf(), dir.join("internal"), root.to_path_buf()]
        .iter()
        .map(|p| format!("-I{}", p.display()))
        .collect()
}
