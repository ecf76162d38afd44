//! Status conditions that follow the Kubernetes API conventions.
//!
//! `lastTransitionTime` moves only when a condition's status flips, so an unchanged world gives a
//! byte-identical status and the status patch is skipped: no self-triggered reconcile loops.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::Schema;

/// Summary condition of a store: at least one replica serves queries and ingest.
pub const AVAILABLE: &str = "Available";
/// Every agent pod the DaemonSet wants is ready (or agents are disabled).
pub const AGENTS_READY: &str = "AgentsReady";
/// The last reconcile applied the whole spec without error.
pub const RECONCILED: &str = "Reconciled";
/// Every recording rule in the spec is rendered to the store (none was left out as invalid).
pub const RECORDING_RULES_VALID: &str = "RecordingRulesValid";
/// Summary condition of a target: it is published to its store's agents.
pub const READY: &str = "Ready";

/// One desired condition, before timestamps are merged in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredCondition {
    /// PascalCase type, e.g. [`AVAILABLE`].
    pub type_: &'static str,
    /// Whether the condition holds.
    pub status: bool,
    /// PascalCase machine-readable reason.
    pub reason: &'static str,
    /// Human-readable detail.
    pub message: String,
}

impl DesiredCondition {
    /// A condition that holds.
    pub fn holds(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: true,
            reason,
            message: message.into(),
        }
    }

    /// A condition that does not hold.
    pub fn fails(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: false,
            reason,
            message: message.into(),
        }
    }
}

/// Merges desired conditions into the previous list: keeps `lastTransitionTime` unless the status
/// flips, and uses `now` only for conditions that are new or flipped. Output is sorted by type.
pub fn merge_conditions(
    previous: &[Condition],
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut merged: Vec<Condition> = desired
        .iter()
        .map(|want| {
            let status = if want.status { "True" } else { "False" };
            let old = previous.iter().find(|c| c.type_ == want.type_);
            let last_transition_time = match old {
                Some(old) if old.status == status => old.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                type_: want.type_.to_owned(),
                status: status.to_owned(),
                reason: want.reason.to_owned(),
                message: want.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect();
    merged.sort_by(|a, b| a.type_.cmp(&b.type_));
    merged
}

/// Conditions whose status differs between two lists (new ones included): these get Events.
pub fn flipped<'a>(previous: &[Condition], current: &'a [Condition]) -> Vec<&'a Condition> {
    current
        .iter()
        .filter(|c| {
            previous
                .iter()
                .find(|p| p.type_ == c.type_)
                .is_none_or(|p| p.status != c.status)
        })
        .collect()
}

/// Schema of a conditions list: a map keyed by `type`, so server-side apply merges per condition.
pub fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<Condition>();
    schemars::json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).expect("valid test time"))
    }

    #[test]
    fn unchanged_status_keeps_transition_time() {
        let first = merge_conditions(
            &[],
            &[DesiredCondition::holds(AVAILABLE, "Ready", "ok")],
            Some(1),
            &time(10),
        );
        let second = merge_conditions(
            &first,
            &[DesiredCondition::holds(AVAILABLE, "Ready", "ok")],
            Some(1),
            &time(99),
        );
        assert_eq!(first, second);
        assert!(flipped(&first, &second).is_empty());
    }

    #[test]
    fn flipped_status_moves_transition_time_and_is_reported() {
        let first = merge_conditions(
            &[],
            &[DesiredCondition::holds(AVAILABLE, "Ready", "ok")],
            Some(1),
            &time(10),
        );
        let second = merge_conditions(
            &first,
            &[DesiredCondition::fails(AVAILABLE, "NoReplicas", "down")],
            Some(2),
            &time(99),
        );
        assert_eq!(second[0].last_transition_time, time(99));
        assert_eq!(second[0].observed_generation, Some(2));
        assert_eq!(flipped(&first, &second).len(), 1);
    }

    #[test]
    fn conditions_are_sorted_by_type() {
        let merged = merge_conditions(
            &[],
            &[
                DesiredCondition::holds(RECONCILED, "Applied", ""),
                DesiredCondition::holds(AGENTS_READY, "Ready", ""),
            ],
            None,
            &time(1),
        );
        let types: Vec<_> = merged.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, vec![AGENTS_READY, RECONCILED]);
    }
}
