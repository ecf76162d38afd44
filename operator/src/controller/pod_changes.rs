//! Which pod events are worth a store reconcile. Every reconcile LISTs all ProfilingTargets,
//! ProfileStores and running pods, so an event that changes nothing the reconcile reads from a
//! pod (status churn, probes, labels, a node assignment) must not trigger one: a busy pod
//! would otherwise turn its status updates into cluster-wide LISTs on the API server.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::resources::targets;

/// Hash of what the store reconcile reads from a pod: its UID (what a relay entry selects),
/// whether it is Running (the pod LIST's field selector), whether it is being deleted, and its
/// `profiles.kiln.dev/*` annotations (what a relay entry carries). Labels and the node are not
/// read: agents match `ProfilingTarget` selectors against the sandbox labels themselves.
pub fn read_by_kiln(pod: &Pod) -> u64 {
    let mut hasher = DefaultHasher::new();
    pod.metadata.uid.hash(&mut hasher);
    let running = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        == Some("Running");
    running.hash(&mut hasher);
    pod.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    for annotation in pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(key, _)| key.starts_with(kiln_targets::ANNOTATION_PREFIX))
    {
        annotation.hash(&mut hasher);
    }
    hasher.finish()
}

/// What the pod watch last saw of each opted-in pod, as [`read_by_kiln`]. Holds only pods that
/// currently opt in: a pod leaves when it opts out or starts being deleted (the API server sets
/// `deletionTimestamp` before removing any pod), so the map stays as small as the relay set.
#[derive(Debug, Default)]
pub struct PodChanges {
    seen: Mutex<HashMap<String, u64>>,
}

impl PodChanges {
    /// True when this event on `pod` may change the agents' targets file: an opted-in pod first
    /// seen or changed in what Kiln reads, or a pod that was relayed and no longer opts in.
    /// `was_relayed` says whether the last reconcile relayed it.
    pub fn needs_reconcile(&self, pod: &Pod, was_relayed: bool) -> bool {
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        // A poisoned map only costs the filtering: reconcile as if nothing were known.
        let Ok(mut seen) = self.seen.lock() else {
            return was_relayed || targets::wants_relay(&pod.metadata);
        };
        if !targets::wants_relay(&pod.metadata) {
            seen.remove(&key);
            return was_relayed;
        }
        let hash = read_by_kiln(pod);
        seen.insert(key, hash) != Some(hash)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    fn pod(annotations: &[(&str, &str)], phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("cart".to_owned()),
                namespace: Some("shop".to_owned()),
                uid: Some("uid-1".to_owned()),
                resource_version: Some("1".to_owned()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                ..PodStatus::default()
            }),
        }
    }

    const ON: (&str, &str) = ("profiles.kiln.dev/enabled", "true");

    #[test]
    fn only_changes_to_what_kiln_reads_trigger_a_reconcile() {
        let changes = PodChanges::default();
        let mut cart = pod(&[ON], "Running");
        assert!(changes.needs_reconcile(&cart, false), "first sighting");
        assert!(!changes.needs_reconcile(&cart, true), "a relist");

        // Status churn, labels, node, other annotations: nothing Kiln reads.
        cart.metadata.resource_version = Some("2".to_owned());
        cart.metadata.labels = Some(BTreeMap::from([("version".to_owned(), "2".to_owned())]));
        if let Some(annotations) = cart.metadata.annotations.as_mut() {
            annotations.insert(
                "deployment.kubernetes.io/revision".to_owned(),
                "7".to_owned(),
            );
        }
        if let Some(spec) = cart.spec.as_mut() {
            spec.node_name = Some("node-a".to_owned());
        }
        if let Some(status) = cart.status.as_mut() {
            status.pod_ip = Some("10.0.0.7".to_owned());
            status.message = Some("probe ok".to_owned());
        }
        assert!(!changes.needs_reconcile(&cart, true));

        // A Kiln annotation, the phase and the UID are read.
        if let Some(annotations) = cart.metadata.annotations.as_mut() {
            annotations.insert(
                "profiles.kiln.dev/service-name".to_owned(),
                "cart".to_owned(),
            );
        }
        assert!(changes.needs_reconcile(&cart, true));
        if let Some(status) = cart.status.as_mut() {
            status.phase = Some("Succeeded".to_owned());
        }
        assert!(changes.needs_reconcile(&cart, true));
        let mut recreated = pod(&[ON], "Running");
        recreated.metadata.uid = Some("uid-2".to_owned());
        assert!(changes.needs_reconcile(&recreated, true));
    }

    #[test]
    fn opting_out_or_deletion_triggers_once_and_forgets_the_pod() {
        let changes = PodChanges::default();
        let cart = pod(&[ON], "Running");
        assert!(changes.needs_reconcile(&cart, false));

        let mut deleting = cart.clone();
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(changes.needs_reconcile(&deleting, true), "the relay goes");
        assert!(
            !changes.needs_reconcile(&deleting, false),
            "once the relay is gone, the rest of the deletion changes nothing"
        );
        assert!(
            changes
                .seen
                .lock()
                .map(|seen| seen.is_empty())
                .unwrap_or(false)
        );

        assert!(changes.needs_reconcile(&cart, false));
        let opted_out = pod(&[], "Running");
        assert!(changes.needs_reconcile(&opted_out, true), "the relay goes");
        assert!(!changes.needs_reconcile(&opted_out, false));
    }

    #[test]
    fn pods_that_never_opt_in_never_trigger_and_are_not_remembered() {
        let changes = PodChanges::default();
        let plain = pod(&[("profiles.kiln.dev/enabled", "false")], "Running");
        assert!(!changes.needs_reconcile(&plain, false));
        assert!(
            changes
                .seen
                .lock()
                .map(|seen| seen.is_empty())
                .unwrap_or(false)
        );
    }
}
