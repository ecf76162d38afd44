//! The store's StatefulSet: retention, peers, memory, storage, probes and
//! object storage.

use super::*;

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
