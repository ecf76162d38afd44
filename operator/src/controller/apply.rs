//! Writing children: server-side apply under one field manager, skipped when the live object
//! already carries the hash of the desired one.

use std::fmt::Debug;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Context, ReconcileError};
use crate::resources::{FIELD_MANAGER, applied_hash};

/// What [`apply_if_changed`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied<K> {
    /// The live object already matched; nothing was written.
    Unchanged(K),
    /// The object was created or updated; this is the server's answer.
    Written(K),
}

impl<K> Applied<K> {
    /// The live object after the call.
    pub fn into_object(self) -> K {
        match self {
            Self::Unchanged(object) | Self::Written(object) => object,
        }
    }
}

/// Reads the live object and applies `desired` only if its applied-hash differs.
pub async fn apply_if_changed<K>(
    api: &Api<K>,
    desired: &K,
    ctx: &Context,
) -> Result<Applied<K>, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let kind = K::kind(&());
    let name = desired
        .meta()
        .name
        .clone()
        .ok_or(ReconcileError::MissingMetadata { field: "name" })?;
    let live = api
        .get_opt(&name)
        .await
        .map_err(|source| ReconcileError::kube(format!("get {kind} {name}"), source))?;
    let key = format!(
        "{kind}/{}/{name}",
        desired.meta().namespace.as_deref().unwrap_or("")
    );
    if let Some(live) = live
        && applied_hash(&live).is_some()
        && applied_hash(&live) == applied_hash(desired)
        && !edited_by_someone_else(ctx, &key, live.meta().generation)
    {
        return Ok(Applied::Unchanged(live));
    }
    let written = server_side_apply(api, &name, desired).await?;
    ctx.metrics.wrote(static_kind(&kind), "apply");
    remember_generation(ctx, &key, written.meta().generation);
    Ok(Applied::Written(written))
}

/// True when the live generation moved since the operator last saw the object: its spec was
/// edited behind the operator's back, so the desired state is applied again. Objects without a
/// generation (ConfigMaps, Services) and the first sighting after a restart count as unedited.
fn edited_by_someone_else(ctx: &Context, key: &str, live_generation: Option<i64>) -> bool {
    let Some(live_generation) = live_generation else {
        return false;
    };
    let Ok(mut seen) = ctx.seen_generations.lock() else {
        return false;
    };
    match seen.insert(key.to_owned(), live_generation) {
        Some(previous) => previous != live_generation,
        None => false,
    }
}

fn remember_generation(ctx: &Context, key: &str, generation: Option<i64>) {
    if let (Some(generation), Ok(mut seen)) = (generation, ctx.seen_generations.lock()) {
        seen.insert(key.to_owned(), generation);
    }
}

/// Server-side apply with the operator's field manager, taking ownership of conflicting fields.
pub async fn server_side_apply<K>(
    api: &Api<K>,
    name: &str,
    desired: &K,
) -> Result<K, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let mut body = serde_json::to_value(desired).map_err(|source| {
        ReconcileError::kube(
            format!("serialize {}", K::kind(&())),
            kube::Error::SerdeError(source),
        )
    })?;
    // k8s-openapi objects serialize without apiVersion/kind, which apply requires.
    if let Some(map) = body.as_object_mut() {
        map.insert("apiVersion".to_owned(), K::api_version(&()).into());
        map.insert("kind".to_owned(), K::kind(&()).into());
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(&body))
        .await
        .map_err(|source| ReconcileError::kube(format!("apply {} {name}", K::kind(&())), source))
}

/// Deletes an object if it exists; a missing object is success.
pub async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
    ctx: &Context,
) -> Result<bool, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let kind = K::kind(&());
    let exists = api
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::kube(format!("get {kind} {name}"), source))?
        .is_some();
    if !exists {
        return Ok(false);
    }
    match api.delete(name, params).await {
        Ok(_) => {
            ctx.metrics.wrote(static_kind(&kind), "delete");
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(ReconcileError::kube(
            format!("delete {kind} {name}"),
            source,
        )),
    }
}

/// Maps the kinds the operator writes to static strings for metric labels.
pub fn static_kind(kind: &str) -> &'static str {
    match kind {
        "StatefulSet" => "StatefulSet",
        "DaemonSet" => "DaemonSet",
        "Service" => "Service",
        "ConfigMap" => "ConfigMap",
        "ServiceAccount" => "ServiceAccount",
        "Secret" => "Secret",
        "NetworkPolicy" => "NetworkPolicy",
        "ClusterRoleBinding" => "ClusterRoleBinding",
        "PersistentVolumeClaim" => "PersistentVolumeClaim",
        "ProfileStore" => "ProfileStore",
        "ProfilingTarget" => "ProfilingTarget",
        _ => "Other",
    }
}
