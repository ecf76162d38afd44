//! Issue 15. A store with no tokens lets any pod in the cluster read every namespace's
//! profiles and write spoofed ones. So the store reads its tokens from the `<store>-tokens`
//! Secret through `secretKeyRef` env, the agents get only the write token as a read-only
//! file, and no token ever appears in a command line, where every user of the node reads it.

use k8s_openapi::api::core::v1::{Container, EnvVar};
use kiln_operator::resources::tokens::{self, StoreTokens, TOKEN_BYTES};
use kiln_operator::resources::{BuildDefaults, StoreNames, store};
use serde_json::json;

use super::{agent_container, pod_spec_of_daemon_set, profile_store};

fn store_container(spec: serde_json::Value) -> Container {
    let object = profile_store(spec);
    let names = StoreNames::of(&object).expect("store has metadata");
    let config = store::config_map(&object, &names).expect("builds");
    let set =
        store::stateful_set(&object, &names, &config, &BuildDefaults::default()).expect("builds");
    set.spec
        .template
        .spec
        .expect("pod spec is always set")
        .containers
        .remove(0)
}

fn env_named<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a EnvVar> {
    env.iter().find(|variable| variable.name == name)
}

/// (Secret name, key) an env variable reads, with no literal value beside it.
fn secret_ref(variable: &EnvVar) -> (String, String) {
    assert!(
        variable.value.is_none(),
        "{} has a literal value",
        variable.name
    );
    let selector = variable
        .value_from
        .as_ref()
        .and_then(|source| source.secret_key_ref.clone())
        .expect("from a Secret");
    assert_eq!(
        selector.optional,
        Some(false),
        "a missing token stops the pod"
    );
    (selector.name, selector.key)
}

#[test]
fn store_reads_the_write_token_from_the_secret_by_default_and_never_from_args() {
    let container = store_container(json!({}));
    let env = container.env.clone().unwrap_or_default();
    let write = env_named(&env, "KILN_WRITE_TOKENS").expect("write tokens set");
    assert_eq!(
        secret_ref(write),
        ("main-tokens".to_owned(), "write-token".to_owned())
    );
    // The UI cannot send a token yet (issue 18), so reads stay open unless asked for.
    assert!(env_named(&env, "KILN_READ_TOKENS").is_none());
    let args = container.args.unwrap_or_default().join(" ");
    assert!(!args.contains("token"), "{args}");
}

#[test]
fn read_tokens_only_when_the_spec_asks_and_write_tokens_can_be_turned_off() {
    let both = store_container(json!({"auth": {"requireReadToken": true}}));
    let env = both.env.unwrap_or_default();
    let read = env_named(&env, "KILN_READ_TOKENS").expect("read tokens set");
    assert_eq!(
        secret_ref(read),
        ("main-tokens".to_owned(), "read-token".to_owned())
    );
    assert!(env_named(&env, "KILN_WRITE_TOKENS").is_some());

    let open = store_container(json!({"auth": {"requireWriteToken": false}}));
    let env = open.env.unwrap_or_default();
    assert!(env_named(&env, "KILN_WRITE_TOKENS").is_none());
    assert!(env_named(&env, "KILN_READ_TOKENS").is_none());
}

#[test]
fn agents_mount_only_the_write_token_read_only_and_point_the_agent_at_it() {
    let object = profile_store(json!({"auth": {"requireReadToken": true}}));
    let pod = pod_spec_of_daemon_set(&object);
    let volume = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|volume| volume.name == tokens::AGENT_TOKEN_VOLUME)
        .expect("token volume");
    let secret = volume.secret.expect("a Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("main-tokens"));
    assert_eq!(secret.default_mode, Some(0o400));
    let items = secret.items.expect("only listed keys are projected");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].key, "write-token");

    let container = pod.containers[0].clone();
    let mount = container
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .find(|mount| mount.name == tokens::AGENT_TOKEN_VOLUME)
        .expect("token mount");
    assert_eq!(mount.read_only, Some(true));
    let env = container.env.unwrap_or_default();
    let file = env_named(&env, "KILN_STORE_TOKEN_FILE").expect("token file set");
    assert_eq!(
        file.value.as_deref(),
        Some(format!("{}/write-token", mount.mount_path).as_str())
    );
    let args = container.args.unwrap_or_default().join(" ");
    assert!(!args.contains("token"), "{args}");
}

#[test]
fn agents_get_no_token_when_writes_are_open() {
    let object = profile_store(json!({"auth": {"requireWriteToken": false}}));
    let container = agent_container(&object);
    let env = container.env.unwrap_or_default();
    assert!(env_named(&env, "KILN_STORE_TOKEN_FILE").is_none());
    let pod = pod_spec_of_daemon_set(&object);
    assert!(
        pod.volumes
            .unwrap_or_default()
            .iter()
            .all(|volume| volume.secret.is_none())
    );
}

#[test]
fn tokens_secret_is_owned_by_the_store_and_holds_both_keys() {
    let object = profile_store(json!({}));
    let names = StoreNames::of(&object).expect("store has metadata");
    let generated = StoreTokens::from_random(&[0xab; TOKEN_BYTES], &[0x01; TOKEN_BYTES]);
    let secret = tokens::secret(&object, &names, &generated);
    assert_eq!(secret.metadata.name.as_deref(), Some("main-tokens"));
    assert_eq!(secret.metadata.namespace.as_deref(), Some("kiln"));
    let owner = &secret.metadata.owner_references.expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("ProfileStore", "uid-1")
    );
    assert_eq!(owner.controller, Some(true));
    let data = secret.data.expect("data");
    assert_eq!(data["write-token"].0, "ab".repeat(TOKEN_BYTES).into_bytes());
    assert_eq!(data["read-token"].0, "01".repeat(TOKEN_BYTES).into_bytes());
    // Never applied, so it carries no applied-hash to compare on later passes.
    assert!(secret.metadata.annotations.is_none());
}
