//! Reconcile scenarios against an in-memory API server (tower-test), in the spirit of kube-rs'
//! controller-rs: create, update, no-op, status patch, finalizer add and cleanup, error backoff.

mod agent_admission;
mod agent_nudge;
mod budgets;
mod cluster_bindings;
mod fake_api;
mod namespace_deletion;
mod network_policy;
mod pod_relay;
mod recording_rules;
mod targets;
mod tokens;

use std::sync::Arc;
use std::time::Duration;

use fake_api::FakeApi;
use http::Method;
use kiln_operator::api::{ProfileStore, ProfilingTarget};
use kiln_operator::controller::{self, Context, store};
use kiln_operator::metrics::Metrics;
use kiln_operator::resources::BuildDefaults;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

const STORE_PATH: &str = "/apis/kiln.dev/v1alpha1/namespaces/kiln/profilestores/main";
const STS_PATH: &str = "/apis/apps/v1/namespaces/kiln/statefulsets/main";
const DS_PATH: &str = "/apis/apps/v1/namespaces/kiln/daemonsets/main-agent";
const TARGETS_CM_PATH: &str = "/api/v1/namespaces/kiln/configmaps/main-targets";
const CRB_PATH: &str =
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/kiln-agent-kiln-main";

fn store_json(spec: Value, finalizers: &[&str]) -> Value {
    json!({
        "apiVersion": "kiln.dev/v1alpha1",
        "kind": "ProfileStore",
        "metadata": {"name": "main", "namespace": "kiln", "uid": "uid-main", "generation": 1,
                     "finalizers": finalizers},
        "spec": spec,
    })
}

fn setup(store: &Value) -> (FakeApi, Arc<Context>) {
    setup_with(store, BuildDefaults::default())
}

fn setup_with(store: &Value, defaults: BuildDefaults) -> (FakeApi, Arc<Context>) {
    let (fake, client) = FakeApi::start();
    fake.put(STORE_PATH, store.clone());
    let ctx = Context::new(client, defaults, Arc::new(Metrics::default()));
    (fake, Arc::new(ctx))
}

fn current_store(fake: &FakeApi) -> Arc<ProfileStore> {
    Arc::new(
        serde_json::from_value(fake.get(STORE_PATH).expect("store exists")).expect("store parses"),
    )
}

fn write_paths(fake: &FakeApi) -> Vec<String> {
    fake.writes()
        .into_iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect()
}

fn condition<'a>(store: &'a Value, type_: &str) -> &'a Value {
    store["status"]["conditions"]
        .as_array()
        .and_then(|list| list.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

fn targets_file(fake: &FakeApi) -> kiln_targets::TargetsFile {
    let text = fake.get(TARGETS_CM_PATH).expect("targets ConfigMap")["data"]["targets.json"]
        .as_str()
        .expect("targets.json is a string")
        .to_owned();
    kiln_targets::TargetsFile::parse(text.as_bytes()).expect("agents can parse it")
}

/// The agent binding of store kiln/main as the first release created it, labelled for
/// `store` in `namespace`.
fn first_release_binding(namespace: &str, store: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": "kiln-agent-kiln-main", "uid": "uid-crb", "labels": {
               "app.kubernetes.io/name": "kiln-agent",
               "app.kubernetes.io/instance": store,
               "app.kubernetes.io/component": "agent",
               "app.kubernetes.io/managed-by": "kiln-operator",
               "kiln.dev/store": store,
               "kiln.dev/store-namespace": namespace}},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kiln-agent"}})
}

