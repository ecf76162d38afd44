//! The query API under `/api/v1/` (documented in `docs/api.md`).

use std::time::Instant;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use kiln_contract::query_json::{
    DiffResponse, FlameGraphResponse, LabelNames, LabelValues, PROFILE_TYPE_HEADER,
    ProfileTypeEntry, ProfileTypes, SeriesList, Timeline, TimelineResponse, TopResponse,
};
use kiln_engine::model::{Matcher, Selector, TimeRange};
use kiln_storage::Store;

use crate::error::ApiError;
use crate::query::group_by::{merge_grouped, parse_group_by};
use crate::query::params::Params;
use crate::query::selection::{
    merged_pprof_gzip, parse_selector_off_workers, resolve_parsed, selector_matchers,
};
use crate::query::spans::{SpanSelector, keep_selected};
use crate::state::AppState;
use crate::symbolize::Symbolizer;

/// Default and largest `max_nodes` of flame graphs.
const DEFAULT_MAX_NODES: usize = 8192;
const MAX_MAX_NODES: usize = 1 << 20;

/// An error a query endpoint answers with: its own response, and the
/// reason the rejection metrics count it under. Kiln's API answers
/// [`ApiError`]s; the Prometheus-compatible one answers in Prometheus'
/// error shape.
pub(crate) trait QueryRejection: IntoResponse + From<ApiError> {
    /// The `reason` label of the rejection metrics.
    fn reason(&self) -> &'static str;
}

impl QueryRejection for ApiError {
    fn reason(&self) -> &'static str {
        ApiError::reason(self)
    }
}

/// Runs `work`, timing it and counting failures, and renders errors.
pub(crate) async fn timed<T: IntoResponse>(
    state: &AppState,
    endpoint: &'static str,
    work: impl AsyncFnOnce(&Store) -> Result<T, ApiError>,
) -> Response {
    timed_as(state, endpoint, work).await
}

/// [`timed`], for an endpoint that answers errors of its own shape.
pub(crate) async fn timed_as<T: IntoResponse, E: QueryRejection>(
    state: &AppState,
    endpoint: &'static str,
    work: impl AsyncFnOnce(&Store) -> Result<T, E>,
) -> Response {
    let started = Instant::now();
    let result = match state.admit_query() {
        Ok(_permit) => match state.store() {
            Ok(store) => work(store).await,
            Err(err) => Err(E::from(err)),
        },
        Err(err) => Err(E::from(err)),
    };
    state.metrics().record_query(endpoint, started.elapsed());
    match result {
        Ok(value) => value.into_response(),
        Err(err) => {
            state.metrics().record_rejection(endpoint, err.reason());
            err.into_response()
        }
    }
}

/// Builds an answer with `build` and encodes it as JSON, both on the
/// blocking pool under one of the store's query runners.
///
/// NB: a flame graph tree of up to a million nodes, its trimming and its
/// tens of megabytes of JSON take long enough that, on an async worker,
/// they would stall every request sharing it, health probes included.
async fn json_off_workers<T: serde::Serialize>(
    store: &Store,
    work: &'static str,
    build: impl FnOnce() -> T + Send + 'static,
) -> Result<Response, ApiError> {
    let body = store
        .run_query_work(move || serde_json::to_vec(&build()))
        .await?
        .map_err(|err| ApiError::Worker {
            work,
            message: err.to_string(),
        })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

/// Resolves the selector in parameter `name` against the stored types.
async fn selector(
    store: &Store,
    params: &Params,
    name: &'static str,
    range: TimeRange,
) -> Result<Selector, ApiError> {
    let text = params.get(name).ok_or(ApiError::BadParameter {
        parameter: name,
        message: "a selector such as process_cpu{service_name=\"app\"} is required".to_owned(),
    })?;
    let parsed = parse_selector_off_workers(store, text, name).await?;
    resolve_parsed(store, &parsed, name, range).await
}

/// Matchers of an optional `query` selector, including its profile type.
async fn optional_matchers(
    store: &Store,
    params: &Params,
    range: TimeRange,
) -> Result<Vec<Matcher>, ApiError> {
    match params.get("query") {
        Some(text) => selector_matchers(store, text, "query", range).await,
        None => Ok(Vec::new()),
    }
}

/// `GET /api/v1/profile-types`.
pub async fn profile_types(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    timed(&state, "profile_types", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let types = store.profile_types(range).await?;
        let profile_types = types
            .into_iter()
            .map(|t| ProfileTypeEntry {
                id: t.to_string(),
                name: t.name,
                sample_type: t.sample_type,
                sample_unit: t.sample_unit,
                period_type: t.period_type,
                period_unit: t.period_unit,
                delta: t.delta,
            })
            .collect();
        Ok(Json(ProfileTypes { profile_types }))
    })
    .await
}

