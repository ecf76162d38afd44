//! Issue 16. All tenants share one targets file, so one tenant could break it for everyone.
//! Its annotated pods can neither push another tenant's pods out of the agents' targets file
//! nor make that file too big to write, and the store's status says whose pods were left out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kiln_operator::controller::store;
use kiln_operator::resources::targets::{MAX_RELAYED_PODS_PER_NAMESPACE, MAX_TARGETS_FILE_BYTES};
use serde_json::{Value, json};

use super::fake_api::FakeApi;
use super::{
    DS_PATH, STORE_PATH, TARGETS_CM_PATH, condition, current_store, setup, store_json,
    targets_file, write_paths,
};

fn pod_path(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{name}")
}

/// Stores a running pod opted in with `annotations` (plus `enabled: "true"`).
fn put_annotated_pod(fake: &FakeApi, namespace: &str, name: &str, annotations: &Value) {
    let mut all = json!({"profiles.kiln.dev/enabled": "true"});
    for (key, value) in annotations.as_object().into_iter().flatten() {
        all[key] = value.clone();
    }
    fake.put(
        &pod_path(namespace, name),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace,
                            "uid": format!("uid-{namespace}-{name}"), "annotations": all},
               "spec": {"containers": [{"name": "app", "image": "app"}]},
               "status": {"phase": "Running"}}),
    );
}

/// The targets file as the ConfigMap carries it, in bytes.
fn targets_json_len(fake: &FakeApi) -> usize {
    fake.get(TARGETS_CM_PATH).expect("targets ConfigMap")["data"]["targets.json"]
        .as_str()
        .expect("targets.json is a string")
        .len()
}

/// Whether an agent seeing only the pod's sandbox (kubelet's UID label, no annotations) would
/// profile it from the targets file.
fn agent_profiles(fake: &FakeApi, namespace: &str, name: &str) -> bool {
    let labels = BTreeMap::from([(
        "io.kubernetes.pod.uid".to_owned(),
        format!("uid-{namespace}-{name}"),
    )]);
    let no_annotations = BTreeMap::new();
    let view = kiln_targets::PodView {
        namespace,
        labels: &labels,
        annotations: &no_annotations,
        container: "app",
    };
    matches!(
        targets_file(fake).decide(&view),
        kiln_targets::Decision::Profile(_)
    )
}

#[tokio::test]
async fn three_thousand_annotated_pods_in_one_namespace_leave_ten_in_another_profiled() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    // Each busy pod relays as much as a pod may (just under the annotation budget), so it is the
    // per-namespace budget, not small entries, that keeps the file under its cap.
    let bulky = json!({"profiles.kiln.dev/service-name": "b".repeat(900)});
    for i in 0..3000 {
        put_annotated_pod(&fake, "aaa-busy", &format!("p{i:04}"), &bulky);
    }
    for i in 0..10 {
        let service = json!({"profiles.kiln.dev/service-name": format!("small-{i}")});
        put_annotated_pod(&fake, "zzz-small", &format!("p{i:02}"), &service);
    }
    let started = Instant::now();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a fast scenario"
    );

    let file = targets_file(&fake);
    let from = |namespace: &str| {
        file.targets
            .iter()
            .filter(|t| t.namespace == namespace)
            .count()
    };
    assert_eq!(
        from("zzz-small"),
        10,
        "every small-namespace pod is relayed"
    );
    assert_eq!(from("aaa-busy"), MAX_RELAYED_PODS_PER_NAMESPACE);
    for i in 0..10 {
        assert!(agent_profiles(&fake, "zzz-small", &format!("p{i:02}")));
    }
    let size = targets_json_len(&fake);
    assert!(size <= MAX_TARGETS_FILE_BYTES, "{size} bytes");
    assert!(fake.get(DS_PATH).is_some(), "the agents were applied");

    let status_store = fake.get(STORE_PATH).unwrap();
    let reconciled = condition(&status_store, "Reconciled");
    assert_eq!(reconciled["status"], "True");
    assert_eq!(reconciled["reason"], store::ANNOTATED_PODS_LEFT_OUT);
    let message = reconciled["message"].as_str().unwrap();
    let left_out = 3000 - MAX_RELAYED_PODS_PER_NAMESPACE;
    assert!(
        message.contains(&format!("targets file: {left_out} ")),
        "{message}"
    );
    assert!(
        message.ends_with(&format!("aaa-busy {left_out}")),
        "{message}"
    );
    assert!(!message.contains("zzz-small"), "{message}");

    // Nothing changed, so nothing is written: the note is stable between reconciles.
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(write_paths(&fake), Vec::<String>::new());
}

#[tokio::test]
async fn a_pod_with_a_250_kib_annotation_is_left_out_and_the_others_are_not() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    for i in 0..3 {
        put_annotated_pod(&fake, "shop", &format!("p{i}"), &json!({}));
    }
    let huge = json!({"profiles.kiln.dev/service-name": "x".repeat(250 * 1024)});
    put_annotated_pod(&fake, "shop", "greedy", &huge);
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();

    let sources: Vec<String> = targets_file(&fake)
        .targets
        .iter()
        .map(|t| t.source.clone())
        .collect();
    assert_eq!(sources, ["shop/pods/p0", "shop/pods/p1", "shop/pods/p2"]);
    assert!(!agent_profiles(&fake, "shop", "greedy"));
    assert!(agent_profiles(&fake, "shop", "p1"));
    let size = targets_json_len(&fake);
    assert!(size < 4096, "the targets file stays small: {size} bytes");

    let status_store = fake.get(STORE_PATH).unwrap();
    let reconciled = condition(&status_store, "Reconciled");
    assert_eq!(reconciled["status"], "True", "{reconciled}");
    assert_eq!(reconciled["reason"], store::ANNOTATED_PODS_LEFT_OUT);
    let message = reconciled["message"].as_str().unwrap();
    assert!(message.contains("targets file: 1 "), "{message}");
    assert!(message.ends_with("shop 1"), "{message}");
    assert!(
        status_store.to_string().len() < 8192,
        "the annotation does not reach the store object either"
    );
}
