//! The pure builders: a ProfileStore (and targets) in, Kubernetes objects out.

mod command_lines;
mod network_policy;
mod pprof_port;
mod pull_policy;
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
fn privileged_mode_runs_privileged_as_root() {
    let object = profile_store(serde_json::json!({}));
    let context = agent_container(&object).security_context.unwrap();
    assert_eq!(context.privileged, Some(true));
    assert_eq!(context.run_as_user, Some(0));
    assert!(context.capabilities.is_none());
}

#[test]
fn capabilities_mode_adds_only_the_ebpf_set_and_drops_the_rest() {
    let object = profile_store(serde_json::json!({"agent": {"securityMode": "capabilities"}}));
    let context = agent_container(&object).security_context.unwrap();
    assert_eq!(context.privileged, Some(false));
    assert_eq!(context.allow_privilege_escalation, Some(false));
    let capabilities = context.capabilities.unwrap();
    assert_eq!(
        capabilities.add.unwrap(),
        vec![
            "BPF",
            "PERFMON",
            "SYS_PTRACE",
            "CHECKPOINT_RESTORE",
            "DAC_READ_SEARCH"
        ]
    );
    assert_eq!(capabilities.drop.unwrap(), vec!["ALL"]);
    assert_eq!(context.seccomp_profile.unwrap().type_, "RuntimeDefault");
}

#[test]
fn agent_uses_host_pid_and_mounts_what_ebpf_needs() {
    let object = profile_store(serde_json::json!({}));
    let pod = pod_spec_of_daemon_set(&object);
    assert_eq!(pod.host_pid, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("main-agent"));
    let volumes: BTreeMap<String, String> = pod
        .volumes
        .unwrap()
        .into_iter()
        .filter_map(|v| Some((v.name, v.host_path?.path)))
        .collect();
    for (name, path) in [
        ("cgroup", "/sys/fs/cgroup"),
        ("cri-socket", "/run/containerd/containerd.sock"),
    ] {
        assert_eq!(volumes.get(name).map(String::as_str), Some(path), "{name}");
    }
    // Unused by the agent, so not granted: each needless mount brings capabilities mode closer
    // to root on the node. Not /lib/modules either: the agent
    // never reads it, and a `Directory` hostPath missing on the node (as on this machine's
    // kernel without modules) keeps every agent pod from starting.
    assert_eq!(volumes.len(), 2, "only these host paths: {volumes:?}");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let container = pod.containers[0].clone();
    let mounts: BTreeMap<String, (String, Option<bool>)> = container
        .volume_mounts
        .unwrap()
        .into_iter()
        .map(|m| (m.name, (m.mount_path, m.read_only)))
        .collect();
    assert_eq!(mounts["cgroup"], ("/sys/fs/cgroup".to_owned(), Some(true)));
    assert_eq!(
        mounts["targets"],
        ("/etc/kiln/targets".to_owned(), Some(true))
    );
    assert!(
        mounts
            .values()
            .filter(|(path, _)| path.starts_with("/sys") || path.starts_with("/lib"))
            .all(|(_, ro)| *ro == Some(true))
    );
    let probe = container.liveness_probe.expect("a liveness probe");
    let get = probe.http_get.expect("over HTTP");
    assert_eq!(get.path.as_deref(), Some("/healthz"));
    let port = &container.ports.expect("ports")[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("metrics"), 7471)
    );
}

#[test]
fn agent_flags_point_at_the_store_socket_and_targets_file() {
    let object = profile_store(serde_json::json!({
        "servicePort": 9000,
        "agent": {"containerRuntimeSocket": "/var/run/crio/crio.sock"}
    }));
    let args = agent_container(&object).args.unwrap();
    assert_eq!(
        args,
        vec![
            "--cri-socket=/var/run/crio/crio.sock",
            "--targets-file=/etc/kiln/targets/targets.json",
            "--store=http://main.kiln.svc:9000",
            "--node-name=$(NODE_NAME)",
            "--metrics-addr=0.0.0.0:7471",
        ]
    );
    let volumes = pod_spec_of_daemon_set(&object).volumes.unwrap();
    let socket = volumes.iter().find(|v| v.name == "cri-socket").unwrap();
    let host_path = socket.host_path.as_ref().unwrap();
    assert_eq!(host_path.path, "/var/run/crio/crio.sock");
    assert_eq!(host_path.type_.as_deref(), Some("Socket"));
}

