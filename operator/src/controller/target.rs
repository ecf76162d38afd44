//! Reconciling a `ProfilingTarget`: validate it, find its store, report whether it is published.
//!
//! Publishing itself is the store reconciler's job (it watches targets); this one only writes the
//! target's status ([`crate::status::target`]), and only when that status changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::{Context, RESYNC, ReconcileError, backoff_key, namespace_and_name};
use crate::api::{ProfileStore, ProfilingTarget};
use crate::resources::FIELD_MANAGER;
use crate::status::target::{next_target_status, target_conditions};

/// How soon to look again for a store that does not exist yet.
const STORE_MISSING_RECHECK: Duration = Duration::from_secs(30);

/// The targets that name `store` as theirs. A store that appears, changes or is deleted
/// changes whether they are published, so the target controller looks at them again then
/// rather than at its next resync (a deleted store's targets kept saying `Ready` for ten
/// minutes).
pub fn targets_naming<'a>(
    targets: impl IntoIterator<Item = &'a ProfilingTarget>,
    store: &ProfileStore,
) -> Vec<ObjectRef<ProfilingTarget>> {
    let (Some(namespace), name) = (store.namespace(), store.name_any()) else {
        return Vec::new();
    };
    targets
        .into_iter()
        .filter(|target| {
            target.store_namespace() == Some(namespace.as_str())
                && target.spec.store_ref.name == name
        })
        .map(ObjectRef::from_obj)
        .collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ProfileStoreSpec, ProfilingTargetSpec};

    fn target(namespace: &str, name: &str, store_ref: serde_json::Value) -> ProfilingTarget {
        let spec: ProfilingTargetSpec =
            serde_json::from_value(serde_json::json!({ "storeRef": store_ref })).expect("spec");
        let mut target = ProfilingTarget::new(name, spec);
        target.metadata.namespace = Some(namespace.to_owned());
        target
    }

    #[test]
    fn a_store_maps_to_the_targets_that_name_it_in_any_namespace() {
        let spec: ProfileStoreSpec = serde_json::from_value(serde_json::json!({})).expect("spec");
        let mut store = ProfileStore::new("kiln", spec);
        store.metadata.namespace = Some("kiln-system".to_owned());
        let targets = [
            target(
                "shop",
                "web",
                serde_json::json!({"name": "kiln", "namespace": "kiln-system"}),
            ),
            target("kiln-system", "local", serde_json::json!({"name": "kiln"})),
            target(
                "shop",
                "other-store",
                serde_json::json!({"name": "other", "namespace": "kiln-system"}),
            ),
            target(
                "shop",
                "same-name-here",
                serde_json::json!({"name": "kiln"}),
            ),
        ];
        let names: Vec<String> = targets_naming(&targets, &store)
            .into_iter()
            .map(|reference| {
                format!(
                    "{}/{}",
                    reference.namespace.unwrap_or_default(),
                    reference.name
                )
            })
            .collect();
        assert_eq!(names, ["shop/web", "kiln-system/local"]);
        let mut unnamespaced = store.clone();
        unnamespaced.metadata.namespace = None;
        assert!(targets_naming(&targets, &unnamespaced).is_empty());
    }
}
