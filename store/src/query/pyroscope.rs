//! Grafana Pyroscope's query API, so Grafana's Pyroscope datasource, the
//! Profiles Drilldown app, `profilecli` and the Perses Pyroscope plugin can
//! read Kiln: `querier.v1.QuerierService` over Connect ([`connect`], JSON
//! and binary) and the older `GET /pyroscope/render` and
//! `/pyroscope/label-values` ([`render`]).
//!
//! The methods here take and return the querier protobuf messages whatever
//! the encoding; [`json`] maps them to Connect JSON and [`flamebearer`]
//! lays flame graphs out in Pyroscope's row format. Times are unix ms, 0
//! meaning the defaults of Kiln's own API (the last hour up to now).

pub mod connect;
pub mod exemplars;
pub mod flamebearer;
pub mod json;
mod labels;
pub mod render;
mod series;

pub use labels::{LabelNameScheme, label_names, label_values, series};
pub use series::{select_series, step_ms};

use std::collections::BTreeSet;

use kiln_api::querier::v1 as q;
use kiln_api::types::v1 as t;
use kiln_engine::MergedProfile;
use kiln_engine::model::{Matcher, Selector, TimeRange};
use kiln_storage::Store;

use crate::error::ApiError;
use crate::query::group_by::{group_by_list, group_selector, series_groups, series_matchers};
use crate::query::pyroscope::exemplars::{
    ExemplarRequest, merge_profiles, parse_profile_ids, wire_exemplar,
};
use crate::query::selection::{matchers as selector_matchers, resolve};
use crate::query::spans::{SpanSelector, keep_selected};
use crate::symbolize::Symbolizer;
use crate::wire::time::{RangeError, inclusive_range_ms, now_ms};

/// What a method that answers stacks reads with: the store, and the
/// symbolizer that names its merge's frames once merged and narrowed, as
/// every query path of the store does.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    /// The store.
    pub store: &'a Store,
    /// The server's symbolizer.
    pub symbolizer: &'a Symbolizer,
}

/// Flame graph node budget when the request sets none (Pyroscope's default).
pub const DEFAULT_MAX_NODES: usize = 8192;
/// The largest node budget (Pyroscope's `max_flamegraph_nodes_max`).
pub const MAX_MAX_NODES: usize = 1 << 20;

/// Most matcher sets in one LabelNames, LabelValues or Series request:
/// each set is a query of its own over the range.
pub const MAX_MATCHER_SETS: usize = 32;
/// Most label names one Series request may keep (more than a series may
/// carry).
pub const MAX_SERIES_LABEL_NAMES: usize = 64;
/// Most entries a SelectSeries `groupBy` list may hold as sent, repeats
/// included; after repeats are dropped, `group_by::MAX_GROUP_LABELS`
/// applies, as on `/api/v1`.
pub const MAX_GROUP_BY_ENTRIES: usize = 64;
/// Most call sites a stack trace selector may list as sent (Kiln refuses
/// any selector with content, but reads it first).
pub const MAX_CALL_SITES: usize = 1024;

/// The query range for `start`/`end` in unix ms (0 = default); the end is
/// inclusive, as in Pyroscope. A time outside 1970 to 2262 is a 400.
pub fn range_ms(start: i64, end: i64) -> Result<TimeRange, ApiError> {
    inclusive_range_ms(start, end).map_err(|err| ApiError::BadParameter {
        parameter: match err {
            RangeError::OutOfRange { name: "start", .. } => "start",
            _ => "end",
        },
        message: err.to_string(),
    })
}

/// Pyroscope's `max_nodes`: unset or 0 means the default, negative or too
/// large means the maximum.
pub fn max_nodes(requested: Option<i64>) -> usize {
    match requested {
        None | Some(0) => DEFAULT_MAX_NODES,
        Some(n) if n < 0 => MAX_MAX_NODES,
        Some(n) => usize::try_from(n)
            .unwrap_or(MAX_MAX_NODES)
            .min(MAX_MAX_NODES),
    }
}

fn refuse_stack_trace_selector(selector: Option<&t::StackTraceSelector>) -> Result<(), ApiError> {
    match selector {
        Some(s) if !s.call_site.is_empty() || s.go_pgo.is_some() => Err(ApiError::Unimplemented {
            what: "stack_trace_selector (call-site and Go PGO filtering)".to_owned(),
        }),
        _ => Ok(()),
    }
}

