//! Reconciling a `ProfilingTarget`: validate it, find its store, report whether it is published.
//!
//! Publishing itself is the store reconciler's job (it watches targets); this one only writes the
//! target's status, and only when that status changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource};
use serde_json::json;

use super::{Context, RESYNC, ReconcileError, backoff_key, namespace_and_name};
use crate::api::condition::{DesiredCondition, READY, RECONCILED, merge_conditions};
use crate::api::{ProfileStore, ProfilingTarget, ProfilingTargetStatus};
use crate::resources::FIELD_MANAGER;
use crate::resources::targets::to_file_target;

/// How soon to look again for a store that does not exist yet.
const STORE_MISSING_RECHECK: Duration = Duration::from_secs(30);

/// Entry point for the controller.
pub async fn reconcile(
    target: Arc<ProfilingTarget>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let result = reconcile_inner(&target, &ctx).await;
    ctx.metrics.reconciled("ProfilingTarget", started.elapsed());
    if result.is_ok() {
        ctx.reset_backoff(&backoff_key(target.as_ref()));
    }
    result
}

async fn reconcile_inner(
    target: &ProfilingTarget,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let (namespace, name) = namespace_and_name(target)?;
    if target.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let store_namespace = target.store_namespace().unwrap_or(&namespace).to_owned();
    let store_name = &target.spec.store_ref.name;
    let stores: Api<ProfileStore> = Api::namespaced(ctx.client.clone(), &store_namespace);
    let store = stores.get_opt(store_name).await.map_err(|source| {
        ReconcileError::kube(
            format!("get ProfileStore {store_namespace}/{store_name}"),
            source,
        )
    })?;

    let validity = to_file_target(target);
    let reconciled = match &validity {
        Ok(_) => DesiredCondition::holds(RECONCILED, "Valid", "the spec is valid"),
        Err(problem) => DesiredCondition::fails(RECONCILED, "InvalidSpec", problem.clone()),
    };
    let store_label = format!("{store_namespace}/{store_name}");
    let (ready, requeue) = match (&validity, &store) {
        (Err(_), _) => (
            DesiredCondition::fails(
                READY,
                "InvalidSpec",
                "fix the spec; see the Reconciled condition",
            ),
            RESYNC,
        ),
        (Ok(_), _) if target.spec.suspend => (
            DesiredCondition::fails(READY, "Suspended", "spec.suspend is true"),
            RESYNC,
        ),
        (Ok(_), None) => (
            DesiredCondition::fails(
                READY,
                "StoreNotFound",
                format!("ProfileStore {store_label} does not exist"),
            ),
            STORE_MISSING_RECHECK,
        ),
        (Ok(_), Some(store)) if agents_elsewhere(store) => (
            DesiredCondition::fails(
                READY,
                super::store::AGENTS_OWNED_ELSEWHERE,
                format!(
                    "ProfileStore {store_label} has no agents of its own; point the target at the store that runs them"
                ),
            ),
            RESYNC,
        ),
        (Ok(_), Some(store)) if !store.spec.agent.enabled => (
            DesiredCondition::fails(
                READY,
                "AgentsDisabled",
                format!("ProfileStore {store_label} runs no agents"),
            ),
            RESYNC,
        ),
        (Ok(_), Some(_)) => (
            DesiredCondition::holds(
                READY,
                "Published",
                format!("published to the agents of ProfileStore {store_label}"),
            ),
            RESYNC,
        ),
    };

    let previous = target.status.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let status = ProfilingTargetStatus {
        observed_generation: target.meta().generation,
        conditions: merge_conditions(
            &previous.conditions,
            &[ready, reconciled],
            target.meta().generation,
            &now,
        ),
    };
    if status != previous {
        let api: Api<ProfilingTarget> = Api::namespaced(ctx.client.clone(), &namespace);
        let body = json!({
            "apiVersion": ProfilingTarget::api_version(&()),
            "kind": ProfilingTarget::kind(&()),
            "status": status,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| ReconcileError::kube("patch ProfilingTarget status", source))?;
        ctx.metrics.wrote("ProfilingTarget", "status");
    }
    Ok(Action::requeue(requeue))
}

/// True when the store reports that another store's agents cover the nodes.
fn agents_elsewhere(store: &ProfileStore) -> bool {
    store
        .status
        .as_ref()
        .map(|status| status.conditions.iter())
        .into_iter()
        .flatten()
        .any(|condition| condition.reason == super::store::AGENTS_OWNED_ELSEWHERE)
}
