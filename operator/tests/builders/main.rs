//! The pure builders: a ProfileStore (and targets) in, Kubernetes objects out.

mod agent_daemon_set;
mod command_lines;
mod network_policy;
mod pprof_port;
mod pull_policy;
mod store_stateful_set;
mod symbolization;
mod tokens;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kiln_operator::api::profiling_target::{MAX_LABEL_NAME_LENGTH, MAX_LABEL_VALUE_LENGTH};
use kiln_operator::api::{
    ProfileStore, ProfileStoreSpec, ProfilingTarget, ProfilingTargetSpec, SecurityMode,
};
use kiln_operator::resources::targets::{aggregate, config_map as targets_config_map};
use kiln_operator::resources::{
    APPLIED_HASH_ANNOTATION, BuildDefaults, CONFIG_HASH_ANNOTATION, StoreNames, agent,
    applied_hash, store,
};

fn profile_store(spec: serde_json::Value) -> ProfileStore {
    let spec: ProfileStoreSpec = serde_json::from_value(spec).expect("valid spec");
    let mut object = ProfileStore::new("main", spec);
    object.metadata.namespace = Some("kiln".to_owned());
    object.metadata.uid = Some("uid-1".to_owned());
    object
}

fn target(namespace: &str, name: &str, spec: serde_json::Value) -> ProfilingTarget {
    let spec: ProfilingTargetSpec = serde_json::from_value(spec).expect("valid spec");
    let mut object = ProfilingTarget::new(name, spec);
    object.metadata.namespace = Some(namespace.to_owned());
    object
}

fn pod_spec_of_daemon_set(object: &ProfileStore) -> PodSpec {
    let names = StoreNames::of(object).expect("store has metadata");
    let set = agent::daemon_set(object, &names, &BuildDefaults::default()).expect("builds");
    set.spec.template.spec.expect("pod spec is always set")
}

fn agent_container(object: &ProfileStore) -> Container {
    pod_spec_of_daemon_set(object).containers.remove(0)
}

#[test]
fn default_spec_fills_documented_defaults() {
    let object = profile_store(serde_json::json!({}));
    assert_eq!(object.spec.replicas, 1);
    assert_eq!(object.spec.retention.duration, "168h");
    assert_eq!(object.spec.storage.size, "10Gi");
    assert_eq!(object.spec.service_port, 7470);
    assert!(object.spec.agent.enabled);
    assert_eq!(object.spec.agent.security_mode, SecurityMode::Privileged);
    assert_eq!(
        object.spec.agent.container_runtime_socket,
        "/run/containerd/containerd.sock"
    );
}

#[test]
fn config_change_changes_the_pod_template_hash_and_applied_hash() {
    let plain = profile_store(serde_json::json!({}));
    let with_bucket = profile_store(serde_json::json!({"objectStorage": {"bucket": "profiles"}}));
    let build = |o: &ProfileStore| {
        let names = StoreNames::of(o).unwrap();
        let config = store::config_map(o, &names).unwrap();
        store::stateful_set(o, &names, &config, &BuildDefaults::default()).unwrap()
    };
    let (a, b) = (build(&plain), build(&with_bucket));
    let pod_hash = |s: &k8s_openapi::api::apps::v1::StatefulSet| {
        s.spec
            .template
            .metadata
            .clone()
            .unwrap()
            .annotations
            .unwrap()[CONFIG_HASH_ANNOTATION]
            .clone()
    };
    assert_ne!(pod_hash(&a), pod_hash(&b));
    assert_ne!(applied_hash(&a), applied_hash(&b));
    assert_eq!(applied_hash(&a), applied_hash(&build(&plain)));
    assert!(
        a.metadata
            .annotations
            .unwrap()
            .contains_key(APPLIED_HASH_ANNOTATION)
    );
}

#[test]
fn targets_are_aggregated_sorted_and_only_for_their_store() {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).unwrap();
    let targets = vec![
        target(
            "shop",
            "web",
            serde_json::json!({
                "storeRef": {"name": "main", "namespace": "kiln"},
                "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["b", "a"]}]},
                "requireAnnotation": false, "samplingHz": 49, "labels": {"team": "shop"}
            }),
        ),
        target(
            "kiln",
            "all",
            serde_json::json!({"storeRef": {"name": "main"}}),
        ),
        target(
            "kiln",
            "other-store",
            serde_json::json!({"storeRef": {"name": "other"}}),
        ),
        target(
            "kiln",
            "paused",
            serde_json::json!({"storeRef": {"name": "main"}, "suspend": true}),
        ),
        target(
            "kiln",
            "bad",
            serde_json::json!({"storeRef": {"name": "main"}, "labels": {"pod": "x"}}),
        ),
    ];
    let aggregation = aggregate(&names, &targets);
    let sources: Vec<&str> = aggregation
        .file
        .targets
        .iter()
        .map(|t| t.source.as_str())
        .collect();
    assert_eq!(sources, vec!["kiln/all", "shop/web"]);
    assert_eq!(aggregation.rejected.len(), 1);
    assert_eq!(aggregation.rejected[0].source, "kiln/bad");
    let web = &aggregation.file.targets[1];
    assert_eq!(web.sampling_hz, 49);
    assert!(!web.require_annotation);
    assert_eq!(web.selector.match_expressions[0].values, vec!["a", "b"]);

    let mut reversed = targets.clone();
    reversed.reverse();
    let again = aggregate(&names, &reversed);
    let render = |a: &kiln_operator::resources::targets::Aggregation| {
        targets_config_map(&object, &names, &a.file).unwrap()
    };
    assert_eq!(render(&aggregation), render(&again));
    let data = render(&aggregation).data.unwrap();
    let parsed = kiln_targets::TargetsFile::parse(data["targets.json"].as_bytes()).unwrap();
    assert_eq!(parsed, aggregation.file);
}

