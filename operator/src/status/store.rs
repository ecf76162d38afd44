//! A `ProfileStore`'s status: the counts read back from its children, and the conditions the
//! reconcile's outcome calls for.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSetStatus, StatefulSetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;

use super::Failure;
use super::recording::recording_rules_valid;
use crate::api::condition::{
    AGENTS_READY, AVAILABLE, DesiredCondition, RECONCILED, merge_conditions,
};
use crate::api::{ProfileStore, ProfileStoreStatus};
use crate::resources::targets::{self, Aggregation};
use crate::resources::{BuildDefaults, StoreNames};

/// `AgentsReady` reason when another store's agents already cover the nodes.
pub const AGENTS_OWNED_ELSEWHERE: &str = "AgentsOwnedByOtherStore";
/// Reason of `Reconciled` when the targets file had to be cut to its cap.
pub const TARGETS_FILE_CAPPED: &str = "TargetsFileCapped";
/// Reason of `Reconciled` when opted-in pods were over the relay budgets (the per-pod
/// annotation bytes, the per-namespace share or the total), which keep one tenant from
/// crowding others out of the targets file.
pub const ANNOTATED_PODS_LEFT_OUT: &str = "AnnotatedPodsLeftOut";
/// Reason of `AgentsReady=False` when `spec.agent.image` is not allowed.
pub const AGENT_IMAGE_NOT_ALLOWED: &str = "AgentImageNotAllowed";
/// Reason of `AgentsReady=False` when `spec.agent.tolerations` asks for a taint not allowed.
pub const AGENT_TOLERATION_NOT_ALLOWED: &str = "AgentTolerationNotAllowed";
/// Most namespaces a status message names; the rest are only counted, so a cluster of many
/// tenants cannot grow the store object without bound.
const NAMESPACES_NAMED: usize = 5;

/// Why the operator will not run a store's agents as its spec asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentRefusal {
    /// `spec.agent.image`, which is neither the operator's agent image nor an allowed one.
    Image(String),
    /// The taint key of the first `spec.agent.tolerations` entry the operator does not allow
    /// (empty: the entry tolerates every taint).
    Toleration(String),
}

impl AgentRefusal {
    /// The first refusal the store's agent spec earns, image first; `None` when the operator
    /// runs it as asked or agents are disabled.
    pub fn of(store: &ProfileStore, defaults: &BuildDefaults) -> Option<Self> {
        let agent = &store.spec.agent;
        if !agent.enabled {
            return None;
        }
        if let Some(image) = agent
            .image
            .as_ref()
            .filter(|image| !defaults.agent_image_allowed(image))
        {
            return Some(Self::Image(image.clone()));
        }
        agent
            .tolerations
            .as_deref()
            .and_then(|tolerations| defaults.refused_toleration(tolerations))
            .map(|toleration| Self::Toleration(toleration.key.clone().unwrap_or_default()))
    }
}

/// What a reconcile read back while applying a store's children.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// The store StatefulSet's status as the apply returned it.
    pub replicas: Option<StatefulSetStatus>,
    /// The agent DaemonSet's status as the apply returned it (none when agents do not run).
    pub agents: Option<DaemonSetStatus>,
    /// The StatefulSet was deleted to be recreated (immutable fields changed).
    pub recreating: bool,
    /// `namespace/name` of another store whose agents already run on every node.
    pub agents_owned_by: Option<String>,
    /// Why the agents were left as they were.
    pub agent_refusal: Option<AgentRefusal>,
    /// (relayed pods, targets) left out of the targets file to keep it under its cap.
    pub targets_left_out: (usize, usize),
    /// Opted-in pods per namespace that got no relay entry at all (see [`targets::Relays`]).
    pub pods_left_out: BTreeMap<String, usize>,
    /// Why the targets ConfigMap was not written; the other children were applied anyway.
    pub targets_failure: Option<Failure>,
}

