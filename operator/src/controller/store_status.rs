//! Writing a `ProfileStore`'s status (computed by [`crate::status::store`]) and publishing an
//! Event per flipped condition.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use serde_json::json;

use super::{Context, ReconcileError};
use crate::api::ProfileStore;
use crate::api::ProfileStoreStatus;
use crate::api::condition::{DesiredCondition, flipped};
use crate::resources::{FIELD_MANAGER, StoreNames};
use crate::status::store::next_status;

/// Writes the status with server-side apply only if it differs from the current one, and
/// publishes an Event for every condition that flipped.
pub(super) async fn patch_status_if_changed(
    store: &ProfileStore,
    ctx: &Context,
    counts: ProfileStoreStatus,
    desired: Vec<DesiredCondition>,
    names: &StoreNames,
) -> Result<(), ReconcileError> {
    let previous = store.status.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let Some(status) = next_status(&previous, counts, &desired, store.meta().generation, &now)
    else {
        return Ok(());
    };
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
