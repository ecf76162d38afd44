//! Single profiles in the querier: SelectSeries' exemplars (each point's
//! heaviest profile, by id) and the `profile_id_selector` with which
//! Grafana opens one of them in SelectMergeStacktraces or
//! SelectMergeProfile. How an id names a profile is [`profile_ids`]'.
//!
//! [`profile_ids`]: crate::query::profile_ids

use std::collections::BTreeSet;

use kiln_api::types::v1 as t;
use kiln_engine::model::{PROFILE_TYPE_LABEL, Selector, TimeRange};
use kiln_engine::{MergedProfile, StepExemplars};
use kiln_storage::Store;

use crate::error::ApiError;
use crate::query::group_by::series_matchers;
use crate::query::profile_ids::{ProfileId, exact_selector, series_fingerprint};

/// Most ids one `profile_id_selector` may name: each is a lookup and a
/// merge of its own.
pub const MAX_PROFILE_IDS: usize = 256;

/// What SelectSeries' `exemplar_type` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExemplarRequest {
    /// No exemplars (`UNSPECIFIED` or `NONE`).
    None,
    /// Each point's heaviest profile (`INDIVIDUAL`).
    Individual,
}

impl ExemplarRequest {
    /// Reads the wire value; span exemplars are refused, never dropped.
    pub fn from_wire(exemplar_type: i32) -> Result<Self, ApiError> {
        match t::ExemplarType::try_from(exemplar_type) {
            Ok(t::ExemplarType::Unspecified | t::ExemplarType::None) => Ok(Self::None),
            Ok(t::ExemplarType::Individual) => Ok(Self::Individual),
            Ok(t::ExemplarType::Span) => Err(ApiError::Unimplemented {
                what: "exemplar_type EXEMPLAR_TYPE_SPAN (span exemplars); ask for EXEMPLAR_TYPE_INDIVIDUAL or EXEMPLAR_TYPE_NONE".to_owned(),
            }),
            Err(_) => Err(ApiError::BadParameter {
                parameter: "exemplar_type",
                message: format!("{exemplar_type} is not an exemplar type"),
            }),
        }
    }
}

/// A step's exemplar in the querier's form: the profile's id, time, total
/// and series labels (the internal profile type label left out).
pub fn wire_exemplar(exemplars: &StepExemplars, step: usize) -> Option<t::Exemplar> {
    let kept = exemplars.steps.get(step)?.as_ref()?;
    let id = ProfileId::of(kept.time_ms, &kept.labels)?;
    Some(t::Exemplar {
        timestamp: kept.time_ms,
        profile_id: id.to_uuid(),
        span_id: String::new(),
        value: kept.value,
        labels: kept
            .labels
            .iter()
            .filter(|l| l.name != PROFILE_TYPE_LABEL)
            .map(|l| t::LabelPair {
                name: l.name.clone(),
                value: l.value.clone(),
            })
            .collect(),
    })
}

/// The ids of a `profile_id_selector`, each checked, repeats dropped.
pub fn parse_profile_ids(ids: &[String]) -> Result<BTreeSet<(i64, u64)>, ApiError> {
    if ids.len() > MAX_PROFILE_IDS {
        return Err(ApiError::BadParameter {
            parameter: "profile_id_selector",
            message: format!("{} ids, over the limit of {MAX_PROFILE_IDS}", ids.len()),
        });
    }
    ids.iter()
        .map(|text| {
            ProfileId::parse(text)
                .map(|id| (id.time_ms, id.series))
                .map_err(|err| ApiError::BadParameter {
                    parameter: "profile_id_selector",
                    message: err.to_string(),
                })
        })
        .collect()
}

/// The merge of the profiles that `ids` name, each only where it lies in
/// `range` and in `selector`'s selection; an id whose profile is gone (or
/// never was) adds nothing, as in Pyroscope. No ids: the whole selection.
pub async fn merge_profiles(
    store: &Store,
    selector: &Selector,
    range: TimeRange,
    ids: &BTreeSet<(i64, u64)>,
) -> Result<MergedProfile, ApiError> {
    if ids.is_empty() {
        return Ok(store.merge(selector, range).await?);
    }
    let mut merged = MergedProfile::new();
    let matchers = series_matchers(selector);
    for &(time_ms, series) in ids {
        if !range.contains(time_ms) {
            continue;
        }
        let id = ProfileId { time_ms, series };
        let candidates = store.series(&matchers, id.range()).await?;
        for target in candidates
            .iter()
            .filter(|c| series_fingerprint(c) == series)
        {
            let exact = exact_selector(selector, target, &candidates);
            merged.merge(&store.merge(&exact, id.range()).await?);
        }
    }
    Ok(merged)
}
