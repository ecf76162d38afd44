//! A `ProfileStore`'s status: the counts read back from its children, the conditions derived
//! from what the reconcile saw, and the status patch plus an Event per flipped condition.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use serde_json::json;

use super::{Context, ReconcileError, format_chain};
use crate::api::condition::{
    AGENTS_READY, AVAILABLE, DesiredCondition, RECONCILED, flipped, merge_conditions,
};
use crate::api::{ProfileStore, ProfileStoreStatus};
use crate::resources::targets::{self, Aggregation};
use crate::resources::{FIELD_MANAGER, StoreNames};

/// `AgentsReady` reason when another store's agents already cover the nodes.
pub const AGENTS_OWNED_ELSEWHERE: &str = "AgentsOwnedByOtherStore";
/// Reason of `Reconciled` when the targets file had to be cut to its cap.
pub const TARGETS_FILE_CAPPED: &str = "TargetsFileCapped";
/// Reason of `Reconciled` when opted-in pods were over the relay budgets (audit O1).
pub const ANNOTATED_PODS_LEFT_OUT: &str = "AnnotatedPodsLeftOut";
/// Most namespaces a status message names; the rest are only counted, so a cluster of many
/// tenants cannot grow the store object without bound.
const NAMESPACES_NAMED: usize = 5;
/// Reason of `AgentsReady=False` when `spec.agent.image` is not allowed.
pub const AGENT_IMAGE_NOT_ALLOWED: &str = "AgentImageNotAllowed";
/// Reason of `AgentsReady=False` when `spec.agent.tolerations` asks for a taint not allowed.
pub const AGENT_TOLERATION_NOT_ALLOWED: &str = "AgentTolerationNotAllowed";

/// Live state read back while applying, for the status.
#[derive(Debug, Default)]
pub(super) struct Observed {
    pub(super) stateful_set: Option<StatefulSet>,
    pub(super) daemon_set: Option<DaemonSet>,
    pub(super) recreating: bool,
    /// `namespace/name` of another store whose agents already run on every node.
    pub(super) agents_owned_by: Option<String>,
    /// The `spec.agent.image` refused because the operator does not allow it.
    pub(super) refused_agent_image: Option<String>,
    /// The taint key of the first `spec.agent.tolerations` entry the operator does not allow
    /// (empty: the entry tolerates every taint).
    pub(super) refused_toleration_key: Option<String>,
    /// (relayed pods, targets) left out of the targets file to keep it under its cap.
    pub(super) targets_left_out: (usize, usize),
    /// Opted-in pods per namespace that got no relay entry at all (see [`targets::Relays`]).
    pub(super) pods_left_out: BTreeMap<String, usize>,
    /// Why the targets ConfigMap was not written ([`ReconcileError::TargetsNotApplied`]); the
    /// other children were applied anyway.
    pub(super) targets_error: Option<ReconcileError>,
}

/// The counts of the status, read from the children as the reconcile left them.
pub(super) fn observed_status(
    store: &ProfileStore,
    names: &StoreNames,
    observed: &Observed,
    aggregation: &Aggregation,
) -> ProfileStoreStatus {
    let set_status = observed
        .stateful_set
        .as_ref()
        .and_then(|s| s.status.as_ref());
    let daemon_status = observed.daemon_set.as_ref().and_then(|d| d.status.as_ref());
    ProfileStoreStatus {
        observed_generation: store.meta().generation,
        replicas: set_status.map(|s| s.replicas).unwrap_or_default(),
        ready_replicas: set_status
            .and_then(|s| s.ready_replicas)
            .unwrap_or_default(),
        agents_desired: daemon_status
            .map(|d| d.desired_number_scheduled)
            .unwrap_or_default(),
        agents_ready: daemon_status.map(|d| d.number_ready).unwrap_or_default(),
        matched_targets: i32::try_from(aggregation.file.targets.len()).unwrap_or(i32::MAX),
        endpoint: Some(names.endpoint(store.spec.service_port)),
        conditions: Vec::new(),
    }
}

/// Status counts unchanged from what the object already says (used when children were not read).
pub(super) fn keep_counts(store: &ProfileStore) -> ProfileStoreStatus {
    let mut status = store.status.clone().unwrap_or_default();
    status.observed_generation = store.meta().generation;
    status
}