/// Most entries a listing answers by default, and at most (`limit`).
const DEFAULT_LISTING_LIMIT: usize = 10_000;
const MAX_LISTING_LIMIT: usize = kiln_storage::store::MAX_LISTED;

/// The listing's `limit`: the store collects the first `limit` entries
/// (listings are sorted) and says whether any were left out, so a listing
/// is complete or marked partial, and a store with millions of series
/// cannot be made to hold or answer all of them.
fn listing_limit(params: &Params) -> Result<usize, ApiError> {
    params.number("limit", DEFAULT_LISTING_LIMIT, MAX_LISTING_LIMIT)
}

/// `GET /api/v1/labels`.
pub async fn label_names(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    timed(&state, "labels", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let matchers = optional_matchers(store, &params, range).await?;
        let limit = listing_limit(&params)?;
        let listing = store.label_names_within(&matchers, range, limit).await?;
        Ok(Json(LabelNames {
            names: listing.entries,
            truncated: listing.truncated,
        }))
    })
    .await
}

/// `GET /api/v1/labels/{name}/values`.
pub async fn label_values(
    State(state): State<AppState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let params = Params::parse(query.as_deref());
    timed(&state, "label_values", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let matchers = optional_matchers(store, &params, range).await?;
        let limit = listing_limit(&params)?;
        let listing = store
            .label_values_within(&name, &matchers, range, limit)
            .await?;
        Ok(Json(LabelValues {
            name,
            values: listing.entries,
            truncated: listing.truncated,
        }))
    })
    .await
}

/// `GET /api/v1/series`.
pub async fn series(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    timed(&state, "series", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let matchers = optional_matchers(store, &params, range).await?;
        let limit = listing_limit(&params)?;
        let listing = store.series_within(&matchers, range, limit).await?;
        let truncated = listing.truncated;
        let series = listing
            .entries
            .iter()
            .map(|set| {
                set.iter()
                    .map(|l| (l.name.clone(), l.value.clone()))
                    .collect()
            })
            .collect();
        Ok(Json(SeriesList { series, truncated }))
    })
    .await
}

/// Merges the `query` selector's stacks in `range`, grouped by the labels
/// in `group_by`, and with `span_id` or `trace_id` (ids separated by
/// commas) only the samples of those spans or traces; with the resolved
/// selector and the group-by labels.
async fn grouped_merge(
    store: &Store,
    symbolizer: &Symbolizer,
    params: &Params,
    range: TimeRange,
) -> Result<(Selector, Vec<String>, kiln_engine::MergedProfile), ApiError> {
    let group_by = parse_group_by(params.get("group_by"))?;
    let ids = |name| params.get(name).into_iter().flat_map(|ids| ids.split(','));
    let spans = SpanSelector::span_ids(ids("span_id"), "span_id")?;
    let traces = SpanSelector::trace_ids(ids("trace_id"), "trace_id")?;
    let selector = selector(store, params, "query", range).await?;
    let merged = merge_grouped(store, &selector, range, &group_by).await?;
    let merged = keep_selected(store, merged, spans.into_iter().chain(traces).collect()).await?;
    let merged = symbolizer.symbolize(store, merged).await?;
    Ok((selector, group_by, merged))
}

/// `GET /api/v1/flamegraph`.
pub async fn flamegraph(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    let symbolizer = state.symbolizer().clone();
    timed(&state, "flamegraph", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let max_nodes = params.number("max_nodes", DEFAULT_MAX_NODES, MAX_MAX_NODES)?;
        let (selector, group_by, merged) =
            grouped_merge(store, &symbolizer, &params, range).await?;
        json_off_workers(store, "rendering the flame graph", move || {
            let flamegraph = merged.flamegraph(max_nodes);
            let sources = merged.frame_sources(flamegraph.names.iter().map(String::as_str));
            FlameGraphResponse {
                profile_type: selector.profile_type.to_string(),
                unit: selector.profile_type.sample_unit,
                from_ms: range.start_ms,
                to_ms: range.end_ms - 1,
                total: merged.total(),
                group_by,
                flamegraph,
                sources,
            }
        })
        .await
    })
    .await
}

/// `GET /api/v1/pprof`: the merged profile, gzipped.
pub async fn pprof(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    let symbolizer = state.symbolizer().clone();
    timed(&state, "pprof", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let (selector, _, merged) = grouped_merge(store, &symbolizer, &params, range).await?;
        let bytes = merged_pprof_gzip(merged, selector.profile_type.clone()).await?;
        Ok((
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile.pb.gz\"",
                ),
            ],
            bytes,
        ))
    })
    .await
}

