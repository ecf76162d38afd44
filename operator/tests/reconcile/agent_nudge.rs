//! Issue 20: a new targets file reaches running agents at once. The operator marks each agent
//! pod with the file's revision, a pod update on which the kubelet remounts the ConfigMap,
//! instead of leaving it to the kubelet's periodic resync (a minute and more on a real cluster).

use http::Method;
use kiln_operator::controller::agent_nudge::TARGETS_REVISION_ANNOTATION;
use kiln_operator::controller::store;
use serde_json::{Value, json};

use super::{TARGETS_CM_PATH, current_store, setup, store_json};

const PODS: &str = "/api/v1/namespaces/kiln/pods";

fn pod(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "kiln", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    })
}

fn agent_labels() -> Value {
    json!({
        "app.kubernetes.io/name": "kiln-agent",
        "app.kubernetes.io/instance": "main",
        "app.kubernetes.io/component": "agent",
    })
}

#[tokio::test]
async fn a_written_targets_file_marks_only_this_stores_agent_pods_with_its_revision() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    fake.put(
        &format!("{PODS}/main-agent-a"),
        pod("main-agent-a", agent_labels()),
    );
    fake.put(
        &format!("{PODS}/main-agent-b"),
        pod("main-agent-b", agent_labels()),
    );
    let mut other_store = agent_labels();
    other_store["app.kubernetes.io/instance"] = json!("other");
    fake.put(
        &format!("{PODS}/other-agent"),
        pod("other-agent", other_store),
    );
    fake.put(
        &format!("{PODS}/main-0"),
        pod("main-0", json!({"app.kubernetes.io/instance": "main"})),
    );

    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();

    let revision = fake.get(TARGETS_CM_PATH).expect("targets written")["metadata"]["annotations"]
        ["kiln.dev/applied-hash"]
        .as_str()
        .expect("the targets ConfigMap carries its applied hash")
        .to_owned();
    let patched: Vec<String> = fake
        .writes()
        .into_iter()
        .filter(|call| call.method == Method::PATCH && call.path.starts_with(PODS))
        .map(|call| {
            assert_eq!(
                call.body,
                json!({"metadata": {"annotations": {TARGETS_REVISION_ANNOTATION: revision}}}),
                "a merge patch of one annotation: no spec change, so no container restarts"
            );
            call.path
        })
        .collect();
    assert_eq!(
        patched,
        vec![
            format!("{PODS}/main-agent-a"),
            format!("{PODS}/main-agent-b")
        ],
        "the store's agent pods, not another store's agents or the store's own pod"
    );
    for name in ["main-agent-a", "main-agent-b"] {
        let live = fake.get(&format!("{PODS}/{name}")).unwrap();
        assert_eq!(
            live["metadata"]["annotations"][TARGETS_REVISION_ANNOTATION],
            json!(revision)
        );
    }

    // The same file again: no ConfigMap write, so no pod is touched.
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(
        fake.writes()
            .iter()
            .all(|call| !call.path.starts_with(PODS)),
        "unchanged targets mark no pod: {:?}",
        fake.writes()
    );
}

#[tokio::test]
async fn a_refused_pod_patch_is_an_event_and_never_fails_the_reconcile() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    fake.put(
        &format!("{PODS}/main-agent-a"),
        pod("main-agent-a", agent_labels()),
    );
    fake.fail(Method::PATCH, &format!("{PODS}/main-agent-a"), 403);

    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .expect("the agents read the file at the kubelet's next resync anyway");
    let events: Vec<Value> = fake
        .writes()
        .into_iter()
        .filter(|call| call.path.contains("/events"))
        .map(|call| call.body)
        .collect();
    assert!(
        events
            .iter()
            .any(|event| event["reason"] == "AgentTargetsDelayed"),
        "{events:?}"
    );
}