/// The conditions the reconcile's outcome calls for; an error overrides everything else.
pub(super) fn desired_conditions(
    store: &ProfileStore,
    observed: &Observed,
    aggregation: &Aggregation,
    error: Option<&ReconcileError>,
) -> Vec<DesiredCondition> {
    let mut conditions = Vec::new();
    if let Some(error) = error {
        conditions.push(DesiredCondition::fails(
            RECONCILED,
            error.reason(),
            format_chain(error),
        ));
        return conditions;
    }
    let ready = observed
        .stateful_set
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or_default();
    conditions.push(if ready > 0 {
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
    });
    let agents = observed.daemon_set.as_ref().and_then(|d| d.status.as_ref());
    conditions.push(match (store.spec.agent.enabled, agents) {
        (false, _) => DesiredCondition::holds(
            AGENTS_READY,
            "AgentsDisabled",
            "spec.agent.enabled is false",
        ),
        (true, _) if observed.refused_agent_image.is_some() => DesiredCondition::fails(
            AGENTS_READY,
            AGENT_IMAGE_NOT_ALLOWED,
            format!(
                "spec.agent.image {:?} is not the operator's --agent-image or in its --allowed-agent-images",
                observed.refused_agent_image.as_deref().unwrap_or("")
            ),
        ),
        (true, _) if observed.refused_toleration_key.is_some() => DesiredCondition::fails(
            AGENTS_READY,
            AGENT_TOLERATION_NOT_ALLOWED,
            match observed.refused_toleration_key.as_deref().unwrap_or("") {
                "" => "spec.agent.tolerations tolerates every taint (an empty key), which needs \
                       `*` in the operator's --allowed-agent-tolerations"
                    .to_owned(),
                key => format!(
                    "spec.agent.tolerations tolerates taint key {key:?}, which is not in the \
                     operator's --allowed-agent-tolerations"
                ),
            },
        ),
        (true, _) if observed.agents_owned_by.is_some() => DesiredCondition::fails(
            AGENTS_READY,
            AGENTS_OWNED_ELSEWHERE,
            format!(
                "the agents of ProfileStore {} already run on every node; one agent per node ships to one store",
                observed.agents_owned_by.as_deref().unwrap_or("")
            ),
        ),
        (true, Some(status))
            if status.desired_number_scheduled > 0
                && status.number_ready == status.desired_number_scheduled =>
        {
            DesiredCondition::holds(
                AGENTS_READY,
                "AllAgentsReady",
                format!("{} agents ready", status.number_ready),
            )
        }
        (true, Some(status)) => DesiredCondition::fails(
            AGENTS_READY,
            "AgentsNotReady",
            format!(
                "{} of {} agents ready",
                status.number_ready, status.desired_number_scheduled
            ),
        ),
        (true, None) => DesiredCondition::fails(
            AGENTS_READY,
            "AgentsNotReady",
            "agent DaemonSet has no status yet",
        ),
    });
    let (relays_left_out, targets_left_out) = observed.targets_left_out;
    let pods_left_out = pods_left_out_note(&observed.pods_left_out);
    conditions.push(if let Some(error) = &observed.targets_error {
        DesiredCondition::fails(RECONCILED, error.reason(), format_chain(error))
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
    });
    conditions
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

/// Writes the status with server-side apply only if it differs from the current one, and
/// publishes an Event for every condition that flipped.
pub(super) async fn patch_status_if_changed(
    store: &ProfileStore,
    ctx: &Context,
    mut status: ProfileStoreStatus,
    desired: Vec<DesiredCondition>,
    names: &StoreNames,
) -> Result<(), ReconcileError> {
    let previous = store.status.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // Conditions not computed this pass (e.g. Available while paused) keep their last value.
    let mut merged: BTreeMap<String, _> = previous
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.clone()))
        .collect();
    for condition in merge_conditions(
        &previous.conditions,
        &desired,
        store.meta().generation,
        &now,
    ) {
        merged.insert(condition.type_.clone(), condition);
    }
    status.conditions = merged.into_values().collect();
    if status == previous {
        return Ok(());
    }
    let api: Api<ProfileStore> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let body = json!({
        "apiVersion": ProfileStore::api_version(&()),
        "kind": ProfileStore::kind(&()),
        "status": status,
    });
    api.patch_status(
        &names.store,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|source| ReconcileError::kube("patch ProfileStore status", source))?;
    ctx.metrics.wrote("ProfileStore", "status");
    for condition in flipped(&previous.conditions, &status.conditions) {
        let type_ = if condition.status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let note = format!(
            "{} is {}: {}",
            condition.type_, condition.status, condition.message
        );
        publish(ctx, store, type_, &condition.reason, note).await;
    }
    Ok(())
}

/// Publishes an Event about the store; failures are logged, never fatal.
pub(super) async fn publish(
    ctx: &Context,
    object: &ProfileStore,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(error = %error, "could not publish event");
    }
}
