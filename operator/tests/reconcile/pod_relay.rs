//! Pods annotated after they started are relayed into the targets file until the annotation
//! goes, and a store without agents never lists pods.

use kiln_operator::controller::store;
use serde_json::{Value, json};

use super::{
    STORE_PATH, TARGETS_CM_PATH, current_store, setup, store_json, targets_file, write_paths,
};

const POD_PATH: &str = "/api/v1/namespaces/shop/pods/cart";

fn running_pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cart", "namespace": "shop", "uid": "uid-cart",
                     "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "cart"}]},
        "status": {"phase": "Running"},
    })
}

#[tokio::test]
async fn pod_annotated_after_start_is_relayed_until_unannotated() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    fake.put(
        POD_PATH,
        running_pod(json!({"profiles.kiln.dev/enabled": "true",
                           "profiles.kiln.dev/service-name": "cart-svc"})),
    );
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let pod_list = fake
        .calls()
        .into_iter()
        .find(|c| c.path == "/api/v1/pods")
        .expect("pods were listed cluster-wide");
    assert!(
        pod_list
            .query
            .contains("fieldSelector=status.phase%3DRunning"),
        "{}",
        pod_list.query
    );

    let file = targets_file(&fake);
    assert_eq!(file.targets.len(), 1, "{file:?}");
    let relay = &file.targets[0];
    assert_eq!(relay.source, "shop/pods/cart");
    assert_eq!(
        relay.selector.match_labels.get("io.kubernetes.pod.uid"),
        Some(&"uid-cart".to_owned())
    );
    // The agent, seeing only the sandbox (no annotations, kubelet's labels), now profiles it.
    let sandbox_labels = std::collections::BTreeMap::from([
        ("io.kubernetes.pod.uid".to_owned(), "uid-cart".to_owned()),
        ("io.kubernetes.pod.name".to_owned(), "cart".to_owned()),
    ]);
    let no_annotations = std::collections::BTreeMap::new();
    let view = kiln_targets::PodView {
        namespace: "shop",
        labels: &sandbox_labels,
        annotations: &no_annotations,
        container: "app",
    };
    match file.decide(&view) {
        kiln_targets::Decision::Profile(plan) => assert_eq!(
            plan.labels.get("service_name").map(String::as_str),
            Some("cart-svc")
        ),
        other => panic!("relayed pod not profiled: {other:?}"),
    }
    assert!(ctx.relayed_pods.lock().unwrap().contains("shop/cart"));
    let status_store = fake.get(STORE_PATH).unwrap();
    assert_eq!(
        status_store["status"]["matchedTargets"], 0,
        "relays are not ProfilingTargets"
    );

    // Nothing changed: no writes at all.
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(write_paths(&fake), Vec::<String>::new());

    // `kubectl annotate pod cart profiles.kiln.dev/enabled-`: the relay goes, in one write.
    fake.put(POD_PATH, running_pod(json!({})));
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(write_paths(&fake), vec![format!("PATCH {TARGETS_CM_PATH}")]);
    assert!(targets_file(&fake).targets.is_empty());
    assert!(ctx.relayed_pods.lock().unwrap().is_empty());
}

#[tokio::test]
async fn store_without_agents_does_not_list_pods() {
    let (fake, ctx) = setup(&store_json(json!({"agent": {"enabled": false}}), &[]));
    fake.put(
        POD_PATH,
        running_pod(json!({"profiles.kiln.dev/enabled": "true"})),
    );
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(
        fake.calls().iter().all(|c| c.path != "/api/v1/pods"),
        "only the agent-owning store relays pods"
    );
    assert!(fake.get(TARGETS_CM_PATH).is_none());
}
