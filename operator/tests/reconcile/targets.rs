//! ProfilingTargets: published into their store's agents' targets file, reported when their
//! store is missing, and refused when they carry a reserved label.

use std::time::Duration;

use kiln_operator::controller::{store, target};
use kube::runtime::controller::Action;
use serde_json::json;

use super::{
    STORE_PATH, TARGET_PATH, TARGETS_CM_PATH, condition, current_store, current_target, setup,
    store_json, target_json,
};

#[tokio::test]
async fn targets_pointing_at_the_store_land_in_the_agents_targets_file() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    fake.put("/apis/kiln.dev/v1alpha1/namespaces/shop/profilingtargets/web", json!({
        "apiVersion": "kiln.dev/v1alpha1", "kind": "ProfilingTarget",
        "metadata": {"name": "web", "namespace": "shop", "generation": 1},
        "spec": {"storeRef": {"name": "main", "namespace": "kiln"}, "samplingHz": 49, "requireAnnotation": false}
    }));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let data = fake.get(TARGETS_CM_PATH).unwrap()["data"]["targets.json"]
        .as_str()
        .unwrap()
        .to_owned();
    let file = kiln_targets::TargetsFile::parse(data.as_bytes()).unwrap();
    assert_eq!(file.targets.len(), 1);
    assert_eq!(file.targets[0].source, "shop/web");
    assert_eq!(fake.get(STORE_PATH).unwrap()["status"]["matchedTargets"], 1);
}

#[tokio::test]
async fn target_without_its_store_reports_store_not_found_and_rechecks_soon() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    fake.state.lock().unwrap().objects.remove(STORE_PATH);
    fake.put(
        TARGET_PATH,
        target_json(json!({"storeRef": {"name": "main"}})),
    );
    let action = target::reconcile(current_target(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    let status = &fake.get(TARGET_PATH).unwrap()["status"];
    assert_eq!(status["observedGeneration"], 3);
    assert_eq!(
        condition(&fake.get(TARGET_PATH).unwrap(), "Ready")["reason"],
        "StoreNotFound"
    );
}

#[tokio::test]
async fn target_with_its_store_is_published_and_settles() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    fake.put(
        TARGET_PATH,
        target_json(json!({"storeRef": {"name": "main"}})),
    );
    target::reconcile(current_target(&fake), ctx.clone())
        .await
        .unwrap();
    let object = fake.get(TARGET_PATH).unwrap();
    assert_eq!(condition(&object, "Ready")["status"], "True");
    assert_eq!(condition(&object, "Reconciled")["status"], "True");
    fake.clear_calls();
    target::reconcile(current_target(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(fake.writes().is_empty(), "unchanged target writes nothing");
}

#[tokio::test]
async fn target_with_reserved_label_is_not_reconciled() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    fake.put(
        TARGET_PATH,
        target_json(json!({"storeRef": {"name": "main"}, "labels": {"pod": "spoof"}})),
    );
    target::reconcile(current_target(&fake), ctx.clone())
        .await
        .unwrap();
    let object = fake.get(TARGET_PATH).unwrap();
    assert_eq!(condition(&object, "Reconciled")["reason"], "InvalidSpec");
    assert!(
        condition(&object, "Reconciled")["message"]
            .as_str()
            .unwrap()
            .contains("set by the agent")
    );
    assert_eq!(condition(&object, "Ready")["status"], "False");
}
