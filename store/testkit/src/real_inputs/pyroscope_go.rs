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

use super::{build_go_module, run};

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
    let binary = build_go_module("pyroscope_go_app", dir)?;
    run(
        Command::new(&binary)
            .arg(server_url)
            .arg(app)
            .arg(seconds.to_string()),
        "pyroscope_go_app",
    );
    Some(())
}