#[test]
fn agent_tolerates_everything_by_default_and_takes_overrides() {
    let object = profile_store(serde_json::json!({}));
    let pod = pod_spec_of_daemon_set(&object);
    assert_eq!(
        pod.tolerations.unwrap(),
        vec![Toleration {
            operator: Some("Exists".to_owned()),
            ..Toleration::default()
        }]
    );
    assert_eq!(
        pod.node_selector
            .unwrap()
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(pod.priority_class_name, None);

    let custom = profile_store(serde_json::json!({"agent": {
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "apps"},
        "priorityClassName": "system-node-critical"
    }}));
    let pod = pod_spec_of_daemon_set(&custom);
    let tolerations = pod.tolerations.unwrap();
    assert_eq!(tolerations.len(), 1);
    assert_eq!(tolerations[0].key.as_deref(), Some("gpu"));
    assert_eq!(
        pod.node_selector.unwrap(),
        BTreeMap::from([("pool".to_owned(), "apps".to_owned())])
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
}

#[test]
fn off_cpu_is_an_agent_flag_only_when_the_store_asks() {
    let plain = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&plain).unwrap();
    let args = kiln_operator::resources::agent::agent_args(&plain, &names).unwrap();
    assert!(!args.iter().any(|a| a.starts_with("--off-cpu")), "{args:?}");
    let asked = profile_store(serde_json::json!({"agent": {"offCpu": true}}));
    let args = kiln_operator::resources::agent::agent_args(&asked, &names).unwrap();
    assert!(args.contains(&"--off-cpu".to_owned()), "{args:?}");
}

#[test]
fn store_gets_retention_flags_and_data_dir() {
    let object =
        profile_store(serde_json::json!({"retention": {"duration": "30d", "size": "50Gi"}}));
    assert_eq!(
        store::store_args(&object).expect("renders"),
        vec![
            "--listen=0.0.0.0:7470",
            "--data-dir=/var/lib/kiln",
            "--store-name=kiln/main",
            "--retention=30d",
            "--retention-bytes=53687091200",
            // Three quarters of the default 2Gi memory limit.
            "--memory-budget=1610612736",
        ]
    );
    let without_size = profile_store(serde_json::json!({}));
    assert!(
        store::store_args(&without_size)
            .expect("renders")
            .contains(&"--retention=168h".to_owned())
    );
    assert!(
        !store::store_args(&without_size)
            .expect("renders")
            .iter()
            .any(|a| a.starts_with("--retention-bytes"))
    );
}

#[test]
fn replicas_of_a_store_are_each_others_peers() {
    let one = profile_store(serde_json::json!({}));
    assert!(
        !store::store_args(&one)
            .expect("renders")
            .iter()
            .any(|a| a.starts_with("--peers"))
    );
    let three = profile_store(serde_json::json!({"replicas": 3}));
    let peers = store::store_args(&three)
        .expect("renders")
        .into_iter()
        .find(|a| a.starts_with("--peers="))
        .expect("--peers for three replicas");
    assert_eq!(
        peers,
        "--peers=main-0=http://main-0.main-headless.kiln.svc:7470,\
         main-1=http://main-1.main-headless.kiln.svc:7470,\
         main-2=http://main-2.main-headless.kiln.svc:7470"
    );
}

#[test]
fn agents_ship_to_one_replica_by_its_stable_name() {
    let one = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&one).unwrap();
    let args = kiln_operator::resources::agent::agent_args(&one, &names).unwrap();
    assert!(
        !args.iter().any(|a| a.starts_with("--store-replicas")),
        "{args:?}"
    );
    let three = profile_store(serde_json::json!({"replicas": 3}));
    let args = kiln_operator::resources::agent::agent_args(&three, &names).unwrap();
    assert!(
        args.contains(
            &"--store-replicas=http://main-0.main-headless.kiln.svc:7470,\
              http://main-1.main-headless.kiln.svc:7470,\
              http://main-2.main-headless.kiln.svc:7470"
                .to_owned()
        ),
        "{args:?}"
    );
}

#[test]
fn store_memory_budget_follows_the_container_memory_limit() {
    let budget_arg = |o: &ProfileStore| {
        store::store_args(o)
            .expect("renders")
            .into_iter()
            .find(|a| a.starts_with("--memory-budget="))
    };
    let limited = profile_store(serde_json::json!({"resources": {"limits": {"memory": "4Gi"}}}));
    assert_eq!(
        budget_arg(&limited).as_deref(),
        Some("--memory-budget=3221225472")
    );
    let tiny = profile_store(serde_json::json!({"resources": {"limits": {"memory": "32Mi"}}}));
    assert_eq!(
        budget_arg(&tiny).as_deref(),
        Some("--memory-budget=67108864"),
        "never below what kiln-store accepts"
    );
    let unlimited =
        profile_store(serde_json::json!({"resources": {"requests": {"memory": "1Gi"}}}));
    assert_eq!(budget_arg(&unlimited), None);
}

#[test]
fn persistent_storage_uses_a_claim_template_and_ephemeral_an_empty_dir() {
    let names_of = |o: &ProfileStore| StoreNames::of(o).unwrap();
    let object =
        profile_store(serde_json::json!({"storage": {"size": "20Gi", "storageClassName": "fast"}}));
    let names = names_of(&object);
    let config = store::config_map(&object, &names).unwrap();
    let set = store::stateful_set(&object, &names, &config, &BuildDefaults::default()).unwrap();
    let claims = set.spec.volume_claim_templates.clone().unwrap();
    let claim_spec = claims[0].spec.clone().unwrap();
    assert_eq!(claim_spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        claim_spec.resources.unwrap().requests.unwrap()["storage"].0,
        "20Gi"
    );
    let volumes = set.spec.template.spec.clone().unwrap().volumes.unwrap();
    assert!(
        volumes.iter().all(|v| v.name != "data"),
        "data comes from the claim template"
    );
    assert_eq!(set.spec.service_name.as_deref(), Some("main-headless"));

    let ephemeral = profile_store(serde_json::json!({"storage": {"ephemeral": true}}));
    let names = names_of(&ephemeral);
    let config = store::config_map(&ephemeral, &names).unwrap();
    let set = store::stateful_set(&ephemeral, &names, &config, &BuildDefaults::default()).unwrap();
    assert!(set.spec.volume_claim_templates.is_none());
    let volumes = set.spec.template.spec.unwrap().volumes.unwrap();
    assert!(volumes[0].empty_dir.is_some());
}

