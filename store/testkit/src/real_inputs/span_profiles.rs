//! Span profiles from the real SDKs: `programs/span_profiles_app` traces
//! two root spans with the OpenTelemetry Go SDK, wraps its tracer provider
//! in `grafana/otel-profiling-go`, which labels each span's CPU samples
//! with its `span_id` (and `span_name`, `trace_id`), and uploads them with
//! `grafana/pyroscope-go`, all pinned by the program's `go.mod` and
//! `go.sum`.

use std::path::Path;
use std::process::Command;

use super::{build_go_module, run};

/// The function the slow span spends its time in.
pub const SLOW_FUNCTION: &str = "main.kilnSpanSlow";
/// The function the other span spends its time in.
pub const OTHER_FUNCTION: &str = "main.kilnSpanOther";

/// The ids of the app's two spans, as OpenTelemetry writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanIds {
    /// The span that ran [`SLOW_FUNCTION`].
    pub slow: String,
    /// The span that ran [`OTHER_FUNCTION`].
    pub other: String,
}

/// Builds the app into `dir` and runs it for `seconds` as `app`, uploading
/// to `server_url` (half the time in each span). `None` (after the house
/// rule) without Go, or when the module proxy cannot be reached.
pub fn run_span_profiles_app(
    dir: &Path,
    server_url: &str,
    app: &str,
    seconds: f64,
) -> Option<SpanIds> {
    let binary = build_go_module("span_profiles_app", dir)?;
    let output = run(
        Command::new(&binary)
            .arg(server_url)
            .arg(app)
            .arg(seconds.to_string()),
        "span_profiles_app",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let id = |label: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(label)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("span_profiles_app printed no {label} span: {stdout}"))
            .to_owned()
    };
    Some(SpanIds {
        slow: id("slow"),
        other: id("other"),
    })
}
