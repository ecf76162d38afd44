//! The two reconcilers, their shared context, error policy and the controller wiring.

pub mod agent_nudge;
pub mod apply;
pub mod first_release;
pub mod pod_changes;
pub mod store;
mod store_status;
pub mod target;
pub mod tokens;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{finalizer, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::{ProfileStore, ProfilingTarget};
use crate::metrics::Metrics;
use crate::resources::{BuildDefaults, BuildError};
use crate::status::Failure;
use crate::status::ownership::agent_owner;

/// The finalizer the first release put on stores whose agents had a cluster-scoped binding;
/// removed once that binding is gone (see [`first_release`]).
pub const STORE_FINALIZER: &str = "kiln.dev/agent-rbac";

/// First retry delay after a failed reconcile; doubles per consecutive failure.
pub const BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Periodic re-check of healthy objects (children changes trigger reconciles sooner).
pub const RESYNC: Duration = Duration::from_secs(600);

/// Everything a reconcile needs besides the object.
#[derive(Clone)]
pub struct Context {
    /// API client.
    pub client: Client,
    /// Event recorder (events.k8s.io/v1).
    pub recorder: Recorder,
    /// Images and names the builders default to.
    pub defaults: BuildDefaults,
    /// Shared counters.
    pub metrics: Arc<Metrics>,
    /// Consecutive failures per object, for exponential backoff.
    pub failures: Arc<Mutex<HashMap<String, u32>>>,
    /// `metadata.generation` of each workload right after the operator last wrote or checked it;
    /// a different live generation with an unchanged hash means someone else edited its spec.
    pub seen_generations: Arc<Mutex<HashMap<String, i64>>>,
    /// `namespace/name` of the pods last relayed into the agents' targets file, so the pod watch
    /// also reconciles when one of them loses its annotation.
    pub relayed_pods: Arc<Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context with a fresh recorder and metrics.
    pub fn new(client: Client, defaults: BuildDefaults, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "kiln-operator".to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            defaults,
            metrics,
            failures: Arc::default(),
            seen_generations: Arc::default(),
            relayed_pods: Arc::default(),
        }
    }

    /// Exponential backoff for `key`: 5 s, 10 s, 20 s, … capped at 5 min.
    pub fn next_backoff(&self, key: &str) -> Duration {
        let attempts = match self.failures.lock() {
            Ok(mut failures) => {
                let count = failures.entry(key.to_owned()).or_default();
                *count = count.saturating_add(1);
                *count
            }
            Err(_) => 1,
        };
        let factor = 2u32.saturating_pow(attempts.saturating_sub(1).min(16));
        BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
    }

    /// Forgets the failures of `key` after a successful reconcile.
    pub fn reset_backoff(&self, key: &str) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(key);
        }
    }
}

/// Why a reconcile failed. The controller retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// An API call failed.
    #[error("{action} failed")]
    Kube {
        /// What the operator was doing, e.g. `apply StatefulSet`.
        action: String,
        /// The client's description.
        #[source]
        source: kube::Error,
    },
    /// The spec could not be turned into objects.
    #[error("could not build the children")]
    Build {
        /// The builder's description.
        #[source]
        source: BuildError,
    },
    /// Adding, running or removing the finalizer failed.
    #[error("finalizer step failed")]
    Finalizer {
        /// The finalizer helper's description (boxed: it wraps this type).
        #[source]
        source: Box<finalizer::Error<ReconcileError>>,
    },
    /// The agents' targets ConfigMap could not be written; every other child was applied.
    #[error("the agents' targets file was not applied")]
    TargetsNotApplied {
        /// Why the build or the apply failed (boxed: it is this type).
        #[source]
        source: Box<ReconcileError>,
    },
    /// New tokens could not be generated: the OS random device could not be read.
    #[error("could not read random bytes from {device}")]
    Random {
        /// The device read.
        device: &'static str,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// The object came without namespace or name.
    #[error("object has no {field}")]
    MissingMetadata {
        /// The missing field.
        field: &'static str,
    },
}

impl ReconcileError {
    /// A fixed name of the error kind, for metric labels and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "ApiError",
            Self::Build { .. } => "BuildFailed",
            Self::Finalizer { source } => match source.as_ref() {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.reason()
                }
                _ => "FinalizerFailed",
            },
            Self::TargetsNotApplied { .. } => "TargetsNotApplied",
            Self::Random { .. } => "RandomUnavailable",
            Self::MissingMetadata { .. } => "MissingMetadata",
        }
    }

    /// True when the API server refused the call for lack of permission (403), which retrying
    /// does not change.
    pub fn is_forbidden(&self) -> bool {
        matches!(
            self,
            Self::Kube {
                source: kube::Error::Api(status),
                ..
            } if status.code == 403
        )
    }

    /// The error as a condition shows it.
    pub fn failure(&self) -> Failure {
        Failure {
            reason: self.reason(),
            message: format_chain(self),
        }
    }

    /// Wraps a client error with what was being done.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source,
        }
    }
}

