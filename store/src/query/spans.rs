//! Span and trace selectors: the samples of given tracing spans or traces.
//! SDKs instrumented with OpenTelemetry (Go's `grafana/otel-profiling-go`,
//! Java's OTel profiling extension) put each sample's span and trace ids in
//! its `span_id` and `trace_id` pprof labels, and OTLP profiles carry them
//! in links; the store keeps both per sample. A span profile is the part of
//! its series' merge whose samples carry one of the asked ids.

use kiln_contract::sample_labels::{SPAN_ID, TRACE_ID, span_id, trace_id};
use kiln_engine::MergedProfile;
use kiln_storage::Store;

use crate::error::ApiError;

/// Most ids one selector may name (Grafana and Tempo ask for one).
pub const MAX_SELECTED_IDS: usize = 1024;

/// Which ids a selector holds: the sample label they are matched against,
/// how one is read, and what one looks like, for errors.
#[derive(Debug, Clone, Copy)]
struct IdKind {
    label: &'static str,
    parse: fn(&str) -> Option<u128>,
    looks_like: &'static str,
}

const SPAN_IDS: IdKind = IdKind {
    label: SPAN_ID,
    parse: |text| span_id(text).map(u128::from),
    looks_like: "a span id (16 hex digits)",
};

const TRACE_IDS: IdKind = IdKind {
    label: TRACE_ID,
    parse: trace_id,
    looks_like: "a trace id (32 hex digits)",
};

/// A set of span or trace ids, as numbers, sorted.
#[derive(Debug, Clone)]
pub struct SpanSelector {
    kind: IdKind,
    ids: Vec<u128>,
}

impl SpanSelector {
    /// The span ids in `texts` (16 hex digits each), `None` when there are
    /// none; `parameter` names the request field in errors.
    pub fn span_ids<'a>(
        texts: impl IntoIterator<Item = &'a str>,
        parameter: &'static str,
    ) -> Result<Option<Self>, ApiError> {
        Self::parse(SPAN_IDS, texts, parameter)
    }

    /// The trace ids in `texts` (32 hex digits each), `None` when there are
    /// none.
    pub fn trace_ids<'a>(
        texts: impl IntoIterator<Item = &'a str>,
        parameter: &'static str,
    ) -> Result<Option<Self>, ApiError> {
        Self::parse(TRACE_IDS, texts, parameter)
    }

    fn parse<'a>(
        kind: IdKind,
        texts: impl IntoIterator<Item = &'a str>,
        parameter: &'static str,
    ) -> Result<Option<Self>, ApiError> {
        let mut ids = Vec::new();
        for text in texts {
            if ids.len() == MAX_SELECTED_IDS {
                return Err(ApiError::BadParameter {
                    parameter,
                    message: format!("at most {MAX_SELECTED_IDS} ids"),
                });
            }
            let text = text.trim();
            let id = (kind.parse)(text).ok_or_else(|| ApiError::BadParameter {
                parameter,
                message: format!(
                    "{:?} is not {}",
                    text.chars().take(40).collect::<String>(),
                    kind.looks_like
                ),
            })?;
            ids.push(id);
        }
        if ids.is_empty() {
            return Ok(None);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(Some(Self { kind, ids }))
    }

    /// Whether a sample's label value is one of the ids.
    pub fn matches(&self, label_value: &str) -> bool {
        (self.kind.parse)(label_value).is_some_and(|id| self.ids.binary_search(&id).is_ok())
    }
}

/// `merged` with only the samples that every one of `selectors` keeps
/// (none: `merged` as it is), filtered on a query thread.
pub async fn keep_selected(
    store: &Store,
    merged: MergedProfile,
    selectors: Vec<SpanSelector>,
) -> Result<MergedProfile, ApiError> {
    if selectors.is_empty() {
        return Ok(merged);
    }
    let mut merged = merged;
    Ok(store
        .run_query_work(move || {
            for selector in &selectors {
                merged.retain_sample_label(selector.kind.label, |value| selector.matches(value));
            }
            merged
        })
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_whatever_their_case_and_bad_ids_are_named() {
        let spans = SpanSelector::span_ids(["9A517183F26A089D", " 5a4fe264a9c987fe"], "span")
            .unwrap()
            .unwrap();
        assert!(spans.matches("9a517183f26a089d"));
        assert!(spans.matches("5A4FE264A9C987FE"));
        assert!(!spans.matches("0000000000000001"));
        assert!(!spans.matches("not-a-span"));
        let err = SpanSelector::span_ids(["9a517183f26a089d", "xyz"], "span").unwrap_err();
        assert!(
            err.to_string().contains("\"xyz\" is not a span id"),
            "{err}"
        );
        assert!(
            SpanSelector::span_ids([], "spanSelector")
                .unwrap()
                .is_none()
        );
        let many: Vec<String> = (0..=MAX_SELECTED_IDS)
            .map(|i| format!("{i:016x}"))
            .collect();
        let err = SpanSelector::span_ids(many.iter().map(String::as_str), "span").unwrap_err();
        assert!(err.to_string().contains("at most 1024"), "{err}");
    }

    #[test]
    fn trace_ids_are_thirty_two_digits_and_match_the_trace_label() {
        let traces = SpanSelector::trace_ids(["0AF7651916CD43DD8448EB211C80319C"], "trace")
            .unwrap()
            .unwrap();
        assert!(traces.matches("0af7651916cd43dd8448eb211c80319c"));
        assert!(!traces.matches("0af7651916cd43dd"));
        let err = SpanSelector::trace_ids(["9a517183f26a089d"], "trace").unwrap_err();
        assert!(
            err.to_string()
                .contains("is not a trace id (32 hex digits)"),
            "{err}"
        );
    }
}
