//! A `ProfilingTarget`'s conditions: whether its spec is valid (`Reconciled`) and whether it
//! reaches agents (`Ready`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;

use super::ownership::reports_agents_elsewhere;
use super::store::AGENTS_OWNED_ELSEWHERE;
use crate::api::condition::{DesiredCondition, READY, RECONCILED, merge_conditions};
use crate::api::{ProfileStore, ProfilingTarget, ProfilingTargetStatus};
use crate::resources::targets::to_file_target;

/// What a target's conditions say, and whether its store was missing (looked for again sooner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConditions {
    /// `Ready` and `Reconciled`.
    pub desired: Vec<DesiredCondition>,
    /// The store the target names does not exist.
    pub store_missing: bool,
}

/// The conditions of `target`, given the store it names as read from the API server.
pub fn target_conditions(
    target: &ProfilingTarget,
    store: Option<&ProfileStore>,
) -> TargetConditions {
    let validity = to_file_target(target);
    let reconciled = match &validity {
        Ok(_) => DesiredCondition::holds(RECONCILED, "Valid", "the spec is valid"),
        Err(problem) => DesiredCondition::fails(RECONCILED, "InvalidSpec", problem.clone()),
    };
    let store_label = format!(
        "{}/{}",
        target.store_namespace().unwrap_or_default(),
        target.spec.store_ref.name
    );
    let ready = match (&validity, store) {
        (Err(_), _) => DesiredCondition::fails(
            READY,
            "InvalidSpec",
            "fix the spec; see the Reconciled condition",
        ),
        (Ok(_), _) if target.spec.suspend => {
            DesiredCondition::fails(READY, "Suspended", "spec.suspend is true")
        }
        (Ok(_), None) => DesiredCondition::fails(
            READY,
            "StoreNotFound",
            format!("ProfileStore {store_label} does not exist"),
        ),
        (Ok(_), Some(store)) if reports_agents_elsewhere(store) => DesiredCondition::fails(
            READY,
            AGENTS_OWNED_ELSEWHERE,
            format!(
                "ProfileStore {store_label} has no agents of its own; point the target at the store that runs them"
            ),
        ),
        (Ok(_), Some(store)) if !store.spec.agent.enabled => DesiredCondition::fails(
            READY,
            "AgentsDisabled",
            format!("ProfileStore {store_label} runs no agents"),
        ),
        (Ok(_), Some(_)) => DesiredCondition::holds(
            READY,
            "Published",
            format!("published to the agents of ProfileStore {store_label}"),
        ),
    };
    TargetConditions {
        store_missing: validity.is_ok() && !target.spec.suspend && store.is_none(),
        desired: vec![ready, reconciled],
    }
}

/// The status to write, or `None` when it equals the target's current one
/// (`lastTransitionTime` moves only on flips, so an unchanged world writes nothing).
pub fn next_target_status(
    target: &ProfilingTarget,
    desired: &[DesiredCondition],
    now: &Time,
) -> Option<ProfilingTargetStatus> {
    let previous = target.status.clone().unwrap_or_default();
    let status = ProfilingTargetStatus {
        observed_generation: target.meta().generation,
        conditions: merge_conditions(&previous.conditions, desired, target.meta().generation, now),
    };
    (status != previous).then_some(status)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::status::fixtures::profile_store;

    fn target(spec: Value) -> ProfilingTarget {
        serde_json::from_value(json!({
            "apiVersion": "kiln.dev/v1alpha1",
            "kind": "ProfilingTarget",
            "metadata": {"name": "checkout", "namespace": "shop", "generation": 2},
            "spec": spec,
        }))
        .expect("a valid target")
    }

    fn valid_spec() -> Value {
        json!({"storeRef": {"name": "main", "namespace": "kiln"},
               "selector": {"matchLabels": {"app": "checkout"}}})
    }

    fn store(spec: Value, status: Value) -> ProfileStore {
        profile_store("main", json!({}), spec, status)
    }

    fn ready_of(outcome: &TargetConditions) -> (bool, &'static str, String) {
        let ready = &outcome.desired[0];
        assert_eq!(ready.type_, READY);
        (ready.status, ready.reason, ready.message.clone())
    }

    #[test]
    fn a_valid_target_of_a_store_with_agents_is_published() {
        let running = store(json!({}), json!({}));
        let outcome = target_conditions(&target(valid_spec()), Some(&running));
        assert_eq!(
            ready_of(&outcome),
            (
                true,
                "Published",
                "published to the agents of ProfileStore kiln/main".to_owned()
            )
        );
        assert_eq!(outcome.desired[1].reason, "Valid");
        assert!(!outcome.store_missing);
    }

    #[test]
    fn ready_says_why_the_target_reaches_no_agent() {
        let running = store(json!({}), json!({}));
        let mut suspended = valid_spec();
        suspended["suspend"] = json!(true);
        assert_eq!(
            ready_of(&target_conditions(&target(suspended), Some(&running))).1,
            "Suspended"
        );

        let missing = target_conditions(&target(valid_spec()), None);
        assert_eq!(ready_of(&missing).1, "StoreNotFound");
        assert!(missing.store_missing);

        let no_agents = store(json!({"agent": {"enabled": false}}), json!({}));
        let outcome = target_conditions(&target(valid_spec()), Some(&no_agents));
        assert_eq!(
            ready_of(&outcome),
            (
                false,
                "AgentsDisabled",
                "ProfileStore kiln/main runs no agents".to_owned()
            )
        );

        let deferring = store(
            json!({}),
            json!({"conditions": [{"type": "AgentsReady", "status": "False",
                "reason": AGENTS_OWNED_ELSEWHERE, "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
        );
        let outcome = target_conditions(&target(valid_spec()), Some(&deferring));
        assert_eq!(ready_of(&outcome).1, AGENTS_OWNED_ELSEWHERE);
    }

    #[test]
    fn an_invalid_spec_fails_both_conditions_whatever_the_store() {
        let mut spec = valid_spec();
        spec["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "In"}]});
        let outcome = target_conditions(&target(spec), None);
        assert_eq!(ready_of(&outcome).1, "InvalidSpec");
        let reconciled = &outcome.desired[1];
        assert_eq!(
            (reconciled.status, reconciled.reason),
            (false, "InvalidSpec")
        );
        assert!(!reconciled.message.is_empty());
        // Nothing to look for sooner: the spec must change first.
        assert!(!outcome.store_missing);
    }

    #[test]
    fn an_unchanged_target_writes_no_status() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).expect("a valid time"));
        let mut target = target(valid_spec());
        let outcome = target_conditions(&target, None);
        let status = next_target_status(&target, &outcome.desired, &now).expect("first status");
        assert_eq!(status.observed_generation, Some(2));
        target.status = Some(status);
        assert_eq!(next_target_status(&target, &outcome.desired, &now), None);
        target.metadata.generation = Some(3);
        assert!(next_target_status(&target, &outcome.desired, &now).is_some());
    }
}
