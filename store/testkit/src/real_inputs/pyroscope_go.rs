//! Requests of a real Pyroscope SDK: `programs/pyroscope_go_app` profiles
//! itself with grafana/pyroscope-go (pinned by its `go.mod` and `go.sum`)
//! and uploads to a URL the caller gives, typically a
//! [`Recorder`](crate::recorder::Recorder) whose requests the test replays.
//!
//! The SDK sends one multipart `/ingest` request per profile type and
//! upload, with its static tags in the name (`name=app{env=ci,...}`) and
//! its dynamic tags (`endpoint`) as pprof sample labels.

use std::path::Path;
use std::process::Command;

use super::{program, run};
use crate::binaries::target_dir;
use crate::tools::go;

/// The functions the app spends its time in: the first under
/// `endpoint=/a`, the second under `endpoint=/b`.
pub const FUNCTIONS: [&str; 2] = ["main.kilnGoA", "main.kilnGoB"];

/// The tags the app sets on every upload: a `/` in a value travels inside
/// `name=`.
pub const STATIC_TAGS: [(&str, &str); 2] = [("env", "ci"), ("scope", "com.grafana.pyroscope/go")];

/// Builds the app into `dir` (the first build downloads the SDK through
/// the Go module proxy into a cache under the target directory) and runs
/// it for `seconds` as `app`, uploading to `server_url`. Returns `None`
/// (after the house rule) without Go, or when the module proxy cannot be
/// reached.
pub fn run_pyroscope_go_app(dir: &Path, server_url: &str, app: &str, seconds: f64) -> Option<()> {
    let go = go()?;
    let binary = dir.join("pyroscope_go_app");
    let cache = target_dir().join("tmp");
    let build = Command::new(&go)
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(".")
        // Module mode needs the program's own directory, with its go.mod.
        .current_dir(program("pyroscope_go_app"))
        .env("GOCACHE", cache.join("go-build-cache"))
        .env("GOMODCACHE", cache.join("go-mod-cache"))
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("HOME", dir)
        .output()
        .unwrap_or_else(|e| panic!("go build: cannot start: {e}"));
    if !build.status.success() {
        let stderr = String::from_utf8_lossy(&build.stderr);
        if stderr.contains("dial tcp") || stderr.contains("lookup ") {
            return crate::prerequisites::missing(&format!(
                "the Go module proxy is unreachable, so pyroscope-go was not fetched: {}",
                stderr.trim()
            ));
        }
        panic!("go build of pyroscope_go_app failed: {stderr}");
    }
    run(
        Command::new(&binary)
            .arg(server_url)
            .arg(app)
            .arg(seconds.to_string()),
        "pyroscope_go_app",
    );
    Some(())
}