#[tokio::test]
async fn new_store_creates_every_child_with_one_field_manager_and_reports_status() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    let action = store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(controller::RESYNC));

    let patched: Vec<String> = fake
        .writes()
        .into_iter()
        .filter(|c| c.method == Method::PATCH && !c.path.ends_with("/status"))
        .map(|c| {
            assert!(
                c.query.contains("fieldManager=kiln-operator"),
                "{}",
                c.query
            );
            assert!(c.query.contains("force=true"), "{}", c.query);
            c.path
        })
        .collect();
    assert_eq!(
        patched,
        vec![
            "/api/v1/namespaces/kiln/configmaps/main-config",
            "/api/v1/namespaces/kiln/services/main-headless",
            "/api/v1/namespaces/kiln/services/main",
            STS_PATH,
            TARGETS_CM_PATH,
            "/api/v1/namespaces/kiln/serviceaccounts/main-agent",
            DS_PATH,
        ]
    );
    let sts = fake.get(STS_PATH).unwrap();
    assert_eq!(sts["metadata"]["ownerReferences"][0]["uid"], "uid-main");
    // Agents never call the API server: no binding, no finalizer to remove one.
    assert!(fake.get(CRB_PATH).is_none());
    assert!(
        !fake.get(STORE_PATH).unwrap()["metadata"]["finalizers"]
            .to_string()
            .contains("agent-rbac")
    );

    let status_store = fake.get(STORE_PATH).unwrap();
    assert_eq!(status_store["status"]["observedGeneration"], 1);
    assert_eq!(status_store["status"]["endpoint"], "main.kiln.svc:7470");
    assert_eq!(condition(&status_store, "Reconciled")["status"], "True");
    assert_eq!(condition(&status_store, "Available")["status"], "False");
    assert_eq!(
        condition(&status_store, "Available")["reason"],
        "NoReplicasReady"
    );
    let events = fake
        .writes()
        .into_iter()
        .filter(|c| c.method == Method::POST && c.path.contains("/events"))
        .count();
    assert_eq!(
        condition(&status_store, "RecordingRulesValid")["status"],
        "True"
    );
    assert_eq!(
        events, 5,
        "one event per new condition and one for the generated tokens"
    );
}

#[tokio::test]
async fn second_reconcile_with_unchanged_inputs_writes_nothing() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let writes_after_first = ctx.metrics.total_writes();
    fake.clear_calls();

    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(fake.calls().len() >= 8, "children were read back");
    assert_eq!(write_paths(&fake), Vec::<String>::new());
    assert_eq!(ctx.metrics.total_writes(), writes_after_first);
}

#[tokio::test]
async fn changed_retention_rewrites_only_the_stateful_set() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let mut edited = fake.get(STORE_PATH).unwrap();
    edited["spec"]["retention"] = json!({"duration": "30d"});
    edited["metadata"]["generation"] = json!(2);
    fake.put(STORE_PATH, edited);
    fake.clear_calls();

    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let writes = write_paths(&fake);
    assert_eq!(
        writes,
        vec![
            format!("PATCH {STS_PATH}"),
            format!("PATCH {STORE_PATH}/status"),
        ],
        "only the StatefulSet and observedGeneration change"
    );
    let args = &fake.get(STS_PATH).unwrap()["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array().unwrap().contains(&json!("--retention=30d")),
        "{args}"
    );
    assert_eq!(
        fake.get(STORE_PATH).unwrap()["status"]["observedGeneration"],
        2
    );
}

#[tokio::test]
async fn ready_replicas_flip_available_with_a_status_patch_and_an_event() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let mut sts = fake.get(STS_PATH).unwrap();
    sts["status"] = json!({"replicas": 1, "readyReplicas": 1});
    fake.put(STS_PATH, sts);
    let mut ds = fake.get(DS_PATH).unwrap();
    ds["status"] = json!({"desiredNumberScheduled": 2, "numberReady": 2, "currentNumberScheduled": 2, "numberMisscheduled": 0});
    fake.put(DS_PATH, ds);
    fake.clear_calls();

    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let writes = write_paths(&fake);
    assert_eq!(writes[0], format!("PATCH {STORE_PATH}/status"));
    assert_eq!(writes.len(), 3, "status patch plus two events: {writes:?}");
    let status_store = fake.get(STORE_PATH).unwrap();
    assert_eq!(status_store["status"]["readyReplicas"], 1);
    assert_eq!(status_store["status"]["agentsReady"], 2);
    assert_eq!(condition(&status_store, "Available")["status"], "True");
    assert_eq!(condition(&status_store, "AgentsReady")["status"], "True");
}

