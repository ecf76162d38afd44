//! Any pod can reach a store's Service, so its reads are open to the whole cluster. The
//! opt-in NetworkPolicy admits this store's agents, its other replicas (which ask each
//! other for unflushed data) and the listed clients to the store's port, and nothing else.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kiln_operator::resources::StoreNames;
use kiln_operator::resources::network_policy::network_policy;
use serde_json::json;

use super::profile_store;

#[test]
fn policy_admits_the_agents_the_replicas_and_the_listed_clients_to_the_store_port() {
    let object = profile_store(json!({"networkPolicy": {"enabled": true, "allowFrom": [
        {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"},
         "podSelector": {"app": "grafana"}},
        {"podSelector": {"app": "uploader"}}
    ]}}));
    let names = StoreNames::of(&object).expect("store has metadata");
    let policy = network_policy(&object, &names).expect("builds");
    assert_eq!(policy.metadata.name.as_deref(), Some("main"));
    assert_eq!(
        policy.metadata.owner_references.expect("owned")[0].uid,
        "uid-1"
    );
    let spec = policy.spec.expect("spec");
    let selected = spec
        .pod_selector
        .and_then(|s| s.match_labels)
        .expect("labels");
    assert_eq!(selected["app.kubernetes.io/component"], "store");
    assert_eq!(selected["app.kubernetes.io/instance"], "main");
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
    let rules = spec.ingress.expect("ingress rules");
    assert_eq!(rules.len(), 1);
    let ports = rules[0].ports.clone().expect("ports");
    assert_eq!(ports[0].port, Some(IntOrString::String("api".to_owned())));
    let from = rules[0].from.clone().expect("peers");
    assert_eq!(from.len(), 4);
    let agents = from[0].pod_selector.clone().and_then(|s| s.match_labels);
    assert_eq!(
        agents.expect("agent labels")["app.kubernetes.io/component"],
        "agent"
    );
    assert!(
        from[0].namespace_selector.is_none(),
        "agents in the store's namespace"
    );
    let replicas = from[1].pod_selector.clone().and_then(|s| s.match_labels);
    assert_eq!(
        replicas.expect("store labels")["app.kubernetes.io/component"],
        "store"
    );
    assert!(
        from[1].namespace_selector.is_none(),
        "replicas of this store"
    );
    let grafana_namespaces = from[2]
        .namespace_selector
        .clone()
        .and_then(|s| s.match_labels);
    assert_eq!(
        grafana_namespaces.expect("namespace labels")["kubernetes.io/metadata.name"],
        "monitoring"
    );
    assert!(from[3].namespace_selector.is_none());
}
