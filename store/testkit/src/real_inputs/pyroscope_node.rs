//! Requests of the real Pyroscope Node.js SDK: `programs/pyroscope_node_app.js`
//! profiles itself with `@pyroscope/nodejs` (pinned where `./kiln-dev test`
//! installs it, under [`tools_dir`]) and uploads to a URL the caller gives,
//! typically a [`Recorder`](crate::recorder::Recorder) whose requests the
//! test replays.
//!
//! The SDK sends `/ingest?format=pprof` bodies of two types, `wall` (with
//! `sampleRate`) and heap, with dotted tag keys of its own
//! (`otel.scope.name=com.grafana.pyroscope/nodejs`) in `name=app{...}` and
//! its dynamic labels (`endpoint`) as pprof sample labels.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{program, run};
use crate::prerequisites::missing;
use crate::tools::{node, tools_dir};

/// The functions the app spends its time in: the first under
/// `endpoint=/a`, the second under `endpoint=/b`.
pub const FUNCTIONS: [&str; 2] = ["kilnNodeA", "kilnNodeB"];

/// The static tags the app sets, beside the SDK's own dotted ones.
pub const STATIC_TAGS: [(&str, &str); 2] = [("env", "ci"), ("region", "local")];

/// A dotted tag key the SDK itself adds, with a `/` in its value.
pub const SDK_TAG: (&str, &str) = ("otel.scope.name", "com.grafana.pyroscope/nodejs");

/// The `node_modules` folder that holds `@pyroscope/nodejs`.
fn sdk_modules() -> Option<PathBuf> {
    let modules = tools_dir().join("node_modules");
    if modules.join("@pyroscope/nodejs/package.json").is_file() {
        Some(modules)
    } else {
        missing(&format!(
            "@pyroscope/nodejs is not installed under {} (./kiln-dev test installs it)",
            modules.display()
        ))
    }
}

/// Runs the app for `seconds` as `app` in `dir`, uploading to `server_url`.
/// Returns `None` (after the house rule) without Node or the SDK.
pub fn run_pyroscope_node_app(dir: &Path, server_url: &str, app: &str, seconds: f64) -> Option<()> {
    let node = node()?;
    let modules = sdk_modules()?;
    run(
        Command::new(node)
            .arg(program("pyroscope_node_app.js"))
            .arg(server_url)
            .arg(app)
            .arg(seconds.to_string())
            .current_dir(dir)
            .env("NODE_PATH", modules),
        "pyroscope_node_app.js",
    );
    Some(())
}
