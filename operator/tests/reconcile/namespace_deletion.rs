//! Issue 16. A finalizer the operator can no longer remove would leave the namespace
//! Terminating forever. These tests delete the operator's own namespace (`kubectl delete namespace`, or
//! `kubectl delete -k config/default`) while a ProfileStore lives there. The fake does what the
//! API server does: the namespace turns Terminating, creates in it are refused, objects without
//! finalizers go at once, the rest get a deletionTimestamp and go with their last finalizer, and
//! the namespace goes once it is empty. The operator may be deleted first, or keep running.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kiln_operator::controller::{Context, store};
use kube::runtime::controller::Action;
use serde_json::json;

use super::fake_api::{FakeApi, namespace_path};
use super::{
    CRB_PATH, STORE_PATH, current_store, first_release_binding, setup, store_json, write_paths,
};

const NAMESPACE: &str = "kiln";
const OPERATOR_PATH: &str = "/apis/apps/v1/namespaces/kiln/deployments/kiln-operator";

/// A first-release store (finalizer and agent binding) in the operator's namespace, next to the
/// operator's Deployment.
fn first_release_install() -> (FakeApi, Arc<Context>) {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    fake.put(
        &namespace_path(NAMESPACE),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE},
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
    );
    fake.put(
        OPERATOR_PATH,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "kiln-operator", "namespace": NAMESPACE}}),
    );
    fake.put(CRB_PATH, first_release_binding(NAMESPACE, "main"));
    (fake, ctx)
}

/// A reconcile that does not return within seconds is the deadlock this file is about.
async fn within_seconds<T>(reconcile: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), reconcile)
        .await
        .expect("the reconcile returned")
}

fn assert_namespace_gone(fake: &FakeApi) {
    assert_eq!(fake.objects_in(NAMESPACE), Vec::<String>::new());
    assert!(
        fake.get(&namespace_path(NAMESPACE)).is_none(),
        "namespace gone"
    );
}

/// `kubectl delete -k config/default` removes the operator with the namespace, so no reconcile
/// runs during the teardown: a store the operator reconciled once holds no finalizer by then.
#[tokio::test]
async fn a_store_the_operator_reconciled_once_goes_with_its_namespace_without_the_operator() {
    let (fake, ctx) = first_release_install();
    within_seconds(store::reconcile(current_store(&fake), ctx.clone()))
        .await
        .unwrap();
    assert!(
        fake.get(CRB_PATH).is_none(),
        "first-release binding retired"
    );
    let reconciled_once = current_store(&fake);
    assert!(
        reconciled_once
            .metadata
            .finalizers
            .iter()
            .flatten()
            .next()
            .is_none()
    );
    assert!(
        fake.objects_in(NAMESPACE).len() > 5,
        "children were created"
    );

    fake.delete_namespace(NAMESPACE);
    assert_namespace_gone(&fake);

    // A reconcile still queued from before (the cached store without a deletionTimestamp)
    // finds its creates refused: it fails fast and leaves nothing behind, no finalizer included.
    fake.clear_calls();
    let late = within_seconds(store::reconcile(reconciled_once.clone(), ctx.clone())).await;
    assert_eq!(late.unwrap_err().reason(), "ApiError");
    assert_namespace_gone(&fake);
    assert!(
        !fake
            .writes()
            .iter()
            .any(|c| c.body.to_string().contains("kiln.dev/agent-rbac")),
        "{:?}",
        write_paths(&fake)
    );

    // The deletion event itself (no finalizer) needs nothing from the operator.
    let mut deleted = (*reconciled_once).clone();
    deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    fake.clear_calls();
    let action = within_seconds(store::reconcile(Arc::new(deleted), ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(write_paths(&fake), Vec::<String>::new());
}

/// A first-release store still carrying its finalizer when the namespace goes: the operator,
/// still running, deletes the binding and lets the store and the namespace go.
#[tokio::test]
async fn a_first_release_store_in_a_terminating_namespace_loses_its_finalizer_and_goes() {
    let (fake, ctx) = first_release_install();
    fake.delete_namespace(NAMESPACE);
    let namespace = fake
        .get(&namespace_path(NAMESPACE))
        .expect("still terminating");
    assert_eq!(namespace["status"]["phase"], "Terminating");
    assert_eq!(fake.objects_in(NAMESPACE), vec![STORE_PATH.to_owned()]);
    let deleting = current_store(&fake);
    assert!(deleting.metadata.deletion_timestamp.is_some());

    let action = within_seconds(store::reconcile(deleting, ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(
        write_paths(&fake),
        vec![format!("DELETE {CRB_PATH}"), format!("PATCH {STORE_PATH}")],
        "no child is created in the terminating namespace"
    );
    assert!(fake.get(CRB_PATH).is_none());
    assert_namespace_gone(&fake);
}

/// The operator's own RBAC may go before its stores (`kubectl delete -k` deletes the ClusterRole
/// too): a binding it is forbidden to read or delete must not hold the namespace forever.
#[tokio::test]
async fn a_store_whose_binding_the_operator_may_no_longer_touch_still_goes() {
    for method in [Method::GET, Method::DELETE] {
        let (fake, ctx) = first_release_install();
        fake.fail(method.clone(), CRB_PATH, 403);
        fake.delete_namespace(NAMESPACE);
        let action = within_seconds(store::reconcile(current_store(&fake), ctx.clone()))
            .await
            .unwrap_or_else(|error| panic!("{method}: {error:?}"));
        assert_eq!(action, Action::await_change());
        assert_namespace_gone(&fake);
    }

    // Any other failure is worth retrying: the finalizer stays until the binding is gone.
    let (fake, ctx) = first_release_install();
    fake.fail(Method::DELETE, CRB_PATH, 500);
    fake.delete_namespace(NAMESPACE);
    let error = within_seconds(store::reconcile(current_store(&fake), ctx.clone()))
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "ApiError");
    assert_eq!(fake.objects_in(NAMESPACE), vec![STORE_PATH.to_owned()]);
}
