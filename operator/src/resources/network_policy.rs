//! The store's NetworkPolicy (`spec.networkPolicy.enabled`): ingress to the store's port only
//! from this store's agents, its other replicas and the clients the spec lists, so any other pod in the cluster
//! can neither read every namespace's profiles nor write profiles with spoofed labels.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::store::PORT_NAME;
use super::{BuildError, StoreNames, owned_meta, selector_labels, stamp_applied_hash};
use crate::api::{AllowedPeer, ProfileStore};

/// The policy, named like the store. Only ingress is restricted: the store's own egress (the
/// bucket, DNS) stays open.
pub fn network_policy(
    store: &ProfileStore,
    names: &StoreNames,
) -> Result<NetworkPolicy, BuildError> {
    // The agents live in the store's namespace, so a bare pod selector finds exactly them.
    let agents = NetworkPolicyPeer {
        pod_selector: Some(match_labels(selector_labels(names, "agent"))),
        ..NetworkPolicyPeer::default()
    };
    // Every query at a replica asks the others for their unflushed data.
    let replicas = NetworkPolicyPeer {
        pod_selector: Some(match_labels(selector_labels(names, "store"))),
        ..NetworkPolicyPeer::default()
    };
    let mut from = vec![agents, replicas];
    from.extend(store.spec.network_policy.allow_from.iter().map(peer));
    let policy = NetworkPolicy {
        metadata: owned_meta(store, names, &names.store, "store"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(selector_labels(names, "store"))),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::String(PORT_NAME.to_owned())),
                    protocol: Some("TCP".to_owned()),
                    ..NetworkPolicyPort::default()
                }]),
            }]),
            ..NetworkPolicySpec::default()
        }),
    };
    stamp_applied_hash(policy, "NetworkPolicy")
}

fn peer(allowed: &AllowedPeer) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: allowed.namespace_selector.clone().map(match_labels),
        pod_selector: allowed.pod_selector.clone().map(match_labels),
        ..NetworkPolicyPeer::default()
    }
}

fn match_labels(labels: std::collections::BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    }
}
