//! Prometheus' own Go API client: `programs/prometheus_api_client` calls a
//! store's `/prometheus/api/v1/*` through
//! `github.com/prometheus/client_golang/api/prometheus/v1` (the version
//! Prometheus v0.316.0 requires, pinned by the program's `go.mod` and
//! `go.sum`) and prints what each call answered, or the call that failed
//! with the client's error type.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::real_inputs::build_go_module;

/// One series of a range or instant answer, its points summed.
#[derive(Debug, Clone, Deserialize)]
pub struct SummedSeries {
    /// Its labels.
    pub metric: BTreeMap<String, String>,
    /// Every point's value, summed.
    pub sum: f64,
    /// How many points.
    pub points: usize,
}

/// What every call answered (the program's JSON, field for field).
#[derive(Debug, Clone, Deserialize)]
pub struct PromAnswers {
    /// `Buildinfo`'s version.
    pub buildinfo_version: String,
    /// `LabelNames` over the range.
    pub label_names: Option<Vec<String>>,
    /// `LabelValues("__name__")` over the range.
    pub metric_names: Option<Vec<String>>,
    /// `Series` of the matches given, as label maps.
    pub series: Option<Vec<BTreeMap<String, String>>>,
    /// `QueryRange`'s matrix.
    pub range: Option<Vec<SummedSeries>>,
    /// Its points, all summed.
    pub range_total: f64,
    /// `Query` at the range's end: a vector (or one scalar).
    pub instant: Option<Vec<SummedSeries>>,
    /// Its values, summed.
    pub instant_total: f64,
    /// Every call's warnings.
    pub warnings: Vec<String>,
    /// `METHOD /path STATUS` of every request the client sent, in order.
    pub requests: Vec<String>,
}

/// The call that failed, and how the client saw it.
#[derive(Debug, Clone, Deserialize)]
pub struct PromFailure {
    /// `buildinfo`, `label_names`, `label_values`, `series`,
    /// `query_range` or `query`.
    pub failed_call: String,
    /// The client's `*v1.Error` `Type` (`bad_data`, `client_error`,
    /// `bad_response`, ...); empty for an error of another kind.
    pub error_type: String,
    /// The client's message.
    pub error: String,
    /// The requests sent, the failed one last.
    pub requests: Option<Vec<String>>,
}

/// What one run asks.
#[derive(Debug, Clone)]
pub struct PromRequest<'a> {
    /// Unix seconds.
    pub start_s: i64,
    /// Unix seconds; the instant query's time too.
    pub end_s: i64,
    /// A Go duration: `30s`.
    pub step: &'a str,
    /// PromQL for `QueryRange` and `Query`.
    pub query: &'a str,
    /// `Series`' `match[]`; no call when empty.
    pub series_matches: &'a [&'a str],
}

/// The client program, built once for many runs.
#[derive(Debug, Clone)]
pub struct PrometheusApiClient {
    binary: PathBuf,
}

impl PrometheusApiClient {
    /// Builds the program into `dir`. `None` (after the house rule)
    /// without Go, or when the module proxy cannot be reached.
    pub fn build(dir: &Path) -> Option<Self> {
        let binary = build_go_module("prometheus_api_client", dir)?;
        Some(Self { binary })
    }

    /// Runs every call against `base_url` (the API's root, `.../prometheus`)
    /// with `token` as a bearer token: the answers, or the call that failed.
    /// Panics when the program prints neither.
    pub fn run(
        &self,
        base_url: &str,
        token: &str,
        request: &PromRequest<'_>,
    ) -> Result<PromAnswers, PromFailure> {
        let output = Command::new(&self.binary)
            .arg(base_url)
            .arg(token)
            .arg(request.start_s.to_string())
            .arg(request.end_s.to_string())
            .arg(request.step)
            .arg(request.query)
            .args(request.series_matches)
            .output()
            .unwrap_or_else(|e| panic!("prometheus_api_client: cannot start: {e}"));
        let printed = || {
            format!(
                "stdout: {}\nstderr: {}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        };
        if output.status.success() {
            Ok(serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
                panic!(
                    "prometheus_api_client printed no answers ({e}): {}",
                    printed()
                )
            }))
        } else {
            Err(serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
                panic!(
                    "prometheus_api_client failed ({}) without saying which call ({e}): {}",
                    output.status,
                    printed()
                )
            }))
        }
    }
}
