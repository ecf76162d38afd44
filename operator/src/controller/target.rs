//! Reconciling a `ProfilingTarget`: validate it, find its store, report whether it is published.
//!
//! Publishing itself is the store reconciler's job (it watches targets); this one only writes the
//! target's status ([`crate::status::target`]), and only when that status changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource};
use serde_json::json;

use super::{Context, RESYNC, ReconcileError, backoff_key, namespace_and_name};
use crate::api::{ProfileStore, ProfilingTarget};
use crate::resources::FIELD_MANAGER;
use crate::status::target::{next_target_status, target_conditions};

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

    let outcome = target_conditions(target, store.as_ref());
    let requeue = if outcome.store_missing {
        STORE_MISSING_RECHECK
    } else {
        RESYNC
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    if let Some(status) = next_target_status(target, &outcome.desired, &now) {
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
