//! What a query reads: its selector, parsed off the async workers and
//! resolved against the stored profile types, and a merge encoded as
//! gzipped pprof. Shared by every query API (`/api/v1/`, gRPC and
//! Pyroscope's).

use kiln_engine::model::{MatchOp, Matcher, PROFILE_TYPE_LABEL, Selector, TimeRange};
use kiln_storage::Store;
use kiln_storage::store::{note_incomplete, record_incomplete};

use crate::error::ApiError;
use crate::query::selector::{ParsedSelector, SelectorError, parse_selector};

/// Parses the selector `text` of parameter `parameter` as query work:
/// checking its `=~` patterns compiles them, milliseconds for a heavy one,
/// which on the async workers would stall ingest served by the same
/// workers, and on unbounded blocking threads would take every core:
/// many requests with a costly pattern must not stall the store.
pub async fn parse_selector_off_workers(
    store: &Store,
    text: &str,
    parameter: &'static str,
) -> Result<ParsedSelector, ApiError> {
    let text = text.to_owned();
    store
        .run_query_work(move || parse_selector(&text))
        .await?
        .map_err(|source| ApiError::Selector { parameter, source })
}

/// Resolves a parsed selector of parameter `parameter` against the stored
/// types. A type none of them matches is refused only when they are every
/// type the store holds; when the listing missed some (a peer that did not
/// answer, an unreadable block), the type may be among those, so the query
/// runs on the type as written and answers what it finds, marked partial:
/// with the only writer's replica away, the others know no type of its
/// data, and a 400 would tell the user the type does not exist.
pub async fn resolve_parsed(
    store: &Store,
    parsed: &ParsedSelector,
    parameter: &'static str,
    range: TimeRange,
) -> Result<Selector, ApiError> {
    if parsed.profile_type_parts.len() >= 5 {
        return parsed
            .resolve(&[])
            .map_err(|source| ApiError::Selector { parameter, source });
    }
    let (known, missed) = record_incomplete(store.profile_types(range)).await;
    let complete = missed.is_complete();
    // What the listing missed, the answer misses too.
    note_incomplete(missed);
    match parsed.resolve(&known?) {
        Err(SelectorError::UnknownProfileType { .. }) if !complete => Ok(parsed.unresolved()),
        resolved => resolved.map_err(|source| ApiError::Selector { parameter, source }),
    }
}

/// Matchers of the selector `text` of parameter `parameter`, including its
/// profile type when it names one (matchers alone are allowed).
pub async fn selector_matchers(
    store: &Store,
    text: &str,
    parameter: &'static str,
    range: TimeRange,
) -> Result<Vec<Matcher>, ApiError> {
    let parsed = parse_selector_off_workers(store, text, parameter).await?;
    if parsed.profile_type_parts.is_empty() {
        return Ok(parsed.matchers);
    }
    let selector = resolve_parsed(store, &parsed, parameter, range).await?;
    let mut matchers = selector.matchers;
    matchers.push(Matcher {
        name: PROFILE_TYPE_LABEL.to_owned(),
        op: MatchOp::Equal,
        value: selector.profile_type.to_string(),
    });
    Ok(matchers)
}

/// Resolves the selector `text`, which must name a profile type; errors
/// name it parameter `selector`.
pub async fn resolve(store: &Store, text: &str, range: TimeRange) -> Result<Selector, ApiError> {
    let parsed = parse_selector_off_workers(store, text, "selector").await?;
    resolve_parsed(store, &parsed, "selector", range).await
}

/// Matchers of an optional selector `text` (matchers alone allowed);
/// errors name it parameter `selector`.
pub async fn matchers(
    store: &Store,
    text: &str,
    range: TimeRange,
) -> Result<Vec<Matcher>, ApiError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    selector_matchers(store, text, "selector", range).await
}

/// Encodes a merge as gzipped pprof on the blocking pool (compression must
/// not stall the async workers); shared by the HTTP and gRPC query APIs.
pub async fn merged_pprof_gzip(
    merged: kiln_engine::MergedProfile,
    profile_type: kiln_engine::model::ProfileType,
) -> Result<Vec<u8>, ApiError> {
    tokio::task::spawn_blocking(move || kiln_pprof::encode_gzip(&merged.to_pprof(&profile_type)))
        .await
        .map_err(|e| ApiError::Worker {
            work: "encoding the profile",
            message: e.to_string(),
        })
}