#[test]
fn pprof_scraping_is_relayed_with_its_defaults_and_a_bad_one_is_rejected() {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).unwrap();
    let scraped = target(
        "shop",
        "go",
        serde_json::json!({"storeRef": {"name": "main", "namespace": "kiln"}, "pprof": {"port": 6060}}),
    );
    let mut bad = target(
        "shop",
        "bad",
        serde_json::json!({"storeRef": {"name": "main", "namespace": "kiln"},
            "pprof": {"port": 6060, "pathPrefix": "/debug/../pprof"}}),
    );
    bad.spec.pprof.as_mut().unwrap().timeout_seconds = 30;
    let aggregation = aggregate(&names, &[scraped, bad]);
    assert_eq!(aggregation.rejected.len(), 1);
    assert!(
        aggregation.rejected[0].problem.contains("pprofScrape"),
        "{}",
        aggregation.rejected[0].problem
    );
    let scrape = aggregation.file.targets[0].pprof_scrape.clone().unwrap();
    assert_eq!(scrape.port, kiln_targets::PprofPort::Number(6060));
    assert_eq!(scrape.path_prefix, "/debug/pprof");
    assert_eq!(scrape.profiles, kiln_targets::PprofProfile::ALL.to_vec());
    assert_eq!((scrape.interval_seconds, scrape.timeout_seconds), (15, 10));
}

#[test]
fn unknown_selector_operator_is_rejected_not_dropped() {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).unwrap();
    let mut bad = target(
        "kiln",
        "t",
        serde_json::json!({"storeRef": {"name": "main"}}),
    );
    bad.spec.selector = Some(LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "a".to_owned(),
            operator: "Near".to_owned(),
            values: None,
        }]),
        ..LabelSelector::default()
    });
    let aggregation = aggregate(&names, &[bad]);
    assert!(aggregation.file.targets.is_empty());
    assert!(aggregation.rejected[0].problem.contains("Near"));
}

/// Targets stored before the CRD bounded label lengths are held to the same bounds, so an old
/// target cannot bloat the targets file that every tenant shares.
#[test]
fn labels_past_the_crd_length_bounds_are_rejected_not_published() {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).unwrap();
    let with_label = |name: &str, label: String, value: String| {
        let mut t = target(
            "kiln",
            name,
            serde_json::json!({"storeRef": {"name": "main"}}),
        );
        t.spec.labels = BTreeMap::from([(label, value)]);
        t
    };
    let longest = with_label(
        "longest",
        "n".repeat(MAX_LABEL_NAME_LENGTH),
        "v".repeat(MAX_LABEL_VALUE_LENGTH),
    );
    let long_name = with_label(
        "long-name",
        "n".repeat(MAX_LABEL_NAME_LENGTH + 1),
        "v".to_owned(),
    );
    let long_value = with_label(
        "long-value",
        "team".to_owned(),
        "v".repeat(MAX_LABEL_VALUE_LENGTH + 1),
    );
    let aggregation = aggregate(&names, &[longest, long_name, long_value]);
    let published: Vec<&str> = aggregation
        .file
        .targets
        .iter()
        .map(|t| t.source.as_str())
        .collect();
    assert_eq!(published, vec!["kiln/longest"]);
    let problems: Vec<(&str, &str)> = aggregation
        .rejected
        .iter()
        .map(|r| (r.source.as_str(), r.problem.as_str()))
        .collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].0 == "kiln/long-name" && problems[0].1.contains("longer than 63"));
    assert!(problems[1].0 == "kiln/long-value" && problems[1].1.contains("longer than 256"));
}

#[test]
fn retention_size_quantities_convert_to_bytes() {
    assert_eq!(store::quantity_to_bytes("50Gi"), Some(50 << 30));
    assert_eq!(store::quantity_to_bytes("1.5Ki"), Some(1536));
    assert_eq!(store::quantity_to_bytes("2T"), Some(2_000_000_000_000));
    assert_eq!(store::quantity_to_bytes("123"), Some(123));
    assert_eq!(store::quantity_to_bytes("16Ei"), None, "overflows u64");
    assert_eq!(store::quantity_to_bytes("5Xi"), None);
    assert_eq!(store::quantity_to_bytes(".5Gi"), None);
    assert_eq!(store::quantity_to_bytes("1.2.3Gi"), None);
    assert_eq!(store::quantity_to_bytes(""), None);
}