#[test]
fn store_runs_non_root_with_default_resources_and_owner_reference() {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).unwrap();
    let config = store::config_map(&object, &names).unwrap();
    let set = store::stateful_set(&object, &names, &config, &BuildDefaults::default()).unwrap();
    let owner = &set.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.kind, "ProfileStore");
    assert_eq!(owner.controller, Some(true));
    let pod = set.spec.template.spec.unwrap();
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/kiln-dev/kiln-store:0.1.0")
    );
    let resources = container.resources.clone().unwrap();
    assert_eq!(resources.limits.unwrap()["memory"].0, "2Gi");
}

/// Issue 17: readiness follows `/readyz`, which fails while the store recovers, when its WAL is
/// poisoned or its bucket unreachable, so the Service stops sending it traffic; liveness stays
/// on `/healthz`, so a store replaying a long WAL is not restarted.
#[test]
fn store_probes_use_readyz_for_readiness_and_healthz_for_liveness() {
    let object = profile_store(serde_json::json!({}));
    let names = StoreNames::of(&object).unwrap();
    let config = store::config_map(&object, &names).unwrap();
    let set = store::stateful_set(&object, &names, &config, &BuildDefaults::default()).unwrap();
    let container = set.spec.template.spec.unwrap().containers.remove(0);
    let path_and_port = |probe: Option<k8s_openapi::api::core::v1::Probe>| {
        let get = probe.and_then(|p| p.http_get).expect("an HTTP probe");
        (get.path, get.port)
    };
    let port = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(
        store::PORT_NAME.to_owned(),
    );
    assert_eq!(
        path_and_port(container.readiness_probe),
        (Some("/readyz".to_owned()), port.clone())
    );
    assert_eq!(
        path_and_port(container.liveness_probe),
        (Some("/healthz".to_owned()), port)
    );
}

#[test]
fn object_storage_becomes_env_with_secret_references() {
    let object = profile_store(serde_json::json!({
        "replicas": 2,
        "objectStorage": {
            "bucket": "profiles", "endpoint": "http://minio:9000", "region": "eu-west-1",
            "prefix": "/kiln/", "credentialsSecretRef": {"name": "s3-creds"}
        }
    }));
    let names = StoreNames::of(&object).unwrap();
    let config = store::config_map(&object, &names).unwrap();
    let data = config.data.clone().unwrap();
    assert_eq!(data["KILN_OBJECT_STORE"], "s3");
    assert_eq!(data["KILN_BUCKET"], "profiles");
    assert_eq!(data["KILN_BUCKET_PREFIX"], "kiln");
    assert_eq!(data["KILN_BUCKET_ENDPOINT"], "http://minio:9000");
    assert_eq!(data["KILN_BUCKET_ALLOW_HTTP"], "true");
    assert_eq!(data["KILN_BUCKET_REGION"], "eu-west-1");
    let set = store::stateful_set(&object, &names, &config, &BuildDefaults::default()).unwrap();
    let env = set.spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let secret = env[0].value_from.clone().unwrap().secret_key_ref.unwrap();
    assert_eq!(secret.name, "s3-creds");
    assert_eq!(secret.key, "AWS_ACCESS_KEY_ID");
}

#[test]
fn each_store_claims_its_own_bucket_prefix_by_default() {
    let names_of = |object: &ProfileStore| {
        let names = StoreNames::of(object).unwrap();
        let config = store::config_map(object, &names).unwrap();
        let args = store::store_args(object).unwrap();
        (config.data.unwrap(), args)
    };
    let shared = serde_json::json!({"objectStorage": {"bucket": "profiles"}});
    let (data, args) = names_of(&profile_store(shared));
    assert_eq!(data["KILN_BUCKET_PREFIX"], "kiln/main");
    assert!(
        args.contains(&"--store-name=kiln/main".to_owned()),
        "{args:?}"
    );
    // Another store on the same bucket: another prefix.
    let mut other = profile_store(serde_json::json!({"objectStorage": {"bucket": "profiles"}}));
    other.metadata.namespace = Some("staging".to_owned());
    assert_eq!(names_of(&other).0["KILN_BUCKET_PREFIX"], "staging/main");
    // "/" keeps the bucket's root, where earlier releases wrote.
    let root =
        profile_store(serde_json::json!({"objectStorage": {"bucket": "profiles", "prefix": "/"}}));
    assert!(!names_of(&root).0.contains_key("KILN_BUCKET_PREFIX"));
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
