//! Reconciling a `ProfileStore` into its children; its status is computed by
//! [`crate::status::store`] and written by [`super::store_status`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::agent_nudge::nudge_agents;
use super::apply::{Applied, apply_if_changed, delete_if_present};
use super::store_status::{patch_status_if_changed, publish};
// The condition reasons are part of this module's interface; they live with the conditions.
use super::tokens::{self, TokensSecret};
use super::{
    Context, RESYNC, ReconcileError, STORE_FINALIZER, backoff_key, first_release, format_chain,
    namespace_and_name,
};
use crate::api::{ProfileStore, ProfilingTarget};
use crate::resources::targets::{Aggregation, Relays, aggregate};
use crate::resources::{
    StoreNames, agent, applied_hash, network_policy, store as store_objects, targets,
};
use crate::status::ownership::agents_owned_elsewhere;
pub use crate::status::store::{
    AGENT_IMAGE_NOT_ALLOWED, AGENT_TOLERATION_NOT_ALLOWED, AGENTS_OWNED_ELSEWHERE,
    ANNOTATED_PODS_LEFT_OUT, TARGETS_FILE_CAPPED,
};
use crate::status::store::{
    AgentRefusal, Observed, desired_conditions, keep_counts, observed_status, paused_conditions,
};

/// Retry soon after deleting a StatefulSet whose immutable fields changed.
const RECREATE_DELAY: Duration = Duration::from_secs(5);
/// How often a store whose agents are blocked by another store checks whether it may take over.
const AGENT_OWNER_RECHECK: Duration = Duration::from_secs(60);

/// Entry point for the controller: finalizer handling around [`apply`] and [`cleanup`].
pub async fn reconcile(
    store: Arc<ProfileStore>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let (namespace, _) = namespace_and_name(store.as_ref())?;
    let api: Api<ProfileStore> = Api::namespaced(ctx.client.clone(), &namespace);
    let has_finalizer = store.finalizers().iter().any(|f| f == STORE_FINALIZER);
    let deleting = store.meta().deletion_timestamp.is_some();
    // The finalizer guarded the cluster-scoped agent binding that the first release created.
    // Agents need no API access, so no store gets it any more, and a store that still carries
    // it loses it as soon as its binding is gone: while it stays, deleting the store (or its
    // namespace) hangs whenever the operator is not running, as when `kubectl delete -k`
    // removes the operator together with the stores.
    let result = if deleting && has_finalizer {
        finalizer(&api, STORE_FINALIZER, store.clone(), |event| async {
            match event {
                FinalizerEvent::Apply(store) => apply(store, &ctx).await,
                FinalizerEvent::Cleanup(store) => cleanup(store, &ctx).await,
            }
        })
        .await
        .map_err(|source| ReconcileError::Finalizer {
            source: Box::new(source),
        })
    } else if deleting {
        Ok(Action::await_change())
    } else {
        let applied = apply(store.clone(), &ctx).await;
        // Independent of the children: neither waits on the other's failure.
        let retired = if has_finalizer {
            retire_first_release(&store, &ctx).await
        } else {
            Ok(())
        };
        applied.and_then(|action| retired.map(|()| action))
    };
    ctx.metrics.reconciled("ProfileStore", started.elapsed());
    if result.is_ok() {
        ctx.reset_backoff(&backoff_key(store.as_ref()));
    }
    result
}

/// Brings every child in line with the spec, then records the status.
pub async fn apply(store: Arc<ProfileStore>, ctx: &Context) -> Result<Action, ReconcileError> {
    let names = StoreNames::of(&store).map_err(|source| ReconcileError::Build { source })?;
    if store.spec.paused {
        let desired = paused_conditions();
        patch_status_if_changed(&store, ctx, keep_counts(&store), desired, &names).await?;
        return Ok(Action::await_change());
    }
    let all_targets: Api<ProfilingTarget> = Api::all(ctx.client.clone());
    let listed = all_targets
        .list(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::kube("list ProfilingTargets", source))?;
    let aggregation = aggregate(&names, &listed.items);
    let agents_owned_by = if store.spec.agent.enabled {
        let stores: Api<ProfileStore> = Api::all(ctx.client.clone());
        let all = stores
            .list(&ListParams::default())
            .await
            .map_err(|source| ReconcileError::kube("list ProfileStores", source))?;
        agents_owned_elsewhere(&store, &names, &all.items)
    } else {
        None
    };
    let relays = if store.spec.agent.enabled && agents_owned_by.is_none() {
        relayed_pods(ctx).await?
    } else {
        Relays::default()
    };
    match apply_children(&store, &names, &aggregation, &relays, agents_owned_by, ctx).await {
        Ok((observed, targets_error)) => {
            let recreating = observed.recreating;
            let waiting_for_owner = observed.agents_owned_by.is_some();
            let status = observed_status(&store, &names, &observed, &aggregation);
            let conditions = desired_conditions(&store, &observed, &aggregation, None);
            patch_status_if_changed(&store, ctx, status, conditions, &names).await?;
            if let Some(error) = targets_error {
                // Everything else is applied and the status says what failed; the error makes
                // the controller retry the targets file with backoff.
                return Err(error);
            }
            Ok(Action::requeue(if recreating {
                RECREATE_DELAY
            } else if waiting_for_owner {
                // Take over soon after the owning store goes away.
                AGENT_OWNER_RECHECK
            } else {
                RESYNC
            }))
        }
        Err(error) => {
            let failure = error.failure();
            let conditions =
                desired_conditions(&store, &Observed::default(), &aggregation, Some(&failure));
            // Best effort: the original error is what the controller must see and back off on.
            if let Err(status_error) =
                patch_status_if_changed(&store, ctx, keep_counts(&store), conditions, &names).await
            {
                tracing::warn!(error = %format_chain(&status_error), "could not record the failure in status");
            }
            Err(error)
        }
    }
}