#[test]
fn services_select_store_pods_by_named_port() {
    let object = profile_store(serde_json::json!({"servicePort": 9000}));
    let names = StoreNames::of(&object).expect("metadata");
    let headless = store::headless_service(&object, &names).expect("builds");
    let headless_spec = headless.spec.expect("spec");
    assert_eq!(headless.metadata.name.as_deref(), Some("main-headless"));
    assert_eq!(headless_spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(headless_spec.ports.expect("ports")[0].port, 7470);
    let client = store::client_service(&object, &names).expect("builds");
    let client_spec = client.spec.expect("spec");
    assert_eq!(client.metadata.name.as_deref(), Some("main"));
    let port = &client_spec.ports.expect("ports")[0];
    assert_eq!(port.port, 9000);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("api".to_owned()))
    );
    let selector = client_spec.selector.expect("selector");
    assert_eq!(selector["app.kubernetes.io/component"], "store");
    assert_eq!(selector["app.kubernetes.io/instance"], "main");
}

#[test]
fn agent_service_account_is_owned_by_the_store() {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).expect("metadata");
    let account = agent::service_account(&object, &names).expect("builds");
    assert_eq!(account.metadata.name.as_deref(), Some("main-agent"));
    assert_eq!(account.metadata.namespace.as_deref(), Some("kiln"));
    assert_eq!(
        account.metadata.owner_references.expect("owned")[0].uid,
        "uid-1"
    );
}

#[test]
fn store_without_metadata_is_a_build_error_not_a_panic() {
    let spec: ProfileStoreSpec = serde_json::from_value(serde_json::json!({})).expect("spec");
    let mut object = ProfileStore::new("main", spec);
    object.metadata.namespace = None;
    let error = StoreNames::of(&object).expect_err("no namespace");
    assert_eq!(error.reason(), "missing_metadata");
}

#[test]
fn only_the_operators_agent_images_are_allowed() {
    let defaults = BuildDefaults {
        allowed_agent_images: vec![
            "registry.example/kiln-agent:0.2.0".to_owned(),
            "mirror.example/kiln/*".to_owned(),
        ],
        ..BuildDefaults::default()
    };
    assert!(defaults.agent_image_allowed(&BuildDefaults::default().agent_image));
    assert!(defaults.agent_image_allowed("registry.example/kiln-agent:0.2.0"));
    assert!(defaults.agent_image_allowed("mirror.example/kiln/kiln-agent:0.1.0"));
    assert!(!defaults.agent_image_allowed("registry.example/kiln-agent:0.2.0-evil"));
    assert!(!defaults.agent_image_allowed("docker.io/attacker/rootkit:latest"));
    assert!(!BuildDefaults::default().agent_image_allowed("mirror.example/kiln/kiln-agent:0.1.0"));
}

#[test]
fn agents_tolerate_only_the_taints_the_operator_allows() {
    let toleration = |key: Option<&str>| Toleration {
        key: key.map(str::to_owned),
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    };
    let narrowed = BuildDefaults {
        allowed_agent_tolerations: vec!["gpu".to_owned(), "dedicated".to_owned()],
        ..BuildDefaults::default()
    };
    // A store that sets none tolerates exactly the allowed keys: no control-plane nodes here.
    assert_eq!(
        narrowed.default_agent_tolerations(),
        vec![toleration(Some("gpu")), toleration(Some("dedicated"))]
    );
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).expect("store has metadata");
    let set = agent::daemon_set(&object, &names, &narrowed).expect("builds");
    assert_eq!(
        set.spec.template.spec.expect("pod spec").tolerations,
        Some(narrowed.default_agent_tolerations())
    );

    let gpu = [toleration(Some("gpu"))];
    assert_eq!(narrowed.refused_toleration(&gpu), None);
    let control_plane = [
        toleration(Some("gpu")),
        toleration(Some("node-role.kubernetes.io/control-plane")),
    ];
    assert_eq!(
        narrowed.refused_toleration(&control_plane),
        Some(&control_plane[1])
    );
    let everything = [toleration(None)];
    assert_eq!(
        narrowed.refused_toleration(&everything),
        Some(&everything[0]),
        "an empty key tolerates every taint"
    );

    // The default allows any taint, as before the allow-list existed.
    let defaults = BuildDefaults::default();
    assert_eq!(defaults.default_agent_tolerations(), vec![toleration(None)]);
    assert_eq!(defaults.refused_toleration(&everything), None);
    assert_eq!(defaults.refused_toleration(&control_plane), None);
    let none_allowed = BuildDefaults {
        allowed_agent_tolerations: Vec::new(),
        ..BuildDefaults::default()
    };
    assert_eq!(none_allowed.default_agent_tolerations(), Vec::new());
    assert_eq!(none_allowed.refused_toleration(&gpu), Some(&gpu[0]));
}
