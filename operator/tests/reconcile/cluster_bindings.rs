//! The agents' ClusterRoleBinding of a store: a binding left by the first release is
//! deleted before the store's finalizer goes, one Kiln did not make is kept, and deleting a
//! store removes its binding, or finds it gone already.

use kiln_operator::controller::store;
use kube::runtime::controller::Action;
use serde_json::json;

use super::{
    CRB_PATH, STORE_PATH, current_store, first_release_binding, setup, store_json, write_paths,
};

#[tokio::test]
async fn a_binding_left_by_the_first_release_is_deleted_then_its_finalizer() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    fake.put(CRB_PATH, first_release_binding("kiln", "main"));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let writes = write_paths(&fake);
    let deleted = writes
        .iter()
        .position(|w| *w == format!("DELETE {CRB_PATH}"))
        .unwrap_or_else(|| panic!("binding deleted: {writes:?}"));
    let released = writes
        .iter()
        .rposition(|w| *w == format!("PATCH {STORE_PATH}"))
        .unwrap_or_else(|| panic!("finalizer removed: {writes:?}"));
    assert!(deleted < released, "binding first: {writes:?}");
    assert!(
        !writes
            .iter()
            .any(|w| w.starts_with("PATCH") && w.contains("clusterrolebindings")),
        "{writes:?}"
    );
    assert!(fake.get(CRB_PATH).is_none());
    assert_eq!(
        fake.get(STORE_PATH).unwrap()["metadata"]["finalizers"],
        json!([])
    );

    // Without the finalizer the store has no binding to look for.
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(
        fake.calls()
            .iter()
            .all(|c| !c.path.contains("clusterrolebindings")),
        "{:?}",
        write_paths(&fake)
    );
}

/// `kiln-agent-{namespace}-{name}` is not proof of ownership: a binding of that name whose
/// labels do not name this store is someone else's and stays, live or on deletion; the store's
/// finalizer goes anyway, as there is no binding of its own left to guard.
#[tokio::test]
async fn a_binding_kiln_did_not_make_for_the_store_is_kept_but_the_finalizer_goes() {
    let unlabelled = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "kiln-agent-kiln-main", "labels": {"team": "platform"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}});
    let other_store = first_release_binding("kiln-main", "other");
    for (binding, deleting) in [
        (unlabelled.clone(), false),
        (other_store.clone(), false),
        (unlabelled, true),
        (other_store, true),
    ] {
        let mut store = store_json(json!({}), &["kiln.dev/agent-rbac"]);
        if deleting {
            store["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        let (fake, ctx) = setup(&store);
        fake.put(CRB_PATH, binding.clone());
        store::reconcile(current_store(&fake), ctx.clone())
            .await
            .unwrap();
        let writes = write_paths(&fake);
        assert!(
            !writes.iter().any(|w| w.contains("clusterrolebindings")),
            "deleting={deleting} {writes:?}"
        );
        assert_eq!(fake.get(CRB_PATH), Some(binding));
        assert_eq!(
            fake.get(STORE_PATH).unwrap()["metadata"]["finalizers"],
            json!([]),
            "deleting={deleting}"
        );
    }
}

#[tokio::test]
async fn deleting_a_store_removes_the_cluster_binding_then_the_finalizer() {
    let mut deleting = store_json(json!({}), &["kiln.dev/agent-rbac"]);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let (fake, ctx) = setup(&deleting);
    fake.put(CRB_PATH, first_release_binding("kiln", "main"));
    let action = store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(
        write_paths(&fake),
        vec![format!("DELETE {CRB_PATH}"), format!("PATCH {STORE_PATH}")]
    );
    assert!(fake.get(CRB_PATH).is_none());
    assert_eq!(
        fake.get(STORE_PATH).unwrap()["metadata"]["finalizers"],
        json!([])
    );
}

#[tokio::test]
async fn cleanup_tolerates_an_already_missing_binding() {
    let mut deleting = store_json(json!({}), &["kiln.dev/agent-rbac"]);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let (fake, ctx) = setup(&deleting);
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(write_paths(&fake), vec![format!("PATCH {STORE_PATH}")]);
}
