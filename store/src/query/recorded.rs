//! Recorded series out: `/metrics/recorded` (Prometheus text, one counter
//! per recorded series, for a Prometheus to scrape) and a
//! Prometheus-compatible read API under `/prometheus/api/v1/` (`query`,
//! `query_range`, `labels`, `label/{name}/values`, `series`,
//! `status/buildinfo`), so Grafana's Prometheus data source charts them
//! directly (documented in `docs/recording-rules.md`).
//!
//! A point of the read API is what the rules recorded in the step ending
//! at its time, `[t - step, t)`: an increment, as `increase(counter[step])`
//! would give. An instant query sums the five minutes before its time,
//! Prometheus' lookback.

mod promql;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_engine::model::{Label, LabelSet, Matcher};
use kiln_engine::recording::{METRIC_NAME_LABEL, RecordedPoints, Steps};
use kiln_storage::Store;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::query::http::{QueryRejection, timed_as};
use crate::query::params::Params;
use crate::state::AppState;
use crate::wire::body::read_body;
use crate::wire::time::{now_ms, parse_time_ms};
pub use promql::{PromQuery, parse_promql};

/// Prometheus' lookback: what an instant query sums.
const LOOKBACK_MS: i64 = 5 * 60_000;
/// Most points per series one range query answers, Prometheus' own limit.
const MAX_STEPS: i64 = 11_000;
/// Most series one answer holds.
const MAX_SERIES: usize = 10_000;
/// Largest form body (a query is text; Grafana's are a few KiB).
const MAX_FORM_BYTES: usize = 256 << 10;
/// `text/plain; version=0.0.4`, the exposition format Prometheus scrapes.
const EXPOSITION_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics/recorded`: every recorded series' total since the store
/// started, as a counter. A rule with no series yet is still announced.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let store = match state.store() {
        Ok(store) => store,
        Err(err) => return err.into_response(),
    };
    let mut by_metric: BTreeMap<String, Vec<(LabelSet, i64)>> = store
        .recorded_metric_names()
        .into_iter()
        .map(|name| (name, Vec::new()))
        .collect();
    for (labels, total) in store.recorded_totals() {
        let metric = labels.get(METRIC_NAME_LABEL).unwrap_or("").to_owned();
        by_metric.entry(metric).or_default().push((labels, total));
    }
    let mut text = String::new();
    for (metric, series) in by_metric {
        let _ = writeln!(
            text,
            "# HELP {metric} Recorded by a Kiln recording rule: the sum since the store started."
        );
        let _ = writeln!(text, "# TYPE {metric} counter");
        for (labels, total) in series {
            let _ = writeln!(text, "{metric}{} {total}", exposition_labels(&labels));
        }
    }
    ([(header::CONTENT_TYPE, EXPOSITION_CONTENT_TYPE)], text).into_response()
}

/// `{a="1",b="2"}` without `__name__`, values escaped; empty for none.
fn exposition_labels(labels: &LabelSet) -> String {
    let pairs: Vec<String> = labels
        .iter()
        .filter(|l| l.name != METRIC_NAME_LABEL)
        .map(|l| {
            let value = l
                .value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{}=\"{value}\"", l.name)
        })
        .collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// An error in Prometheus' shape: `{"status":"error","errorType",...}`.
#[derive(Debug)]
pub struct PromError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl PromError {
    fn bad_data(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_data",
            message: message.into(),
        }
    }
}

impl From<ApiError> for PromError {
    fn from(err: ApiError) -> Self {
        let status = err.http_status();
        let kind = match status {
            s if s.is_client_error() && s != StatusCode::TOO_MANY_REQUESTS => "bad_data",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => "unavailable",
            StatusCode::GATEWAY_TIMEOUT => "timeout",
            _ => "execution",
        };
        Self {
            status,
            kind,
            message: err.to_string(),
        }
    }
}

impl From<kiln_storage::StorageError> for PromError {
    fn from(source: kiln_storage::StorageError) -> Self {
        ApiError::from(source).into()
    }
}

impl QueryRejection for PromError {
    fn reason(&self) -> &'static str {
        self.kind
    }
}

impl IntoResponse for PromError {
    fn into_response(self) -> Response {
        let body = json!({"status": "error", "errorType": self.kind, "error": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

fn success(data: Value) -> Response {
    axum::Json(json!({"status": "success", "data": data})).into_response()
}

/// The parameters of a GET's query string and, for a POST, its form body
/// (Grafana posts), the body's winning on a repeated name; `match[]`
/// gathered from both.
#[derive(Debug)]
pub struct PromParams {
    params: Params,
    matches: Vec<String>,
}

impl FromRequest<AppState> for PromParams {
    type Rejection = PromError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, PromError> {
        let (parts, body) = request.into_parts();
        let mut text = parts.uri.query().unwrap_or_default().to_owned();
        if parts.method == Method::POST {
            let form = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
            if !form {
                return Err(PromError::bad_data(
                    "a POST takes an application/x-www-form-urlencoded body",
                ));
            }
            let body = read_body(body, MAX_FORM_BYTES, state.body_read_timeout()).await?;
            let body = String::from_utf8(body)
                .map_err(|_| PromError::bad_data("the form body is not UTF-8"))?;
            if !text.is_empty() && !body.is_empty() {
                text.push('&');
            }
            text.push_str(&body);
        }
        let matches = form_urlencoded::parse(text.as_bytes())
            .filter(|(name, value)| name == "match[]" && !value.is_empty())
            .map(|(_, value)| value.into_owned())
            .collect();
        Ok(Self {
            params: Params::parse(Some(&text)),
            matches,
        })
    }
}

fn time_param(params: &Params, name: &'static str, default: i64) -> Result<i64, PromError> {
    match params.get(name) {
        None => Ok(default),
        Some(text) => parse_time_ms(text, now_ms())
            .map_err(|e| PromError::bad_data(format!("invalid parameter {name:?}: {e}"))),
    }
}

/// A step as Prometheus takes it: a duration (`15s`, `1m`) or seconds.
fn step_param(params: &Params) -> Result<i64, PromError> {
    let text = params
        .get("step")
        .ok_or_else(|| PromError::bad_data("missing parameter \"step\""))?;
    let ms = match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() => (seconds * 1000.0).round() as i64,
        _ => crate::config::parse_duration(text)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .map_err(|e| PromError::bad_data(format!("invalid parameter \"step\": {e}")))?,
    };
    if ms <= 0 {
        return Err(PromError::bad_data(
            "zero or negative query resolution step widths are not accepted",
        ));
    }
    Ok(ms)
}

/// Reads the recorded series of a parsed query over `steps`.
async fn evaluate(
    store: &Store,
    matchers: &[Matcher],
    sum_by: Option<&[String]>,
    steps: Steps,
) -> Result<Vec<(LabelSet, BTreeMap<i64, i64>)>, PromError> {
    let points = store.recorded_points(matchers, steps).await?;
    let series = match sum_by {
        None => points
            .series()
            .map(|(labels, points)| (labels.clone(), points.clone()))
            .collect::<Vec<_>>(),
        Some(by) => sum_series(&points, by),
    };
    if series.len() > MAX_SERIES {
        return Err(PromError::bad_data(format!(
            "the query selects {} series; at most {MAX_SERIES} are answered",
            series.len()
        )));
    }
    Ok(series)
}

/// Sums series by the `by` labels (`__name__` dropped, as `sum` does).
fn sum_series(points: &RecordedPoints, by: &[String]) -> Vec<(LabelSet, BTreeMap<i64, i64>)> {
    let mut sums: BTreeMap<LabelSet, BTreeMap<i64, i64>> = BTreeMap::new();
    for (labels, series) in points.series() {
        let kept = LabelSet::new(
            by.iter()
                .filter_map(|name| labels.get(name).map(|v| Label::new(name.as_str(), v)))
                .collect(),
        );
        let sum = sums.entry(kept).or_default();
        for (&t, &v) in series {
            let point = sum.entry(t).or_insert(0);
            *point = point.saturating_add(v);
        }
    }
    sums.into_iter().collect()
}

fn metric_json(labels: &LabelSet) -> Value {
    Value::Object(
        labels
            .iter()
            .map(|l| (l.name.clone(), Value::String(l.value.clone())))
            .collect(),
    )
}

fn sample_json(time_ms: i64, value: impl ToString) -> Value {
    json!([time_ms as f64 / 1000.0, value.to_string()])
}

fn parse_query(params: &Params) -> Result<PromQuery, PromError> {
    let text = params
        .get("query")
        .ok_or_else(|| PromError::bad_data("missing parameter \"query\""))?;
    parse_promql(text).map_err(|e| PromError::bad_data(format!("cannot answer {text:?}: {e}")))
}

/// `GET|POST /prometheus/api/v1/query_range`.
pub async fn query_range(State(state): State<AppState>, p: PromParams) -> Response {
    answer(&state, "recorded_query_range", async |store| {
        let start = time_param(&p.params, "start", now_ms())?;
        let end = time_param(&p.params, "end", now_ms())?;
        let step = step_param(&p.params)?;
        if end < start {
            return Err(PromError::bad_data("end timestamp must not be before start time"));
        }
        if (end - start) / step >= MAX_STEPS {
            return Err(PromError::bad_data(format!(
                "exceeded maximum resolution of {MAX_STEPS} points per timeseries; try a larger step"
            )));
        }
        let last = start + (end - start) / step * step;
        let steps = Steps::range(start, last, step);
        match parse_query(&p.params)? {
            PromQuery::Scalar(value) => {
                let values: Vec<Value> = (0..=(last - start) / step)
                    .map(|k| sample_json(start + k * step, value))
                    .collect();
                Ok(success(json!({"resultType": "matrix", "result": [{"metric": {}, "values": values}]})))
            }
            PromQuery::Vector { matchers, sum_by } => {
                let series = evaluate(store, &matchers, sum_by.as_deref(), steps).await?;
                let result: Vec<Value> = series
                    .iter()
                    .map(|(labels, points)| {
                        let values: Vec<Value> =
                            points.iter().map(|(&t, &v)| sample_json(t, v)).collect();
                        json!({"metric": metric_json(labels), "values": values})
                    })
                    .collect();
                Ok(success(json!({"resultType": "matrix", "result": result})))
            }
        }
    })
    .await
}

/// `GET|POST /prometheus/api/v1/query`: the five minutes before `time`.
pub async fn query(State(state): State<AppState>, p: PromParams) -> Response {
    answer(&state, "recorded_query", async |store| {
        let time = time_param(&p.params, "time", now_ms())?;
        match parse_query(&p.params)? {
            PromQuery::Scalar(value) => Ok(success(
                json!({"resultType": "scalar", "result": sample_json(time, value)}),
            )),
            PromQuery::Vector { matchers, sum_by } => {
                let steps = Steps::range(time, time, LOOKBACK_MS);
                let series = evaluate(store, &matchers, sum_by.as_deref(), steps).await?;
                let result: Vec<Value> = series
                    .iter()
                    .filter_map(|(labels, points)| {
                        let value = points.get(&time)?;
                        Some(json!({"metric": metric_json(labels), "value": sample_json(time, value)}))
                    })
                    .collect();
                Ok(success(json!({"resultType": "vector", "result": result})))
            }
        }
    })
    .await
}

/// The series of every `match[]` (or of every rule) over `start`..`end`
/// (default: the last hour).
async fn listed_series(store: &Store, p: &PromParams) -> Result<Vec<LabelSet>, PromError> {
    let end = time_param(&p.params, "end", now_ms())?;
    let start = time_param(&p.params, "start", end - 3_600_000)?;
    let selections: Vec<Vec<Matcher>> = if p.matches.is_empty() {
        vec![vec![Matcher {
            name: METRIC_NAME_LABEL.to_owned(),
            op: kiln_engine::model::MatchOp::Regex,
            value: ".+".to_owned(),
        }]]
    } else {
        p.matches
            .iter()
            .map(|text| match parse_promql(text) {
                Ok(PromQuery::Vector {
                    matchers,
                    sum_by: None,
                }) => Ok(matchers),
                Ok(_) => Err(PromError::bad_data(format!(
                    "match[] {text:?} is not a selector"
                ))),
                Err(e) => Err(PromError::bad_data(format!("match[] {text:?}: {e}"))),
            })
            .collect::<Result<_, _>>()?
    };
    let mut found = std::collections::BTreeSet::new();
    for matchers in selections {
        let steps = Steps::range(end, end, (end - start).max(1));
        for (labels, _) in evaluate(store, &matchers, None, steps).await? {
            found.insert(labels);
        }
    }
    Ok(found.into_iter().collect())
}

/// `GET|POST /prometheus/api/v1/series`.
pub async fn series(State(state): State<AppState>, p: PromParams) -> Response {
    answer(&state, "recorded_series", async |store| {
        let series = listed_series(store, &p).await?;
        Ok(success(Value::Array(
            series.iter().map(metric_json).collect(),
        )))
    })
    .await
}

/// `GET|POST /prometheus/api/v1/labels`.
pub async fn labels(State(state): State<AppState>, p: PromParams) -> Response {
    answer(&state, "recorded_labels", async |store| {
        let mut names: std::collections::BTreeSet<String> = listed_series(store, &p)
            .await?
            .iter()
            .flat_map(|labels| labels.iter().map(|l| l.name.clone()))
            .collect();
        names.insert(METRIC_NAME_LABEL.to_owned());
        Ok(success(json!(names)))
    })
    .await
}

/// `GET /prometheus/api/v1/label/{name}/values`.
pub async fn label_values(
    State(state): State<AppState>,
    Path(name): Path<String>,
    p: PromParams,
) -> Response {
    answer(&state, "recorded_label_values", async |store| {
        let mut values: std::collections::BTreeSet<String> = listed_series(store, &p)
            .await?
            .iter()
            .filter_map(|labels| labels.get(&name).map(str::to_owned))
            .collect();
        if name == METRIC_NAME_LABEL {
            values.extend(store.recorded_metric_names());
        }
        Ok(success(json!(values)))
    })
    .await
}

/// `GET /prometheus/api/v1/status/buildinfo`: what Grafana reads to tell
/// which features a Prometheus-compatible source has.
pub async fn buildinfo() -> Response {
    success(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "revision": "",
        "branch": "",
        "buildUser": "",
        "buildDate": "",
        "goVersion": "",
        "application": "kiln-store",
    }))
}

/// Runs `work` under a query slot, timed and counted like `/api/v1`,
/// answering errors in Prometheus' shape.
async fn answer(
    state: &AppState,
    endpoint: &'static str,
    work: impl AsyncFnOnce(&Store) -> Result<Response, PromError>,
) -> Response {
    timed_as(state, endpoint, work).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_labels_are_escaped_and_leave_out_the_name() {
        let labels = LabelSet::new(vec![
            Label::new(METRIC_NAME_LABEL, "m"),
            Label::new("pod", "a\"b\\c\nd"),
            Label::new("ns", "x"),
        ]);
        assert_eq!(
            exposition_labels(&labels),
            "{ns=\"x\",pod=\"a\\\"b\\\\c\\nd\"}"
        );
        let bare = LabelSet::new(vec![Label::new(METRIC_NAME_LABEL, "m")]);
        assert_eq!(exposition_labels(&bare), "");
    }

    #[test]
    fn sums_keep_only_their_labels() {
        let mut points = RecordedPoints::new();
        let series = |pod: &str, svc: &str| {
            LabelSet::new(vec![
                Label::new(METRIC_NAME_LABEL, "m"),
                Label::new("pod", pod),
                Label::new("service_name", svc),
            ])
        };
        points.add_exact(&series("a", "shop"), 10_000, 2);
        points.add_exact(&series("b", "shop"), 10_000, 3);
        points.add_exact(&series("c", "cart"), 20_000, 5);
        let by_service = sum_series(&points, &["service_name".to_owned()]);
        assert_eq!(by_service.len(), 2);
        assert_eq!(by_service[1].0.get("service_name"), Some("shop"));
        assert_eq!(by_service[1].1[&10_000], 5);
        assert_eq!(by_service[1].0.get(METRIC_NAME_LABEL), None);
        let all = sum_series(&points, &[]);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].1.values().sum::<i64>(), 10);
    }
}
