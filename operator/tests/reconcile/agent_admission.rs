//! Which stores get agents: one asking for an image or a toleration the operator does not
//! allow gets none, one without agents needs no finalizer, and a second store with agents
//! leaves the nodes to the older one.

use std::time::Duration;

use kiln_operator::controller::{store, target};
use kiln_operator::resources::BuildDefaults;
use kube::runtime::controller::Action;
use serde_json::json;

use super::{
    DS_PATH, STORE_PATH, STS_PATH, TARGET_PATH, condition, current_store, current_target, setup,
    setup_with, store_json, target_json, write_paths,
};

#[tokio::test]
async fn a_store_asking_for_an_image_the_operator_does_not_allow_gets_no_agents() {
    let (fake, ctx) = setup(&store_json(
        json!({"agent": {"image": "docker.io/attacker/rootkit:latest"}}),
        &[],
    ));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let writes = write_paths(&fake);
    assert!(
        !writes.iter().any(|w| w.contains("daemonsets")),
        "no DaemonSet runs the image: {writes:?}"
    );
    assert!(
        writes.iter().any(|w| w.contains("statefulsets")),
        "{writes:?}"
    );
    let status_store = fake.get(STORE_PATH).unwrap();
    assert_eq!(condition(&status_store, "AgentsReady")["status"], "False");
    assert_eq!(
        condition(&status_store, "AgentsReady")["reason"],
        "AgentImageNotAllowed"
    );
}

#[tokio::test]
async fn a_store_asking_to_tolerate_a_taint_the_operator_does_not_allow_gets_no_agents() {
    let defaults = BuildDefaults {
        allowed_agent_tolerations: vec!["gpu".to_owned()],
        ..BuildDefaults::default()
    };
    let spec = json!({"agent": {"tolerations": [
        {"key": "gpu", "operator": "Exists"},
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
    ]}});
    let (fake, ctx) = setup_with(&store_json(spec, &[]), defaults);
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let writes = write_paths(&fake);
    assert!(
        !writes.iter().any(|w| w.contains("daemonsets")),
        "no DaemonSet tolerates the taint: {writes:?}"
    );
    assert!(fake.get(STS_PATH).is_some(), "the store itself still runs");
    let status_store = fake.get(STORE_PATH).unwrap();
    let agents_ready = condition(&status_store, "AgentsReady");
    assert_eq!(agents_ready["status"], "False");
    assert_eq!(agents_ready["reason"], "AgentTolerationNotAllowed");
    assert!(
        agents_ready["message"]
            .as_str()
            .unwrap()
            .contains("node-role.kubernetes.io/control-plane"),
        "{agents_ready}"
    );

    // Dropping the refused toleration starts the agents with what is left.
    let mut edited = fake.get(STORE_PATH).unwrap();
    edited["spec"]["agent"]["tolerations"] = json!([{"key": "gpu", "operator": "Exists"}]);
    fake.put(STORE_PATH, edited);
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let tolerations =
        &fake.get(DS_PATH).expect("DaemonSet applied")["spec"]["template"]["spec"]["tolerations"];
    assert_eq!(tolerations, &json!([{"key": "gpu", "operator": "Exists"}]));
}

#[tokio::test]
async fn store_without_agents_needs_no_finalizer_and_removes_agent_objects() {
    let (fake, ctx) = setup(&store_json(json!({"agent": {"enabled": false}}), &[]));
    fake.put(DS_PATH, json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "main-agent", "namespace": "kiln"}}));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let writes = write_paths(&fake);
    assert!(writes.contains(&format!("DELETE {DS_PATH}")), "{writes:?}");
    assert!(
        !writes
            .iter()
            .any(|w| w.contains("daemonsets") && w.starts_with("PATCH"))
    );
    assert_eq!(
        fake.get(STORE_PATH).unwrap()["metadata"]["finalizers"],
        json!([])
    );
    assert_eq!(
        condition(&fake.get(STORE_PATH).unwrap(), "AgentsReady")["reason"],
        "AgentsDisabled"
    );
}

#[tokio::test]
async fn second_store_with_agents_leaves_the_nodes_to_the_older_one() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    let mut older = store_json(json!({}), &["kiln.dev/agent-rbac"]);
    older["metadata"]["name"] = json!("first");
    older["metadata"]["namespace"] = json!("team-a");
    older["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    fake.put(
        "/apis/kiln.dev/v1alpha1/namespaces/team-a/profilestores/first",
        older,
    );

    let action = store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
    let writes = write_paths(&fake);
    assert!(
        !writes
            .iter()
            .any(|w| w.contains("daemonsets") || w.contains("clusterrolebindings")),
        "{writes:?}"
    );
    assert!(fake.get(STS_PATH).is_some(), "the store itself still runs");
    let status_store = fake.get(STORE_PATH).unwrap();
    assert_eq!(
        condition(&status_store, "AgentsReady")["reason"],
        "AgentsOwnedByOtherStore"
    );
    assert!(
        condition(&status_store, "AgentsReady")["message"]
            .as_str()
            .unwrap()
            .contains("team-a/first")
    );

    // A target pointing at the agent-less store says so.
    fake.put(
        TARGET_PATH,
        target_json(json!({"storeRef": {"name": "main"}})),
    );
    target::reconcile(current_target(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        condition(&fake.get(TARGET_PATH).unwrap(), "Ready")["reason"],
        "AgentsOwnedByOtherStore"
    );
}