/// Removes what owner references cannot: the cluster-scoped agent binding of the first release.
pub async fn cleanup(store: Arc<ProfileStore>, ctx: &Context) -> Result<Action, ReconcileError> {
    let names = StoreNames::of(&store).map_err(|source| ReconcileError::Build { source })?;
    match first_release::delete_agent_binding(&names, ctx).await {
        Ok(()) => {}
        // The operator's own RBAC can go before its stores (`kubectl delete -k` removes its
        // ClusterRole too), and no retry brings it back: keeping the finalizer would hold the
        // store, and its namespace, in Terminating forever. The binding's labels
        // still name the store for whoever cleans up by hand.
        Err(error) if error.is_forbidden() => tracing::warn!(
            binding = %names.agent_binding,
            error = %format_chain(&error),
            "not allowed to remove the first release's agent binding; letting the store go anyway"
        ),
        Err(error) => return Err(error),
    }
    Ok(Action::await_change())
}

/// Deletes a live first-release store's binding, then the finalizer that guarded it.
async fn retire_first_release(store: &ProfileStore, ctx: &Context) -> Result<(), ReconcileError> {
    let names = StoreNames::of(store).map_err(|source| ReconcileError::Build { source })?;
    first_release::delete_agent_binding(&names, ctx).await?;
    first_release::remove_finalizer(store, ctx).await
}

/// Relay entries for every running pod opted in through the API server; remembers which pods
/// they were so the pod watch notices when one of them opts out.
async fn relayed_pods(ctx: &Context) -> Result<Relays, ReconcileError> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    // Metadata only: annotations and UID are all a relay needs, and full pod objects of a whole
    // cluster would cost the operator far more memory.
    let listed = pods
        .list_metadata(&ListParams::default().fields("status.phase=Running"))
        .await
        .map_err(|source| ReconcileError::kube("list Pods", source))?;
    let metas: Vec<ObjectMeta> = listed.items.into_iter().map(|pod| pod.metadata).collect();
    let relays = targets::relays(&metas);
    if let Ok(mut relayed) = ctx.relayed_pods.lock() {
        *relayed = metas
            .iter()
            .filter(|pod| targets::wants_relay(pod))
            .map(|pod| {
                format!(
                    "{}/{}",
                    pod.namespace.as_deref().unwrap_or(""),
                    pod.name.as_deref().unwrap_or("")
                )
            })
            .collect();
    }
    Ok(relays)
}

