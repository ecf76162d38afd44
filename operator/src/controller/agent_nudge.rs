//! Getting a new targets file to the agents within seconds, not at the kubelet's next resync.
//!
//! Agents read their targets from a ConfigMap volume (they hold no API token). The kubelet
//! rewrites such a volume only when it syncs the pod: on a pod update, or at its periodic
//! resync (`syncFrequency`, one minute by default, plus jitter). On a real cluster that put a
//! live annotation 40-60 s, four to six agent windows, away from the first profile. Marking
//! each agent pod with the revision of the file it should see is such an update: the kubelet
//! syncs the pod and remounts the ConfigMap at once, and no container restarts.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::Context;
use super::store_status::publish;
use crate::api::ProfileStore;
use crate::resources::{StoreNames, selector_labels};

/// Pod annotation with the applied hash of the targets ConfigMap the agent pod should see.
pub const TARGETS_REVISION_ANNOTATION: &str = "kiln.dev/targets-revision";

/// Marks every agent pod of `store` with `revision`. Best effort: the new file still reaches
/// the agents at the kubelet's next resync, so a refused patch (an older Role without pod
/// `patch`) is reported as an event and never fails the reconcile.
pub async fn nudge_agents(store: &ProfileStore, names: &StoreNames, revision: &str, ctx: &Context) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let selector = selector_labels(names, "agent")
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed,
        Err(error) => {
            tracing::warn!(%error, store = %names.store, "cannot list agent pods to refresh their targets");
            return;
        }
    };
    let patch = json!({"metadata": {"annotations": {TARGETS_REVISION_ANNOTATION: revision}}});
    for pod in listed.items {
        if pod
            .annotations()
            .get(TARGETS_REVISION_ANNOTATION)
            .map(String::as_str)
            == Some(revision)
        {
            continue;
        }
        let name = pod.name_any();
        match pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => ctx.metrics.wrote("Pod", "patch"),
            // Gone between the list and the patch: its replacement mounts the new file.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                publish(
                    ctx,
                    store,
                    EventType::Warning,
                    "AgentTargetsDelayed",
                    format!(
                        "could not mark agent pod {name} with the new targets ({error}); \
                         it reads them at the kubelet's next resync"
                    ),
                )
                .await;
                return;
            }
        }
    }
}