/// The counts of the status, read from the children as the reconcile left them.
pub fn observed_status(
    store: &ProfileStore,
    names: &StoreNames,
    observed: &Observed,
    aggregation: &Aggregation,
) -> ProfileStoreStatus {
    let replicas = observed.replicas.as_ref();
    let agents = observed.agents.as_ref();
    ProfileStoreStatus {
        observed_generation: store.meta().generation,
        replicas: replicas.map(|s| s.replicas).unwrap_or_default(),
        ready_replicas: replicas.and_then(|s| s.ready_replicas).unwrap_or_default(),
        agents_desired: agents
            .map(|d| d.desired_number_scheduled)
            .unwrap_or_default(),
        agents_ready: agents.map(|d| d.number_ready).unwrap_or_default(),
        matched_targets: i32::try_from(aggregation.file.targets.len()).unwrap_or(i32::MAX),
        endpoint: Some(names.endpoint(store.spec.service_port)),
        conditions: Vec::new(),
    }
}

/// Status counts unchanged from what the object already says (used when children were not read).
pub fn keep_counts(store: &ProfileStore) -> ProfileStoreStatus {
    let mut status = store.status.clone().unwrap_or_default();
    status.observed_generation = store.meta().generation;
    status
}

/// The one condition of a paused store; the others keep their last value.
pub fn paused_conditions() -> Vec<DesiredCondition> {
    vec![DesiredCondition::fails(
        RECONCILED,
        "Paused",
        "spec.paused is true: children are not reconciled",
    )]
}

/// The conditions the reconcile's outcome calls for; a failed reconcile (`failure`) sets only
/// `Reconciled`, so the others keep what was last seen.
pub fn desired_conditions(
    store: &ProfileStore,
    observed: &Observed,
    aggregation: &Aggregation,
    failure: Option<&Failure>,
) -> Vec<DesiredCondition> {
    if let Some(failure) = failure {
        return vec![DesiredCondition::fails(
            RECONCILED,
            failure.reason,
            failure.message.clone(),
        )];
    }
    vec![
        available(store, observed),
        agents_ready(store, observed),
        reconciled(observed, aggregation),
        recording_rules_valid(store),
    ]
}

fn available(store: &ProfileStore, observed: &Observed) -> DesiredCondition {
    let ready = observed
        .replicas
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or_default();
    if ready > 0 {
        DesiredCondition::holds(
            AVAILABLE,
            "ReplicasReady",
            format!("{ready} of {} replicas ready", store.spec.replicas),
        )
    } else {
        DesiredCondition::fails(
            AVAILABLE,
            "NoReplicasReady",
            "no store replica is ready yet",
        )
    }
}

fn agents_ready(store: &ProfileStore, observed: &Observed) -> DesiredCondition {
    if !store.spec.agent.enabled {
        return DesiredCondition::holds(
            AGENTS_READY,
            "AgentsDisabled",
            "spec.agent.enabled is false",
        );
    }
    match &observed.agent_refusal {
        Some(AgentRefusal::Image(image)) => {
            return DesiredCondition::fails(
                AGENTS_READY,
                AGENT_IMAGE_NOT_ALLOWED,
                format!(
                    "spec.agent.image {image:?} is not the operator's --agent-image or in its --allowed-agent-images"
                ),
            );
        }
        Some(AgentRefusal::Toleration(key)) => {
            return DesiredCondition::fails(
                AGENTS_READY,
                AGENT_TOLERATION_NOT_ALLOWED,
                match key.as_str() {
                    "" => "spec.agent.tolerations tolerates every taint (an empty key), which \
                           needs `*` in the operator's --allowed-agent-tolerations"
                        .to_owned(),
                    key => format!(
                        "spec.agent.tolerations tolerates taint key {key:?}, which is not in the \
                         operator's --allowed-agent-tolerations"
                    ),
                },
            );
        }
        None => {}
    }
    if let Some(owner) = &observed.agents_owned_by {
        return DesiredCondition::fails(
            AGENTS_READY,
            AGENTS_OWNED_ELSEWHERE,
            format!(
                "the agents of ProfileStore {owner} already run on every node; one agent per node ships to one store"
            ),
        );
    }
    match &observed.agents {
        Some(status)
            if status.desired_number_scheduled > 0
                && status.number_ready == status.desired_number_scheduled =>
        {
            DesiredCondition::holds(
                AGENTS_READY,
                "AllAgentsReady",
                format!("{} agents ready", status.number_ready),
            )
        }
        Some(status) => DesiredCondition::fails(
            AGENTS_READY,
            "AgentsNotReady",
            format!(
                "{} of {} agents ready",
                status.number_ready, status.desired_number_scheduled
            ),
        ),
        None => DesiredCondition::fails(
            AGENTS_READY,
            "AgentsNotReady",
            "agent DaemonSet has no status yet",
        ),
    }
}