/// The selector of `profile_typeID` + `label_selector`.
async fn selection(
    store: &Store,
    profile_type: &str,
    label_selector: &str,
    range: TimeRange,
) -> Result<Selector, ApiError> {
    if profile_type.trim().is_empty() {
        return Err(ApiError::BadParameter {
            parameter: "profile_typeID",
            message:
                "a profile type such as process_cpu:cpu:nanoseconds:cpu:nanoseconds is required"
                    .to_owned(),
        });
    }
    resolve(
        store,
        &format!("{}{}", profile_type.trim(), label_selector.trim()),
        range,
    )
    .await
}

/// The matcher sets of `matchers` (one empty set, i.e. all series, when
/// there are none); Pyroscope ORs them.
async fn matcher_sets(
    store: &Store,
    matchers: &[String],
    range: TimeRange,
) -> Result<Vec<Vec<Matcher>>, ApiError> {
    if matchers.is_empty() {
        return Ok(vec![Vec::new()]);
    }
    let mut sets = Vec::with_capacity(matchers.len());
    for text in matchers {
        sets.push(selector_matchers(store, text, range).await?);
    }
    Ok(sets)
}

/// `ProfileTypes`.
pub async fn profile_types(
    store: &Store,
    request: q::ProfileTypesRequest,
) -> Result<q::ProfileTypesResponse, ApiError> {
    let range = range_ms(request.start, request.end)?;
    let types = store.profile_types(range).await?;
    Ok(q::ProfileTypesResponse {
        profile_types: types
            .iter()
            .map(|p| t::ProfileType {
                id: p.to_string(),
                name: p.name.clone(),
                sample_type: p.sample_type.clone(),
                sample_unit: p.sample_unit.clone(),
                period_type: p.period_type.clone(),
                period_unit: p.period_unit.clone(),
            })
            .collect(),
    })
}

/// What a `SelectMerge*` request narrows its merge to, beside its
/// selector and range.
#[derive(Default)]
struct Narrowing<'a> {
    stack_trace_selector: Option<&'a t::StackTraceSelector>,
    /// Only these profiles (exemplar ids); empty: all.
    profile_ids: &'a [String],
    /// Only the samples of these spans and traces; empty: all.
    spans: Vec<SpanSelector>,
}

/// The merge a `SelectMerge*` request selects: its stack-trace selector
/// refused, its range, selection and profile ids checked, and only the
/// samples its span and trace selectors keep, symbolized; with the
/// selector resolved.
async fn merge_selected(
    Query { store, symbolizer }: Query<'_>,
    profile_type: &str,
    label_selector: &str,
    (start, end): (i64, i64),
    narrowing: Narrowing<'_>,
) -> Result<(Selector, MergedProfile), ApiError> {
    refuse_stack_trace_selector(narrowing.stack_trace_selector)?;
    let profile_ids = parse_profile_ids(narrowing.profile_ids)?;
    let range = range_ms(start, end)?;
    let selector = selection(store, profile_type, label_selector, range).await?;
    let merged = merge_profiles(store, &selector, range, &profile_ids).await?;
    let merged = keep_selected(store, merged, narrowing.spans).await?;
    let merged = symbolizer.symbolize(store, merged).await?;
    Ok((selector, merged))
}

/// The span and trace selectors of a request, each checked.
fn span_selectors(
    span_ids: &[String],
    trace_ids: &[String],
) -> Result<Vec<SpanSelector>, ApiError> {
    let spans = SpanSelector::span_ids(span_ids.iter().map(String::as_str), "span_selector")?;
    let traces =
        SpanSelector::trace_ids(trace_ids.iter().map(String::as_str), "trace_id_selector")?;
    Ok(spans.into_iter().chain(traces).collect())
}

/// `SelectMergeStacktraces`: the flame graph in flamebearer rows.
pub async fn select_merge_stacktraces(
    query: Query<'_>,
    request: q::SelectMergeStacktracesRequest,
) -> Result<q::SelectMergeStacktracesResponse, ApiError> {
    refuse_tree_format(request.format)?;
    let spans = span_selectors(&request.span_selector, &request.trace_id_selector)?;
    let (_, merged) = merge_selected(
        query,
        &request.profile_type_id,
        &request.label_selector,
        (request.start, request.end),
        Narrowing {
            stack_trace_selector: request.stack_trace_selector.as_ref(),
            profile_ids: &request.profile_id_selector,
            spans,
        },
    )
    .await?;
    Ok(q::SelectMergeStacktracesResponse {
        flamegraph: Some(flame_graph(query.store, merged, request.max_nodes).await?),
        tree: Vec::new(),
    })
}

