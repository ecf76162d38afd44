//! Grafana's own querier client: `programs/grafana_querier_client` calls
//! every `querier.v1` method of a store through
//! `github.com/grafana/pyroscope/api`'s `querierv1connect` (pinned by the
//! program's `go.mod` and `go.sum`), in Connect's binary and JSON codecs,
//! and prints what each call answered.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use crate::real_inputs::build_go_module;

/// What one codec's calls answered (the program's JSON, field for field).
#[derive(Debug, Clone, Deserialize)]
pub struct ClientAnswers {
    /// `proto` or `json`.
    pub codec: String,
    /// `ProfileTypes`: the type ids.
    pub profile_types: Option<Vec<String>>,
    /// `LabelNames`.
    pub label_names: Option<Vec<String>>,
    /// `LabelValues` of `service_name`.
    pub service_names: Option<Vec<String>>,
    /// `Series`: label sets matching the selector.
    pub series: usize,
    /// `SelectMergeStacktraces`: the flame graph's total and names.
    pub stacktraces_total: i64,
    /// Its names.
    pub stacktraces_names: Option<Vec<String>>,
    /// `SelectMergeSpanProfile` of the given span: total and names.
    pub span_total: i64,
    /// Its names.
    pub span_names: Option<Vec<String>>,
    /// `SelectMergeProfile`: the pprof's first values, summed.
    pub profile_total: i64,
    /// Its functions.
    pub profile_functions: usize,
    /// `SelectSeries`: every point's value, summed.
    pub series_total: f64,
    /// How many SelectSeries points carried an exemplar.
    pub exemplars: usize,
    /// Whether any exemplar weighed more than its point.
    pub exemplar_over_point: bool,
    /// The heaviest exemplar's profile id ("" with none).
    pub exemplar_id: String,
    /// Its value.
    pub exemplar_value: i64,
    /// How many labels it carried.
    pub exemplar_labels: usize,
    /// SelectMergeProfile's total for its id alone.
    pub exemplar_profile_total: i64,
    /// SelectMergeStacktraces' total for its id alone.
    pub exemplar_stacktraces_total: i64,
    /// `Diff` of the selection with itself: left and right ticks.
    pub diff_left_ticks: i64,
    /// Right ticks.
    pub diff_right_ticks: i64,
    /// `GetProfileStats`.
    pub data_ingested: bool,
    /// Its oldest profile time, unix ms.
    pub oldest_profile_time: i64,
    /// Its newest profile time, unix ms.
    pub newest_profile_time: i64,
    /// `SelectHeatmap`'s Connect code (`ok` or the error's).
    pub select_heatmap: String,
    /// `AnalyzeQuery`'s Connect code.
    pub analyze_query: String,
}

/// The selection every call asks for.
#[derive(Debug, Clone)]
pub struct Selection<'a> {
    /// A profile type id the store lists.
    pub profile_type: &'a str,
    /// `{...}`.
    pub label_selector: &'a str,
    /// Unix ms.
    pub start_ms: i64,
    /// Unix ms.
    pub end_ms: i64,
    /// The span `SelectMergeSpanProfile` asks for.
    pub span_id: &'a str,
}

/// Builds the client into `dir` and runs it against `store_url`; the
/// answers of the binary codec, then of the JSON codec. `None` (after the
/// house rule) without Go, or when the module proxy cannot be reached. A
/// call that fails fails the run, with the client's message.
pub fn run_grafana_querier_client(
    dir: &Path,
    store_url: &str,
    selection: &Selection<'_>,
) -> Option<Vec<ClientAnswers>> {
    let binary = build_go_module("grafana_querier_client", dir)?;
    let output = Command::new(&binary)
        .arg(store_url)
        .arg(selection.profile_type)
        .arg(selection.label_selector)
        .arg(selection.start_ms.to_string())
        .arg(selection.end_ms.to_string())
        .arg(selection.span_id)
        .output()
        .unwrap_or_else(|e| panic!("grafana_querier_client: cannot start: {e}"));
    assert!(
        output.status.success(),
        "Grafana's client failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Some(serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "grafana_querier_client printed no answers ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    }))
}
