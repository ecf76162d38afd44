//! Issue 17: the operator's pod specs parsed by the binaries' own clap definitions. Each
//! container's args, with its environment applied as clap applies it, must parse into the
//! binary's settings type: a flag or a `KILN_*` variable the binary does not know, or a value
//! it cannot parse, fails here instead of in a pod.

use std::collections::BTreeMap;

use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use kiln_agent_settings::AgentSettings;
use kiln_operator::api::ProfileStore;
use kiln_operator::resources::{BuildDefaults, StoreNames, agent, store};
use kiln_store_settings::{StoreSettings, TOKEN_ENVIRONMENT};
use serde_json::json;

use super::profile_store;

/// Specs that between them set every field the operator turns into a flag or a variable.
fn stores() -> Vec<ProfileStore> {
    vec![
        profile_store(json!({})),
        profile_store(json!({
            "retention": {"duration": "30d", "size": "1.5Ti"},
            "resources": {"limits": {"memory": "6Gi"}},
            "objectStorage": {
                "bucket": "kiln-profiles",
                "endpoint": "http://minio.storage:9000",
                "region": "eu-west-1",
                "prefix": "/cluster-a/",
                "credentialsSecretRef": {"name": "s3-keys"}
            },
            "auth": {"requireReadToken": true},
            "agent": {"containerRuntimeSocket": "/var/run/crio/crio.sock"},
            "servicePort": 8080,
            "symbolization": {
                "debuginfodUrls": ["https://debuginfod.debian.net", "http://debuginfod:8002/"],
                "acceptUploads": false,
                "maxDebugFileSize": "64Ki",
                "cacheSize": "1.5Gi"
            }
        })),
        profile_store(json!({
            "retention": {"duration": "90m"},
            "resources": {"limits": {"cpu": "1"}},
            "auth": {"requireWriteToken": false}
        })),
    ]
}

/// The container's environment as the kubelet gives it: `envFrom` ConfigMaps first, then
/// `env`. Values from Secrets and the downward API get stand-ins of the right shape.
fn environment(container: &Container, config_maps: &[ConfigMap]) -> BTreeMap<String, String> {
    let mut variables = BTreeMap::new();
    for source in container.env_from.iter().flatten() {
        let reference = source.config_map_ref.as_ref().expect("only ConfigMaps");
        let map = config_maps
            .iter()
            .find(|map| map.metadata.name.as_deref() == Some(reference.name.as_str()))
            .unwrap_or_else(|| panic!("envFrom names an unknown ConfigMap {}", reference.name));
        variables.extend(map.data.clone().unwrap_or_default());
    }
    for variable in container.env.iter().flatten() {
        let value = match (&variable.value, &variable.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(source)) if source.secret_key_ref.is_some() => {
                "0123456789abcdef0123456789abcdef".to_owned()
            }
            (None, Some(source)) if source.field_ref.is_some() => "node-a".to_owned(),
            _ => panic!("{} has neither a value nor a known source", variable.name),
        };
        variables.insert(variable.name.clone(), value);
    }
    variables
}

/// `$(NAME)` in an argument replaced as Kubernetes does; a name the container does not define
/// would reach the binary literally, so it fails the test.
fn expand(arg: &str, variables: &BTreeMap<String, String>) -> String {
    let mut expanded = String::new();
    let mut rest = arg;
    while let Some(start) = rest.find("$(") {
        expanded.push_str(&rest[..start]);
        let end = rest[start..].find(')').expect("closed $(") + start;
        let name = &rest[start + 2..end];
        let value = variables
            .get(name)
            .unwrap_or_else(|| panic!("{arg} uses ${name}, which the container does not define"));
        expanded.push_str(value);
        rest = &rest[end + 1..];
    }
    expanded.push_str(rest);
    expanded
}