/// `SelectMergeSpanProfile`: the flame graph of the samples that ran in
/// the spans of `span_selector` (their `span_id` sample label), out of the
/// series the selector picks.
pub async fn select_merge_span_profile(
    query: Query<'_>,
    request: q::SelectMergeSpanProfileRequest,
) -> Result<q::SelectMergeSpanProfileResponse, ApiError> {
    refuse_tree_format(request.format)?;
    let spans = span_selectors(&request.span_selector, &[])?;
    if spans.is_empty() {
        // A span profile of no span would be empty whatever was stored.
        return Err(ApiError::BadParameter {
            parameter: "span_selector",
            message: "name at least one span id".to_owned(),
        });
    }
    let (_, merged) = merge_selected(
        query,
        &request.profile_type_id,
        &request.label_selector,
        (request.start, request.end),
        Narrowing {
            spans,
            ..Narrowing::default()
        },
    )
    .await?;
    Ok(q::SelectMergeSpanProfileResponse {
        flamegraph: Some(flame_graph(query.store, merged, request.max_nodes).await?),
        tree: Vec::new(),
    })
}

/// Pyroscope's binary tree format is not written; the flame graph is.
fn refuse_tree_format(format: i32) -> Result<(), ApiError> {
    if format == q::ProfileFormat::Tree as i32 {
        return Err(ApiError::Unimplemented {
            what: "format PROFILE_FORMAT_TREE (Pyroscope's binary tree); ask for PROFILE_FORMAT_FLAMEGRAPH".to_owned(),
        });
    }
    Ok(())
}

/// `merged` as a querier flame graph of at most `max_nodes` nodes.
async fn flame_graph(
    store: &Store,
    merged: MergedProfile,
    max_nodes_requested: Option<i64>,
) -> Result<q::FlameGraph, ApiError> {
    let levels =
        flamebearer::single_levels_off_workers(store, merged, max_nodes(max_nodes_requested))
            .await?;
    Ok(q::FlameGraph {
        names: levels.names,
        levels: wire_levels(levels.levels),
        total: levels.total,
        max_self: levels.max_self,
    })
}

/// Flamebearer rows as querier `Level` messages.
fn wire_levels(rows: Vec<Vec<i64>>) -> Vec<q::Level> {
    rows.into_iter().map(|values| q::Level { values }).collect()
}

/// `SelectMergeProfile`: the merge as one pprof. With `max_nodes` set (not
/// 0), at most that many functions, the heaviest, and one `(other)` for
/// the frames cut (see [`kiln_engine::MergedProfile::to_pprof_trimmed`]);
/// unset, the whole merge, as a pprof download wants it.
pub async fn select_merge_profile(
    query: Query<'_>,
    request: q::SelectMergeProfileRequest,
) -> Result<kiln_pprof::proto::Profile, ApiError> {
    let spans = span_selectors(&[], &request.trace_id_selector)?;
    let (selector, merged) = merge_selected(
        query,
        &request.profile_type_id,
        &request.label_selector,
        (request.start, request.end),
        Narrowing {
            stack_trace_selector: request.stack_trace_selector.as_ref(),
            profile_ids: &request.profile_id_selector,
            spans,
        },
    )
    .await?;
    let profile_type = selector.profile_type.clone();
    let trim_to = request
        .max_nodes
        .filter(|&n| n != 0)
        .map(|n| max_nodes(Some(n)));
    tokio::task::spawn_blocking(move || match trim_to {
        Some(functions) => merged.to_pprof_trimmed(&profile_type, functions),
        None => merged.to_pprof(&profile_type),
    })
    .await
    .map_err(|e| ApiError::Worker {
        work: "building the profile",
        message: e.to_string(),
    })
}