/// Key of an object in the backoff map.
pub fn backoff_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        object.meta().namespace.as_deref().unwrap_or(""),
        object.meta().name.as_deref().unwrap_or("")
    )
}

/// Shared error policy: count the failure, then retry with exponential backoff.
pub fn error_policy<K>(object: Arc<K>, error: &ReconcileError, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()>,
{
    let kind: &'static str = if K::kind(&()) == "ProfileStore" {
        "ProfileStore"
    } else {
        "ProfilingTarget"
    };
    ctx.metrics.failed(kind, error.reason());
    let delay = ctx.next_backoff(&backoff_key(object.as_ref()));
    tracing::warn!(
        kind,
        name = object.meta().name.as_deref().unwrap_or(""),
        reason = error.reason(),
        error = %format_chain(error),
        retry_in_secs = delay.as_secs(),
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// The error and all its sources on one line.
pub fn format_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Runs both controllers until SIGTERM/SIGINT, then lets in-flight reconciles finish.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let stores: Api<ProfileStore> = Api::all(client.clone());
    let targets: Api<ProfilingTarget> = Api::all(client.clone());
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=kiln-operator");

    let store_controller = Controller::new(stores, watcher::Config::default().any_semantic());
    let known_stores = store_controller.store();
    let relayed = ctx.relayed_pods.clone();
    let pod_changes = pod_changes::PodChanges::default();
    let store_controller = store_controller
        .owns(Api::<StatefulSet>::all(client.clone()), owned.clone())
        .owns(Api::<DaemonSet>::all(client.clone()), owned.clone())
        .owns(Api::<Service>::all(client.clone()), owned.clone())
        .owns(Api::<ConfigMap>::all(client.clone()), owned.clone())
        .owns(Api::<ServiceAccount>::all(client.clone()), owned)
        // Targets carry no owner reference (they may live in another namespace): map each one to
        // the store it names, so edits and deletions re-aggregate that store's targets file.
        .watches(targets.clone(), watcher::Config::default(), |target| {
            let namespace = target.store_namespace().map(str::to_owned);
            namespace
                .map(|namespace| ObjectRef::new(&target.spec.store_ref.name).within(&namespace))
        })
        // Pods annotated after they started are invisible to agents (CRI sandboxes are
        // immutable): the agent-owning store relays them in its targets file, so a pod that
        // opts in, opts out or goes away re-renders that file. Only events that change what
        // the reconcile reads from a pod count: each reconcile LISTs targets, stores and pods.
        .watches(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default(),
            move |pod| {
                let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
                let was_relayed = relayed
                    .lock()
                    .map(|relayed| relayed.contains(&key))
                    .unwrap_or(true);
                if !pod_changes.needs_reconcile(&pod, was_relayed) {
                    return None;
                }
                let stores: Vec<ProfileStore> = known_stores
                    .state()
                    .iter()
                    .map(|store| store.as_ref().clone())
                    .collect();
                let owner = agent_owner(&stores)?;
                let (namespace, name) = owner.split_once('/')?;
                Some(ObjectRef::new(name).within(namespace))
            },
        )
        .shutdown_on_signal()
        .run(store::reconcile, error_policy::<ProfileStore>, ctx.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(error = %format_chain(&error), "store controller event");
            }
        });

    let target_controller = Controller::new(targets, watcher::Config::default().any_semantic());
    let known_targets = target_controller.store();
    let target_controller = target_controller
        .watches(
            Api::<ProfileStore>::all(client.clone()),
            watcher::Config::default(),
            move |store| {
                target::targets_naming(known_targets.state().iter().map(AsRef::as_ref), &store)
            },
        )
        .shutdown_on_signal()
        .run(
            target::reconcile,
            error_policy::<ProfilingTarget>,
            ctx.clone(),
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(error = %format_chain(&error), "target controller event");
            }
        });

    futures::join!(store_controller, target_controller);
}

/// Namespace and name of an object, or an error naming the missing field.
pub fn namespace_and_name<K: Resource>(object: &K) -> Result<(String, String), ReconcileError> {
    let namespace = object
        .namespace()
        .ok_or(ReconcileError::MissingMetadata { field: "namespace" })?;
    let name = object
        .meta()
        .name
        .clone()
        .ok_or(ReconcileError::MissingMetadata { field: "name" })?;
    Ok((namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backoff_doubles_until_the_cap_and_resets() {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(service, "default");
        let ctx = Context::new(client, BuildDefaults::default(), Arc::default());
        let delays: Vec<u64> = (0..8).map(|_| ctx.next_backoff("k").as_secs()).collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80, 160, 300, 300]);
        ctx.reset_backoff("k");
        assert_eq!(ctx.next_backoff("k"), BACKOFF_BASE);
        assert_eq!(ctx.next_backoff("other"), BACKOFF_BASE);
    }
}