const TARGET_PATH: &str = "/apis/kiln.dev/v1alpha1/namespaces/kiln/profilingtargets/web";

fn target_json(spec: Value) -> Value {
    json!({"apiVersion": "kiln.dev/v1alpha1", "kind": "ProfilingTarget",
           "metadata": {"name": "web", "namespace": "kiln", "generation": 3}, "spec": spec})
}

fn current_target(fake: &FakeApi) -> Arc<ProfilingTarget> {
    Arc::new(
        serde_json::from_value(fake.get(TARGET_PATH).expect("target exists"))
            .expect("target parses"),
    )
}

#[tokio::test]
async fn api_failure_is_reported_in_status_and_backs_off_exponentially() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    fake.fail(Method::PATCH, STS_PATH, 500);
    let store_object = current_store(&fake);
    let error = store::reconcile(store_object.clone(), ctx.clone())
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "ApiError");
    let status_store = fake.get(STORE_PATH).unwrap();
    assert_eq!(condition(&status_store, "Reconciled")["status"], "False");
    assert_eq!(condition(&status_store, "Reconciled")["reason"], "ApiError");
    assert!(
        condition(&status_store, "Reconciled")["message"]
            .as_str()
            .unwrap()
            .contains("apply StatefulSet main")
    );

    let first = controller::error_policy(store_object.clone(), &error, ctx.clone());
    let second = controller::error_policy(store_object.clone(), &error, ctx.clone());
    assert_eq!(first, Action::requeue(Duration::from_secs(5)));
    assert_eq!(second, Action::requeue(Duration::from_secs(10)));
    assert_eq!(ctx.metrics.failures("ProfileStore", "ApiError"), 2);

    // Success resets the backoff.
    fake.state.lock().unwrap().failures.clear();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let after = controller::error_policy(store_object, &error, ctx.clone());
    assert_eq!(after, Action::requeue(Duration::from_secs(5)));
}

/// A targets file the API server refuses (here as over 1 MiB would be, 422) no longer
/// stops the ServiceAccount and DaemonSet from being applied; it is reported and retried.
#[tokio::test]
async fn a_refused_targets_file_still_applies_the_agents_and_is_retried() {
    let (fake, ctx) = setup(&store_json(json!({}), &[]));
    fake.fail(Method::PATCH, TARGETS_CM_PATH, 422);
    let error = store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "TargetsNotApplied");
    let writes = write_paths(&fake);
    for path in [
        TARGETS_CM_PATH,
        "/api/v1/namespaces/kiln/serviceaccounts/main-agent",
        DS_PATH,
    ] {
        assert!(writes.contains(&format!("PATCH {path}")), "{writes:?}");
    }
    assert!(fake.get(DS_PATH).is_some(), "the DaemonSet was applied");
    assert!(fake.get(STS_PATH).is_some(), "the StatefulSet was applied");
    assert!(fake.get(TARGETS_CM_PATH).is_none());

    let status_store = fake.get(STORE_PATH).unwrap();
    let reconciled = condition(&status_store, "Reconciled");
    assert_eq!(reconciled["status"], "False");
    assert_eq!(reconciled["reason"], "TargetsNotApplied");
    assert!(
        reconciled["message"]
            .as_str()
            .unwrap()
            .contains("apply ConfigMap main-targets"),
        "{reconciled}"
    );
    // The rest of the status is still read from the children that were applied.
    assert_eq!(
        condition(&status_store, "AgentsReady")["reason"],
        "AgentsNotReady"
    );
    assert_eq!(
        controller::error_policy(current_store(&fake), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(5)),
        "retried with backoff"
    );
    assert_eq!(ctx.metrics.failures("ProfileStore", "TargetsNotApplied"), 1);

    // Once the API server takes the file again, the retry writes only it and clears the failure.
    fake.state.lock().unwrap().failures.clear();
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        write_paths(&fake)
            .iter()
            .filter(|w| !w.contains("/events") && !w.ends_with("/status"))
            .collect::<Vec<_>>(),
        vec![&format!("PATCH {TARGETS_CM_PATH}")]
    );
    assert!(fake.get(TARGETS_CM_PATH).is_some());
    assert_eq!(
        condition(&fake.get(STORE_PATH).unwrap(), "Reconciled")["status"],
        "True"
    );
}

