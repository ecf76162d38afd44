//! What the first release left on stores: a cluster-scoped agent ClusterRoleBinding per store and
//! the `kiln.dev/agent-rbac` finalizer that guarded it. Agents need no API access any more, so
//! both go: the binding once its labels prove Kiln made it for this store, then the finalizer.

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{Context, ReconcileError, STORE_FINALIZER};
use crate::api::ProfileStore;
use crate::resources::{FIELD_MANAGER, STORE_LABEL, STORE_NAMESPACE_LABEL, StoreNames};

/// Whether `binding` carries the labels the first release put on the agent binding of this
/// store. The name alone proves nothing: `kiln-agent-{namespace}-{name}` is the same for
/// `a-b/c` and `a/b-c`, and anyone may have created a binding by that name.
pub fn made_by_kiln_for(binding: &ClusterRoleBinding, names: &StoreNames) -> bool {
    let labels = binding.labels();
    let is = |key: &str, value: &str| labels.get(key).map(String::as_str) == Some(value);
    is("app.kubernetes.io/managed-by", FIELD_MANAGER)
        && is(STORE_LABEL, &names.store)
        && is(STORE_NAMESPACE_LABEL, &names.namespace)
}

/// Deletes the store's first-release agent binding if there is one and Kiln made it; a binding
/// of that name that Kiln did not make is left alone. Either way the store holds no binding
/// afterwards, which is what the finalizer waited for.
pub async fn delete_agent_binding(names: &StoreNames, ctx: &Context) -> Result<(), ReconcileError> {
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client.clone());
    let name = &names.agent_binding;
    let Some(binding) = bindings
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::kube(format!("get ClusterRoleBinding {name}"), source))?
    else {
        return Ok(());
    };
    if !made_by_kiln_for(&binding, names) {
        tracing::warn!(
            binding = %name,
            store = %format!("{}/{}", names.namespace, names.store),
            "leaving a ClusterRoleBinding whose labels do not name this store"
        );
        return Ok(());
    }
    // Delete exactly the object whose labels were checked, not a replacement created since.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: binding.uid(),
            resource_version: binding.resource_version(),
        }),
        ..DeleteParams::default()
    };
    match bindings.delete(name, &params).await {
        Ok(_) => {
            ctx.metrics.wrote("ClusterRoleBinding", "delete");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::kube(
            format!("delete ClusterRoleBinding {name}"),
            source,
        )),
    }
}

/// Removes the first release's finalizer from a store whose binding is gone. The JSON patch
/// tests the entry first, so a concurrent edit of the list fails the patch instead of removing
/// someone else's finalizer.
pub async fn remove_finalizer(store: &ProfileStore, ctx: &Context) -> Result<(), ReconcileError> {
    let Some(index) = store.finalizers().iter().position(|f| f == STORE_FINALIZER) else {
        return Ok(());
    };
    let (namespace, name) = super::namespace_and_name(store)?;
    let path = format!("/metadata/finalizers/{index}");
    let patch = serde_json::from_value(json!([
        {"op": "test", "path": path, "value": STORE_FINALIZER},
        {"op": "remove", "path": path},
    ]))
    .map_err(|source| {
        ReconcileError::kube("build the finalizer patch", kube::Error::SerdeError(source))
    })?;
    let api: Api<ProfileStore> = Api::namespaced(ctx.client.clone(), &namespace);
    api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|source| {
            ReconcileError::kube(format!("remove finalizer {STORE_FINALIZER}"), source)
        })?;
    ctx.metrics.wrote("ProfileStore", "patch");
    Ok(())
}
