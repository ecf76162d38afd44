//! Pyroscope's older HTTP query endpoints, as the Perses Pyroscope plugin
//! and older Grafana versions call them: `GET /pyroscope/render` (a
//! flamebearer profile plus a timeline) and `GET /pyroscope/label-values`.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::response::Response;
use kiln_engine::model::{ProfileType, TimeRange};
use kiln_storage::Store;
use serde_json::{Value, json};

use super::{flamebearer, max_nodes};
use crate::error::ApiError;
use crate::query::http::timed;
use crate::query::params::Params;
use crate::query::selection::{matchers, resolve};
use crate::state::AppState;
use crate::wire::time::{DEFAULT_RANGE_MS, now_ms};

/// `from` (default: an hour before the end) and `until` (default: now),
/// with Pyroscope's inclusive end.
fn pyroscope_range(params: &Params) -> Result<TimeRange, ApiError> {
    let now = now_ms();
    let end = params.time(&["until"], now)?.unwrap_or(now);
    let start = params
        .time(&["from"], now)?
        .unwrap_or(end.saturating_sub(DEFAULT_RANGE_MS).max(0));
    super::range_ms(start, end)
}

/// Flamebearer `units` and `sampleRate` for a profile type: time in
/// nanoseconds is shown as samples at 1e9 per second so that
/// `ticks / sampleRate` is seconds, as flamebearer viewers compute.
fn units(profile_type: &ProfileType) -> (&'static str, i64) {
    match profile_type.sample_unit.as_str() {
        "nanoseconds" => ("samples", 1_000_000_000),
        "bytes" => ("bytes", 0),
        _ if profile_type.sample_type.contains("object") => ("objects", 0),
        _ => ("samples", 100),
    }
}

/// `GET /pyroscope/render?query=<type>{matchers}&from=&until=&maxNodes=`.
pub async fn render(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    let symbolizer = state.symbolizer().clone();
    timed(&state, "pyroscope_render", async move |store: &Store| {
        if let Some(format) = params.get("format").filter(|f| *f != "json") {
            return Err(ApiError::Unimplemented {
                what: format!("render format {format:?}; only json is served"),
            });
        }
        let text = params.get("query").ok_or(ApiError::BadParameter {
            parameter: "query",
            message: "a query such as process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"app\"} is required".to_owned(),
        })?;
        let range = pyroscope_range(&params)?;
        let budget = match params.get("maxNodes").or_else(|| params.get("max-nodes")) {
            None => max_nodes(None),
            Some(text) => max_nodes(Some(text.parse::<i64>().map_err(|_| ApiError::BadParameter {
                parameter: "maxNodes",
                message: format!("{text:?} is not an integer"),
            })?)),
        };
        let selector = resolve(store, text, range).await?;
        let merged = store.merge(&selector, range).await?;
        let merged = symbolizer.symbolize(store, merged).await?;
        let levels = flamebearer::single_levels_off_workers(store, merged, budget).await?;
        let step_ms = ((range.end_ms - range.start_ms) / 100).max(10_000);
        let timeline = store.timeline(&selector, range, step_ms).await?;
        let (units, sample_rate) = units(&selector.profile_type);
        Ok(Json(render_body(&levels, &timeline, units, sample_rate, text)))
    })
    .await
}

/// The `/pyroscope/render` JSON body.
fn render_body(
    levels: &flamebearer::Levels,
    timeline: &kiln_engine::Timeline,
    units: &str,
    sample_rate: i64,
    query: &str,
) -> Value {
    json!({
        "version": 1,
        "flamebearer": {
            "names": levels.names,
            "levels": levels.levels,
            "numTicks": levels.total,
            "maxSelf": levels.max_self,
        },
        "metadata": {
            "format": "single",
            "spyName": "",
            "sampleRate": sample_rate,
            "units": units,
            "name": query,
        },
        "timeline": {
            "startTime": timeline.start_ms / 1000,
            "samples": timeline.values,
            "durationDelta": timeline.step_ms / 1000,
        },
        "groups": {},
        "heatmap": null,
    })
}

/// `GET /pyroscope/label-values?label=<name>[&query=][&from=&until=]`:
/// a JSON array of values.
pub async fn label_values(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    timed(
        &state,
        "pyroscope_label_values",
        async move |store: &Store| {
            let name = params.get("label").ok_or(ApiError::BadParameter {
                parameter: "label",
                message: "the label name is required".to_owned(),
            })?;
            let range = pyroscope_range(&params)?;
            let selected = match params.get("query") {
                Some(text) => matchers(store, text, range).await?,
                None => Vec::new(),
            };
            Ok(Json(store.label_values(name, &selected, range).await?))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_make_ticks_over_sample_rate_seconds_for_time() {
        let cpu = ProfileType::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
        assert_eq!(units(&cpu), ("samples", 1_000_000_000));
        let heap = ProfileType::parse("memory:inuse_space:bytes:space:bytes").unwrap();
        assert_eq!(units(&heap).0, "bytes");
    }
}