/// Applies the children; returns what it read back, and why the targets ConfigMap was not
/// written when it was not (everything else was).
async fn apply_children(
    store: &ProfileStore,
    names: &StoreNames,
    aggregation: &Aggregation,
    relays: &Relays,
    agents_owned_by: Option<String>,
    ctx: &Context,
) -> Result<(Observed, Option<ReconcileError>), ReconcileError> {
    let build = |source| ReconcileError::Build { source };
    let client = ctx.client.clone();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &names.namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), &names.namespace);
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), &names.namespace);
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), &names.namespace);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &names.namespace);

    // Before the workloads that read it, so their pods never wait on a missing Secret.
    if tokens::ensure_secret(store, names, ctx).await? == TokensSecret::Created {
        publish(
            ctx,
            store,
            EventType::Normal,
            "GeneratedTokens",
            format!("created Secret {} with new store tokens", names.tokens),
        )
        .await;
    }
    let config = store_objects::config_map(store, names).map_err(build)?;
    apply_if_changed(&config_maps, &config, ctx).await?;
    let headless = store_objects::headless_service(store, names).map_err(build)?;
    apply_if_changed(&services, &headless, ctx).await?;
    let service = store_objects::client_service(store, names).map_err(build)?;
    apply_if_changed(&services, &service, ctx).await?;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &names.namespace);
    if store.spec.network_policy.enabled {
        let policy = network_policy::network_policy(store, names).map_err(build)?;
        apply_if_changed(&policies, &policy, ctx).await?;
    } else {
        delete_if_present(&policies, &names.store, &DeleteParams::default(), ctx).await?;
    }

    let desired_set =
        store_objects::stateful_set(store, names, &config, &ctx.defaults).map_err(build)?;
    let mut observed = Observed {
        agents_owned_by,
        ..Observed::default()
    };
    expand_claims(store, names, ctx).await?;
    match apply_if_changed(&stateful_sets, &desired_set, ctx).await {
        Ok(applied) => observed.replicas = applied.into_object().status,
        Err(ReconcileError::Kube {
            source: kube::Error::Api(status),
            ..
        }) if status.code == 422 => {
            // Immutable StatefulSet fields (selector, claim templates) changed: delete it but
            // orphan the pods and claims, then recreate it on the next pass. Data stays.
            let orphan = DeleteParams::orphan();
            delete_if_present(&stateful_sets, &names.store, &orphan, ctx).await?;
            publish(
                ctx,
                store,
                EventType::Warning,
                "RecreatingStatefulSet",
                format!(
                    "immutable fields changed ({}); recreating with orphaned pods",
                    status.message
                ),
            )
            .await;
            observed.recreating = true;
        }
        Err(other) => return Err(other),
    }

    observed.agent_refusal = AgentRefusal::of(store, &ctx.defaults);
    if observed.agent_refusal.is_some() {
        // Leave whatever agents run as they are: neither start the refused image
        // or tolerations nor take the nodes' profiling away over a spec edit.
        return Ok((observed, None));
    }
    let mut targets_error = None;
    if store.spec.agent.enabled && observed.agents_owned_by.is_none() {
        let fitted = targets::fit_targets(&aggregation.file, &relays.targets);
        observed.targets_left_out = (fitted.relays_left_out, fitted.targets_left_out);
        observed.pods_left_out = relays.left_out.clone();
        // One tenant's oversized or rejected entries must not hold back the agents' own
        // objects, or one namespace's annotations would stall every store's DaemonSet: a
        // failed targets apply is reported and retried, and the agents keep reading the last
        // file that was written.
        let targets_applied = match targets::config_map(store, names, &fitted.file) {
            Ok(targets_map) => match apply_if_changed(&config_maps, &targets_map, ctx).await {
                Ok(Applied::Written(_)) => {
                    if let Some(revision) = applied_hash(&targets_map) {
                        nudge_agents(store, names, revision, ctx).await;
                    }
                    Ok(())
                }
                Ok(Applied::Unchanged(_)) => Ok(()),
                Err(error) => Err(error),
            },
            Err(source) => Err(build(source)),
        };
        targets_error = targets_applied
            .err()
            .map(|source| ReconcileError::TargetsNotApplied {
                source: Box::new(source),
            });
        observed.targets_failure = targets_error.as_ref().map(ReconcileError::failure);
        let account = agent::service_account(store, names).map_err(build)?;
        apply_if_changed(&accounts, &account, ctx).await?;
        let daemon = agent::daemon_set(store, names, &ctx.defaults).map_err(build)?;
        observed.agents = apply_if_changed(&daemon_sets, &daemon, ctx)
            .await?
            .into_object()
            .status;
    } else {
        let params = DeleteParams::default();
        delete_if_present(&daemon_sets, &names.agent, &params, ctx).await?;
        delete_if_present(&accounts, &names.agent, &params, ctx).await?;
        delete_if_present(&config_maps, &names.targets, &params, ctx).await?;
    }
    Ok((observed, targets_error))
}

/// Grows existing claims when `storage.size` grew: claim templates are immutable, so
/// StatefulSets never resize on their own.
async fn expand_claims(
    store: &ProfileStore,
    names: &StoreNames,
    ctx: &Context,
) -> Result<(), ReconcileError> {
    if store.spec.storage.ephemeral {
        return Ok(());
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let selector = format!(
        "app.kubernetes.io/instance={},app.kubernetes.io/component=store",
        names.store
    );
    let listed = claims
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| ReconcileError::kube("list PersistentVolumeClaims", source))?;
    let wanted = &store.spec.storage.size;
    for claim in listed.items {
        let current = claim
            .spec
            .as_ref()
            .and_then(|spec| spec.resources.as_ref())
            .and_then(|resources| resources.requests.as_ref())
            .and_then(|requests| requests.get("storage"))
            .map(|quantity| quantity.0.as_str());
        // Compare sizes, not spellings: the API server may print `10240Mi` as `10Gi`.
        let current_bytes = current.and_then(store_objects::quantity_to_bytes);
        let wanted_bytes = store_objects::quantity_to_bytes(wanted);
        if current == Some(wanted.as_str())
            || matches!((current_bytes, wanted_bytes), (Some(have), Some(want)) if have >= want)
        {
            continue;
        }
        let name = claim.name_any();
        let patch = json!({"spec": {"resources": {"requests": {"storage": wanted}}}});
        match claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                ctx.metrics.wrote("PersistentVolumeClaim", "patch");
                publish(
                    ctx,
                    store,
                    EventType::Normal,
                    "ExpandingStorage",
                    format!("claim {name} requested {wanted}"),
                )
                .await;
            }
            Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
                publish(
                    ctx,
                    store,
                    EventType::Warning,
                    "StorageNotExpandable",
                    format!("claim {name} cannot grow to {wanted}: {}", status.message),
                )
                .await;
            }
            Err(source) => {
                return Err(ReconcileError::kube(format!("expand claim {name}"), source));
            }
        }
    }
    Ok(())
}