fn reconciled(observed: &Observed, aggregation: &Aggregation) -> DesiredCondition {
    let (relays_left_out, targets_left_out) = observed.targets_left_out;
    let pods_left_out = pods_left_out_note(&observed.pods_left_out);
    if let Some(failure) = &observed.targets_failure {
        DesiredCondition::fails(RECONCILED, failure.reason, failure.message.clone())
    } else if relays_left_out + targets_left_out > 0 {
        DesiredCondition::holds(
            RECONCILED,
            TARGETS_FILE_CAPPED,
            format!(
                "children are up to date; the agents' targets file is capped at {} KiB: \
                 {relays_left_out} annotated pods and {targets_left_out} ProfilingTargets left out, \
                 from the namespaces with the most entries{}",
                targets::MAX_TARGETS_FILE_BYTES / 1024,
                pods_left_out
                    .map(|note| format!("; besides, {note}"))
                    .unwrap_or_default()
            ),
        )
    } else if let Some(note) = pods_left_out {
        DesiredCondition::holds(
            RECONCILED,
            ANNOTATED_PODS_LEFT_OUT,
            format!("children are up to date; {note}"),
        )
    } else if aggregation.rejected.is_empty() {
        DesiredCondition::holds(RECONCILED, "Applied", "all children are up to date")
    } else {
        let sources: Vec<&str> = aggregation
            .rejected
            .iter()
            .map(|r| r.source.as_str())
            .collect();
        DesiredCondition::holds(
            RECONCILED,
            "AppliedWithRejectedTargets",
            format!(
                "children are up to date; invalid targets left out: {}",
                sources.join(", ")
            ),
        )
    }
}

/// What the relay budgets left out, e.g. `annotated pods left out ...: 2500 (...): aaa 2500`,
/// busiest namespaces first; `None` when every opted-in pod got one.
fn pods_left_out_note(left_out: &BTreeMap<String, usize>) -> Option<String> {
    let total: usize = left_out.values().sum();
    if total == 0 {
        return None;
    }
    let mut busiest: Vec<(&String, &usize)> = left_out.iter().collect();
    busiest.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let mut named: Vec<String> = busiest
        .iter()
        .take(NAMESPACES_NAMED)
        .map(|(namespace, count)| format!("{namespace} {count}"))
        .collect();
    if busiest.len() > NAMESPACES_NAMED {
        named.push(format!(
            "{} more namespaces",
            busiest.len() - NAMESPACES_NAMED
        ));
    }
    Some(format!(
        "annotated pods left out of the agents' targets file: {total} (at most {} relayed per \
         namespace and {} in all, each with at most {} bytes of profiles.kiln.dev annotations): {}",
        targets::MAX_RELAYED_PODS_PER_NAMESPACE,
        targets::MAX_RELAYED_PODS,
        targets::MAX_RELAYED_ANNOTATION_BYTES,
        named.join(", ")
    ))
}

/// The status to write: `counts` with the desired conditions merged into the previous ones
/// (conditions not computed this pass, e.g. `Available` while paused, keep their last value;
/// `lastTransitionTime` moves only on flips). `None` when it equals `previous`, so an unchanged
/// world writes nothing and triggers no reconcile of its own.
pub fn next_status(
    previous: &ProfileStoreStatus,
    mut counts: ProfileStoreStatus,
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: &Time,
) -> Option<ProfileStoreStatus> {
    let mut merged: BTreeMap<String, _> = previous
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.clone()))
        .collect();
    for condition in merge_conditions(&previous.conditions, desired, generation, now) {
        merged.insert(condition.type_.clone(), condition);
    }
    counts.conditions = merged.into_values().collect();
    (counts != *previous).then_some(counts)
}

#[cfg(test)]
mod tests;