/// `GET /api/v1/folded`: the untrimmed merge as folded stacks
/// (`root;...;leaf value` per line), for lossless SVG and folded exports.
pub async fn folded(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    let symbolizer = state.symbolizer().clone();
    timed(&state, "folded", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let (selector, _, merged) = grouped_merge(store, &symbolizer, &params, range).await?;
        let text = store.run_query_work(move || merged.folded()).await?;
        Ok((
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
                (
                    HeaderName::from_static(PROFILE_TYPE_HEADER),
                    selector.profile_type.to_string(),
                ),
            ],
            text,
        ))
    })
    .await
}

/// `GET /api/v1/top`.
pub async fn top(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    let symbolizer = state.symbolizer().clone();
    timed(&state, "top", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let limit = params.number("limit", 100, 100_000)?;
        let (selector, group_by, merged) =
            grouped_merge(store, &symbolizer, &params, range).await?;
        json_off_workers(store, "ranking the top functions", move || TopResponse {
            profile_type: selector.profile_type.to_string(),
            unit: selector.profile_type.sample_unit,
            total: merged.total(),
            group_by,
            top: merged.top(limit),
        })
        .await
    })
    .await
}

/// `GET /api/v1/timeline`.
pub async fn timeline(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    timed(&state, "timeline", async move |store: &Store| {
        let range = params.range("from", ["to", "until"])?;
        let step_ms = match params.get("step") {
            None => ((range.end_ms - range.start_ms) / 100).max(10_000),
            Some(text) => {
                let step = kiln_contract::duration::parse_duration(text).map_err(|err| {
                    ApiError::BadParameter {
                        parameter: "step",
                        message: err.to_string(),
                    }
                })?;
                // A step longer than i64 milliseconds still means "one bucket".
                let step_ms = i64::try_from(step.as_millis()).unwrap_or(i64::MAX);
                if step_ms == 0 {
                    return Err(ApiError::BadParameter {
                        parameter: "step",
                        message: format!("{text:?}: a step must be at least 1ms"),
                    });
                }
                step_ms
            }
        };
        let selector = selector(store, &params, "query", range).await?;
        let average = match params.get("aggregation") {
            None => selector.profile_type.is_gauge(),
            Some("sum") => false,
            Some("average") => true,
            Some(other) => {
                return Err(ApiError::BadParameter {
                    parameter: "aggregation",
                    message: format!("{other:?}: expected sum or average"),
                });
            }
        };
        let timeline = store.timeline(&selector, range, step_ms).await?;
        let values = if average {
            // Rounded: every unit Kiln stores is whole (ns, bytes, counts).
            timeline
                .averages()
                .iter()
                .map(|m| m.round() as i64)
                .collect()
        } else {
            timeline.values
        };
        Ok(Json(TimelineResponse {
            profile_type: selector.profile_type.to_string(),
            unit: selector.profile_type.sample_unit,
            timeline: Timeline {
                start_ms: timeline.start_ms,
                step_ms: timeline.step_ms,
                values,
                profiles: timeline.profiles,
            },
            aggregation: if average { "average" } else { "sum" }.to_owned(),
        }))
    })
    .await
}

/// `GET /api/v1/diff`: `left_query`/`left_from`/`left_to` against
/// `right_query`/`right_from`/`right_to`; each right side defaults to the left.
pub async fn diff(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::parse(query.as_deref());
    let symbolizer = state.symbolizer().clone();
    timed(&state, "diff", async move |store: &Store| {
        let max_nodes = params.number("max_nodes", DEFAULT_MAX_NODES, MAX_MAX_NODES)?;
        let left_range = params.range("left_from", ["left_to", "left_until"])?;
        let right_range = if params.get("right_from").is_some() || params.get("right_to").is_some()
        {
            params.range("right_from", ["right_to", "right_until"])?
        } else {
            left_range
        };
        let left = selector(store, &params, "left_query", left_range).await?;
        let right = if params.get("right_query").is_some() {
            selector(store, &params, "right_query", right_range).await?
        } else {
            left.clone()
        };
        if left.profile_type != right.profile_type {
            return Err(ApiError::BadParameter {
                parameter: "right_query",
                message: format!(
                    "profile type {} differs from the left side's {}",
                    right.profile_type, left.profile_type
                ),
            });
        }
        let base = symbolizer
            .symbolize(store, store.merge(&left, left_range).await?)
            .await?;
        let compare = symbolizer
            .symbolize(store, store.merge(&right, right_range).await?)
            .await?;
        json_off_workers(store, "rendering the diff", move || DiffResponse {
            profile_type: left.profile_type.to_string(),
            unit: left.profile_type.sample_unit,
            left_total: base.total(),
            right_total: compare.total(),
            diff: kiln_engine::diff(&base, &compare, max_nodes),
        })
        .await
    })
    .await
}