/// Parses `args` with `variables` applied as clap applies its `env`: a variable counts for an
/// argument only when the command line does not give that argument. The test process's own
/// environment plays no part. Every `KILN_*` variable must be one the binary reads
/// (`extra_variables` names those it reads outside clap).
fn parse<S: Parser>(
    binary: &str,
    args: &[String],
    variables: &BTreeMap<String, String>,
    extra_variables: &[&str],
) -> Result<S, String> {
    let command = S::command();
    let mut line = vec![binary.to_owned()];
    line.extend(args.iter().cloned());
    let mut read = Vec::new();
    for arg in command.get_arguments() {
        let (Some(name), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let name = name.to_string_lossy().into_owned();
        read.push(name.clone());
        let on_command_line = args
            .iter()
            .any(|given| given == &format!("--{long}") || given.starts_with(&format!("--{long}=")));
        let Some(value) = variables.get(&name) else {
            continue;
        };
        if on_command_line {
            continue;
        }
        if arg.get_action().takes_values() {
            line.push(format!("--{long}={value}"));
        } else if !matches!(
            value.as_str(),
            "" | "0" | "false" | "no" | "off" | "n" | "f"
        ) {
            line.push(format!("--{long}"));
        }
    }
    for name in variables.keys().filter(|name| name.starts_with("KILN_")) {
        if !read.contains(name) && !extra_variables.contains(&name.as_str()) {
            return Err(format!("{binary} does not read {name}"));
        }
    }
    S::try_parse_from(&line).map_err(|error| format!("{binary} {line:?}: {error}"))
}

fn store_container_of(object: &ProfileStore) -> (Container, Vec<ConfigMap>) {
    let names = StoreNames::of(object).expect("store has metadata");
    let config = store::config_map(object, &names).expect("builds");
    let set =
        store::stateful_set(object, &names, &config, &BuildDefaults::default()).expect("builds");
    let mut pod = set.spec.template.spec.expect("pod spec is always set");
    (pod.containers.remove(0), vec![config])
}

#[test]
fn the_store_parses_every_statefulset_the_operator_renders() {
    for object in stores() {
        let (container, config_maps) = store_container_of(&object);
        let variables = environment(&container, &config_maps);
        let args: Vec<String> = container
            .args
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|arg| expand(arg, &variables))
            .collect();
        let parsed: StoreSettings = parse("kiln-store", &args, &variables, &TOKEN_ENVIRONMENT)
            .unwrap_or_else(|error| panic!("{error}"));
        // What the binary sees is what the operator meant: flags and ConfigMap together.
        let mut expected = store::store_settings(&object);
        expected.bucket = store::bucket_options(&object);
        assert_eq!(parsed, expected, "{args:?} {variables:?}");
        // The token lists come from Secrets through the environment, never from the args.
        let auth = &object.spec.auth;
        assert_eq!(
            variables.contains_key("KILN_WRITE_TOKENS"),
            auth.require_write_token
        );
        assert_eq!(
            variables.contains_key("KILN_READ_TOKENS"),
            auth.require_read_token
        );
    }
}

#[test]
fn the_agent_parses_every_daemonset_the_operator_renders() {
    for object in stores() {
        let names = StoreNames::of(&object).expect("store has metadata");
        let set = agent::daemon_set(&object, &names, &BuildDefaults::default()).expect("builds");
        let container = set
            .spec
            .template
            .spec
            .expect("pod spec is always set")
            .containers
            .remove(0);
        let variables = environment(&container, &[]);
        let args: Vec<String> = container
            .args
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|arg| expand(arg, &variables))
            .collect();
        let parsed: AgentSettings =
            parse("kiln-agent", &args, &variables, &[]).unwrap_or_else(|error| panic!("{error}"));
        let mut expected = agent::agent_settings(&object, &names);
        expected.node_name = Some("node-a".to_owned());
        if object.spec.auth.require_write_token {
            expected.store_token_file = Some(
                format!(
                    "{}/{}",
                    kiln_operator::resources::tokens::AGENT_TOKEN_DIR,
                    kiln_operator::resources::tokens::WRITE_TOKEN_KEY
                )
                .into(),
            );
        }
        assert_eq!(parsed, expected, "{args:?} {variables:?}");
    }
}

#[test]
fn an_unknown_flag_variable_or_value_fails_the_parse() {
    let (container, config_maps) = store_container_of(&profile_store(json!({})));
    let variables = environment(&container, &config_maps);
    let args = container.args.clone().unwrap_or_default();
    let with = |extra: &str| {
        let mut args = args.clone();
        args.push(extra.to_owned());
        parse::<StoreSettings>("kiln-store", &args, &variables, &TOKEN_ENVIRONMENT)
    };
    assert!(
        with("--write-tokens=secret").is_err(),
        "tokens are no flags"
    );
    assert!(
        with("--retention-bytes=10Gi").is_err(),
        "bytes, not a quantity"
    );
    assert!(with("--no-such-flag=1").is_err());
    let mut unknown = variables.clone();
    unknown.insert("KILN_NO_SUCH_SETTING".to_owned(), "1".to_owned());
    let err =
        parse::<StoreSettings>("kiln-store", &args, &unknown, &TOKEN_ENVIRONMENT).unwrap_err();
    assert!(err.contains("KILN_NO_SUCH_SETTING"), "{err}");
    let mut bad = variables;
    bad.insert("KILN_BUCKET_ALLOW_HTTP".to_owned(), "sometimes".to_owned());
    assert!(parse::<StoreSettings>("kiln-store", &args, &bad, &TOKEN_ENVIRONMENT).is_err());
}