#[tokio::test]
async fn immutable_stateful_set_change_deletes_with_orphans_and_requeues() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    fake.put(STS_PATH, json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "main", "namespace": "kiln",
        "annotations": {"kiln.dev/applied-hash": "stale"}}}));
    fake.fail(Method::PATCH, STS_PATH, 422);
    let action = store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    let delete = fake
        .writes()
        .into_iter()
        .find(|c| c.method == Method::DELETE && c.path == STS_PATH)
        .expect("StatefulSet deleted");
    assert_eq!(delete.body["propagationPolicy"], "Orphan");
}

#[tokio::test]
async fn paused_store_touches_no_children() {
    let (fake, ctx) = setup(&store_json(
        json!({"paused": true}),
        &["kiln.dev/agent-rbac"],
    ));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(write_paths(&fake)[0], format!("PATCH {STORE_PATH}/status"));
    assert!(
        !write_paths(&fake)
            .iter()
            .any(|w| w.contains("statefulsets"))
    );
    assert_eq!(
        condition(&fake.get(STORE_PATH).unwrap(), "Reconciled")["reason"],
        "Paused"
    );
}

#[tokio::test]
async fn grown_storage_expands_existing_claims_once() {
    let (fake, ctx) = setup(&store_json(
        json!({"storage": {"size": "20Gi"}}),
        &["kiln.dev/agent-rbac"],
    ));
    let claim_path = "/api/v1/namespaces/kiln/persistentvolumeclaims/data-main-0";
    fake.put(
        claim_path,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-main-0", "namespace": "kiln",
                     "labels": {"app.kubernetes.io/instance": "main",
                                "app.kubernetes.io/component": "store"}},
        "spec": {"resources": {"requests": {"storage": "10Gi"}}}}),
    );
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        fake.get(claim_path).unwrap()["spec"]["resources"]["requests"]["storage"],
        "20Gi"
    );
    // The API server may print the new size in other units; that is not a reason to patch again.
    let mut claim = fake.get(claim_path).unwrap();
    claim["spec"]["resources"]["requests"]["storage"] = json!("20480Mi");
    fake.put(claim_path, claim);
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert!(
        !write_paths(&fake)
            .iter()
            .any(|w| w.contains("persistentvolumeclaims")),
        "{:?}",
        write_paths(&fake)
    );
}

#[tokio::test]
async fn hand_edited_workload_is_set_back_on_the_next_reconcile() {
    let (fake, ctx) = setup(&store_json(json!({}), &["kiln.dev/agent-rbac"]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let mut sts = fake.get(STS_PATH).unwrap();
    sts["metadata"]["generation"] = json!(1);
    fake.put(STS_PATH, sts.clone());
    // First look records generation 1 and writes nothing.
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(write_paths(&fake), Vec::<String>::new());

    // Someone edits the image; the API server bumps the generation, the hash annotation stays.
    sts["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:latest");
    sts["metadata"]["generation"] = json!(2);
    fake.put(STS_PATH, sts);
    fake.clear_calls();
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_eq!(write_paths(&fake), vec![format!("PATCH {STS_PATH}")]);
    let image = &fake.get(STS_PATH).unwrap()["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(image, "ghcr.io/kiln-dev/kiln-store:0.1.0");
}
