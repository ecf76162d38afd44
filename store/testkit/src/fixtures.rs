//! The real fixtures in `../shared/testdata` beside the repository: captured
//! client requests and real profiles, written elsewhere and never copied
//! into the repository. A user's clone does not have them, so every test
//! that reads them has a twin that makes its own input; here they are extra
//! coverage, and their absence is a visible skip, never a CI failure.

use std::io::Write;
use std::path::{Path, PathBuf};

/// `<repo>/../shared/testdata`, whether or not it exists.
pub fn shared_testdata_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata")
}

/// `<repo>/../shared/testdata/<sub>` (e.g. `profiles`, `clients`), or `None`
/// after saying on stderr, past libtest's capture, that it is absent.
pub fn shared_testdata(sub: &str) -> Option<PathBuf> {
    let dir = shared_testdata_root().join(sub);
    if dir.is_dir() {
        Some(dir)
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {} is not present (real fixtures are extra coverage, never copied into the repository)",
            dir.display()
        );
        None
    }
}