/// `Diff`: left is the base, right the comparison; both must be one type.
pub async fn diff(
    Query { store, symbolizer }: Query<'_>,
    request: q::DiffRequest,
) -> Result<q::DiffResponse, ApiError> {
    let (Some(left), Some(right)) = (request.left, request.right) else {
        return Err(ApiError::BadParameter {
            parameter: "left",
            message: "both `left` and `right` are required".to_owned(),
        });
    };
    for side in [&left, &right] {
        refuse_stack_trace_selector(side.stack_trace_selector.as_ref())?;
    }
    let left_ids = parse_profile_ids(&left.profile_id_selector)?;
    let right_ids = parse_profile_ids(&right.profile_id_selector)?;
    let left_spans = span_selectors(&left.span_selector, &left.trace_id_selector)?;
    let right_spans = span_selectors(&right.span_selector, &right.trace_id_selector)?;
    let left_range = range_ms(left.start, left.end)?;
    let right_range = range_ms(right.start, right.end)?;
    let base_selector = selection(
        store,
        &left.profile_type_id,
        &left.label_selector,
        left_range,
    )
    .await?;
    let compare_selector = selection(
        store,
        &right.profile_type_id,
        &right.label_selector,
        right_range,
    )
    .await?;
    if base_selector.profile_type != compare_selector.profile_type {
        return Err(ApiError::BadParameter {
            parameter: "right",
            message: format!(
                "profile type {} differs from the left side's {}",
                compare_selector.profile_type, base_selector.profile_type
            ),
        });
    }
    let base = merge_profiles(store, &base_selector, left_range, &left_ids).await?;
    let base = keep_selected(store, base, left_spans).await?;
    let base = symbolizer.symbolize(store, base).await?;
    let compare = merge_profiles(store, &compare_selector, right_range, &right_ids).await?;
    let compare = keep_selected(store, compare, right_spans).await?;
    let compare = symbolizer.symbolize(store, compare).await?;
    let budget = max_nodes(left.max_nodes.or(right.max_nodes));
    let levels = flamebearer::diff_levels_off_workers(store, base, compare, budget).await?;
    Ok(q::DiffResponse {
        flamegraph: Some(q::FlameGraphDiff {
            names: levels.names,
            levels: wire_levels(levels.levels),
            total: levels.total,
            max_self: levels.max_self,
            left_ticks: levels.left_ticks,
            right_ticks: levels.right_ticks,
        }),
    })
}

/// `GetProfileStats`: whether anything is stored, and the times of the
/// first and last sample in the last 400 days, to the millisecond: found
/// by day, then minute, then millisecond, each step a timeline over the
/// one bucket the step before found, so no query walks more than a day.
pub async fn profile_stats(store: &Store) -> Result<t::GetProfileStatsResponse, ApiError> {
    const DAY_MS: i64 = 86_400_000;
    const MINUTE_MS: i64 = 60_000;
    let now = now_ms();
    let range = TimeRange {
        start_ms: now - 400 * DAY_MS,
        end_ms: now + 60_000,
    };
    let mut first: Option<i64> = None;
    let mut last: Option<i64> = None;
    for profile_type in store.profile_types(range).await? {
        let selector = Selector {
            profile_type,
            matchers: Vec::new(),
        };
        let Some((first_day, last_day)) = data_buckets(store, &selector, range, DAY_MS).await?
        else {
            continue;
        };
        let earliest = refine(store, &selector, first_day, DAY_MS, MINUTE_MS, Edge::First).await?;
        let latest = refine(store, &selector, last_day, DAY_MS, MINUTE_MS, Edge::Last).await?;
        first = Some(first.map_or(earliest, |f| f.min(earliest)));
        last = Some(last.map_or(latest, |l| l.max(latest)));
    }
    Ok(t::GetProfileStatsResponse {
        data_ingested: first.is_some(),
        oldest_profile_time: first.unwrap_or(0),
        newest_profile_time: last.unwrap_or(0),
    })
}

/// Which end of the data [`refine`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edge {
    First,
    Last,
}

/// The start of the first and of the last `step_ms` bucket of `range` that
/// holds data for `selector`.
async fn data_buckets(
    store: &Store,
    selector: &Selector,
    range: TimeRange,
    step_ms: i64,
) -> Result<Option<(i64, i64)>, ApiError> {
    let timeline = store.timeline(selector, range, step_ms).await?;
    let mut with_data = timeline
        .values
        .iter()
        .enumerate()
        .filter(|(_, value)| **value != 0)
        .map(|(i, _)| {
            timeline
                .start_ms
                .saturating_add((i as i64).saturating_mul(step_ms))
        });
    let Some(first) = with_data.next() else {
        return Ok(None);
    };
    Ok(Some((first, with_data.next_back().unwrap_or(first))))
}

/// The exact (millisecond) time of the first or last data in the `span_ms`
/// bucket at `start`, through buckets of `step_ms` then of 1 ms; `start`
/// when the data moved away meanwhile (retention, a flush racing).
async fn refine(
    store: &Store,
    selector: &Selector,
    start: i64,
    span_ms: i64,
    step_ms: i64,
    edge: Edge,
) -> Result<i64, ApiError> {
    let mut at = start;
    for (span, step) in [(span_ms, step_ms), (step_ms, 1)] {
        let range = TimeRange {
            start_ms: at,
            end_ms: at.saturating_add(span),
        };
        match data_buckets(store, selector, range, step).await? {
            Some((first, _)) if edge == Edge::First => at = first,
            Some((_, last)) => at = last,
            None => return Ok(at),
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests;
