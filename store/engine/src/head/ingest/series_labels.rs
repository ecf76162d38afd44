//! Phase 3 of ingest: the series labels of every (signature, profile
//! type) slot that receives a value, checked ([`resolve`], which needs no
//! head), then the series they would create counted against the head's
//! limits ([`count_new_series`], which reads only a [`SeriesCensus`]).

use kiln_pprof::ProfileView;

use super::limits::{IngestLimits, SeriesBudget, check_label, label_bytes};
use super::signatures::Signatures;
use crate::error::IngestError;
use crate::head::SeriesCensus;
use crate::model::{Label, LabelSet, NAMESPACE_LABEL, PROFILE_TYPE_LABEL, ProfileType};

/// Each slot's series labels (`None` for a slot without values), built
/// from the request's `labels`, the slot's promoted labels and its profile
/// type.
pub(super) fn resolve(
    profile: &impl ProfileView,
    labels: &LabelSet,
    types: &[ProfileType],
    signatures: &Signatures,
    limits: &IngestLimits,
) -> Result<Vec<Option<LabelSet>>, IngestError> {
    let type_count = types.len();

    // Resolve every used slot's series labels and check limits. Sizes
    // are checked before each set is built, so a hostile profile fails
    // before it allocates; the same check runs before the WAL append, so
    // no record can out-allocate the store on replay and crash-loop it.
    let base_bytes: usize = labels.iter().map(|l| label_bytes(&l.name, &l.value)).sum();
    // The profile type is a label like any other: its strings (sample and
    // period types and units) come from the client, so the label they make
    // is held to the same length, or one upload could store names that
    // every later listing and query of its range has to carry.
    let type_labels: Vec<String> = types.iter().map(ProfileType::to_string).collect();
    for value in &type_labels {
        check_label(PROFILE_TYPE_LABEL, value, limits)?;
    }
    let type_label_bytes = type_labels
        .iter()
        .map(|value| label_bytes(PROFILE_TYPE_LABEL, value))
        .max()
        .unwrap_or(0);
    let mut planned_bytes = 0usize;
    let mut slot_labels: Vec<Option<LabelSet>> = vec![None; signatures.slot_used.len()];
    for (signature, key) in signatures.keys.iter().enumerate() {
        let base = signature * type_count;
        let used = signatures.slot_used[base..base + type_count]
            .iter()
            .filter(|&&u| u)
            .count();
        if used == 0 {
            continue;
        }
        let set_bytes = base_bytes
            + key
                .iter()
                .map(|&(k, v)| {
                    let (k, v) = (profile.string(k), profile.string(v));
                    match promotion(labels, k, v) {
                        Promotion::Redundant => 0,
                        Promotion::Exported => EXPORTED_PREFIX.len() + label_bytes(k, v),
                        Promotion::AsIs => label_bytes(k, v),
                    }
                })
                .sum::<usize>();
        planned_bytes = planned_bytes.saturating_add(
            set_bytes
                .saturating_add(type_label_bytes)
                .saturating_mul(used + 1),
        );
        if planned_bytes > limits.max_series_label_bytes_per_profile {
            return Err(IngestError::SeriesLabelsTooLarge {
                bytes: planned_bytes,
                limit: limits.max_series_label_bytes_per_profile,
            });
        }
        let mut set = labels.clone();
        for &(k, v) in key {
            let (k, v) = (profile.string(k), profile.string(v));
            let promoted_name = match promotion(labels, k, v) {
                Promotion::Redundant => continue,
                Promotion::Exported => format!("{EXPORTED_PREFIX}{k}"),
                Promotion::AsIs => k.to_owned(),
            };
            check_label(&promoted_name, v, limits)?;
            set.insert(Label::new(promoted_name, v));
        }
        if set.len() + 1 > limits.max_labels_per_series {
            return Err(IngestError::TooManyLabels {
                count: set.len() + 1,
                limit: limits.max_labels_per_series,
            });
        }
        for (t, type_label) in type_labels.iter().enumerate() {
            if !signatures.slot_used[base + t] {
                continue;
            }
            let mut full = set.clone();
            full.insert(Label::new(PROFILE_TYPE_LABEL, type_label.as_str()));
            slot_labels[base + t] = Some(full);
        }
    }
    Ok(slot_labels)
}

/// Counts the series `slot_labels` would create against the limits, as the
/// head described by `census` stands. Only a series the head does not hold
/// yet counts: a tenant over its limit keeps ingesting into the series it
/// has. Cheap (one lookup per slot), so a sharded head can run it under
/// its shards' read locks while the rest of the check ran under none.
pub(super) fn count_new_series(
    census: &impl SeriesCensus,
    name: &str,
    slot_labels: &[Option<LabelSet>],
    limits: &IngestLimits,
) -> Result<(), IngestError> {
    let mut new_series = SeriesBudget::new(census, name, limits);
    for full in slot_labels.iter().flatten() {
        if !census.holds_series(full) {
            new_series.add(census, full.get(NAMESPACE_LABEL).unwrap_or(""))?;
        }
    }
    Ok(())
}

/// What a promoted sample label colliding with a series label is renamed to.
const EXPORTED_PREFIX: &str = "exported_";

/// How a string sample label `k=v` joins the series labels `labels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Promotion {
    /// The series already has `k=v` (the agent repeats `node` on every
    /// sample): an `exported_k` copy would only be noise, so none is made.
    Redundant,
    /// `k` names a series label with another value (or the profile type
    /// label): kept, as `exported_k`, so neither value is lost.
    Exported,
    /// `k` is new to the series: promoted under its own name.
    AsIs,
}

fn promotion(labels: &LabelSet, k: &str, v: &str) -> Promotion {
    if k == PROFILE_TYPE_LABEL {
        return Promotion::Exported;
    }
    match labels.get(k) {
        Some(series_value) if series_value == v => Promotion::Redundant,
        Some(_) => Promotion::Exported,
        None => Promotion::AsIs,
    }
}
