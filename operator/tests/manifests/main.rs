//! The packaged manifests: samples against the generated CRD schemas, the kustomize layout,
//! offline validation with `kubernetes-validate`, the chart's values schema, and RBAC coverage;
//! and, in [`chart`], the Helm chart against `config/default`. They are one test target because
//! both read the manifests with the same kustomize renderer and CRD schema checker.

mod chart;
mod kustomize;
mod recording_rules;
mod schema_check;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_operator::api::{ProfileStore, ProfilingTarget};
use kiln_testkit::prerequisites::{in_ci, visible_skip};
use kube::CustomResourceExt;
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    std::fs::canonicalize(env!("CARGO_MANIFEST_DIR"))
        .expect("manifest dir exists")
        .parent()
        .expect("operator/ has a parent")
        .to_path_buf()
}

fn crd_schema(kind: &str) -> Value {
    let crd = match kind {
        "ProfileStore" => ProfileStore::crd(),
        "ProfilingTarget" => ProfilingTarget::crd(),
        other => panic!("no CRD for kind {other}"),
    };
    let crd = serde_json::to_value(crd).expect("CRD serializes");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn schema_errors(object: &Value) -> Vec<String> {
    let kind = object["kind"].as_str().expect("objects have a kind");
    let mut errors = Vec::new();
    // The API server supplies apiVersion, kind and metadata itself; the CRD schema omits them.
    if object["apiVersion"] != "kiln.dev/v1alpha1" {
        errors.push(format!("{kind}.apiVersion: expected kiln.dev/v1alpha1"));
    }
    if !object["metadata"]["name"].is_string() {
        errors.push(format!("{kind}.metadata.name: missing"));
    }
    let mut body = object.clone();
    if let Some(map) = body.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
        map.remove("metadata");
    }
    schema_check::validate(&body, &crd_schema(kind), kind, &mut errors);
    errors
}

fn sample_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("config/samples"))
        .expect("config/samples exists")
        .map(|entry| entry.expect("readable dir entry").path())
        .filter(|path| path.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_sample_parses_into_the_rust_types_and_passes_the_crd_schema() {
    let files = sample_files();
    assert!(files.len() >= 3, "samples present: {files:?}");
    for path in files {
        for object in kustomize::load_documents(&path).expect("sample is YAML") {
            match object["kind"].as_str() {
                Some("ProfileStore") => {
                    serde_json::from_value::<ProfileStore>(object.clone())
                        .expect("ProfileStore parses");
                }
                Some("ProfilingTarget") => {
                    serde_json::from_value::<ProfilingTarget>(object.clone())
                        .expect("ProfilingTarget parses");
                }
                other => panic!("{}: unexpected kind {other:?}", path.display()),
            }
            let errors = schema_errors(&object);
            assert!(errors.is_empty(), "{}: {errors:?}", path.display());
        }
    }
}

#[test]
fn every_sample_is_listed_in_the_samples_kustomization() {
    let objects = kustomize::render(&repo_root().join("config/samples")).expect("renders");
    let documents: usize = sample_files()
        .iter()
        .map(|p| kustomize::load_documents(p).expect("YAML").len())
        .sum();
    assert_eq!(objects.len(), documents);
}

#[test]
fn schema_check_rejects_typos_bad_types_patterns_and_ranges() {
    let store = |spec: Value| {
        json!({"apiVersion": "kiln.dev/v1alpha1", "kind": "ProfileStore",
                                     "metadata": {"name": "x"}, "spec": spec})
    };
    assert!(schema_errors(&store(json!({}))).is_empty());
    for (spec, needle) in [
        (json!({"replicas": "two"}), "expected a number"),
        (json!({"replicas": 1.5}), "expected an integer"),
        (json!({"replicas": 0}), "below the minimum"),
        (json!({"retentionn": {}}), "unknown field"),
        (
            json!({"retention": {"duration": "a week"}}),
            "does not match",
        ),
        // Zero retention would delete everything, and the store refuses it and crash-loops.
        (json!({"retention": {"duration": "0s"}}), "does not match"),
        // Only the known runtimes' sockets can be mounted into agents.
        (
            json!({"agent": {"containerRuntimeSocket": "/etc/shadow"}}),
            "does not match",
        ),
        (json!({"storage": {"size": "lots"}}), "does not match"),
        (json!({"agent": {"securityMode": "root"}}), "is not one of"),
        (json!({"servicePort": 70000}), "above the maximum"),
        (
            json!({"objectStorage": {"region": "x"}}),
            "missing required field \"bucket\"",
        ),
        // The store splits --debuginfod-urls on commas and spaces, and takes http(s) only.
        (
            json!({"symbolization": {"debuginfodUrls": ["debuginfod.debian.net"]}}),
            "does not match",
        ),
        (
            json!({"symbolization": {"debuginfodUrls": ["https://a,https://b"]}}),
            "does not match",
        ),
        (
            json!({"symbolization": {"debuginfodUrls": vec!["https://d.example"; 9]}}),
            "more than 8 items",
        ),
        (
            json!({"symbolization": {"debuginfodUrls": [format!("https://{}", "d".repeat(250))]}}),
            "maxLength",
        ),
        (
            json!({"symbolization": {"cacheSize": "lots"}}),
            "does not match",
        ),
        (
            json!({"symbolization": {"acceptUploads": "no"}}),
            "expected a boolean",
        ),
    ] {
        let errors = schema_errors(&store(spec.clone()));
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "{spec}: {errors:?}"
        );
    }
    let target = json!({"apiVersion": "kiln.dev/v1alpha1", "kind": "ProfilingTarget",
                        "metadata": {"name": "x"}, "spec": {"storeRef": {"name": "s"}, "samplingHz": 5000,
                        "containers": ["Bad_Name"]}});
    let errors = schema_errors(&target);
    assert!(
        errors.iter().any(|e| e.contains("samplingHz")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("containers[0]")),
        "{errors:?}"
    );
    // pprof.port: a number in range, or a container port name (IANA_SVC_NAME).
    let scraped = |port: Value| {
        json!({"apiVersion": "kiln.dev/v1alpha1", "kind": "ProfilingTarget",
               "metadata": {"name": "x"}, "spec": {"storeRef": {"name": "s"},
               "pprof": {"port": port}}})
    };
    for fine in [
        json!(6060),
        json!(1),
        json!(65535),
        json!("http-debug"),
        json!("pprof"),
    ] {
        assert_eq!(
            schema_errors(&scraped(fine.clone())),
            Vec::<String>::new(),
            "{fine}"
        );
    }
    for (port, needle) in [
        (json!(0), "below the minimum"),
        (json!(70000), "above the maximum"),
        (json!("Debug_Port"), "does not match"),
        (json!("6060"), "does not match"),
        (json!("http--debug"), "does not match"),
        (json!("abcdefghijklmnop"), "longer than maxLength"),
        (json!(true), "expected an integer or a string"),
    ] {
        let errors = schema_errors(&scraped(port.clone()));
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "{port}: {errors:?}"
        );
    }
    // Label values are bounded so one target cannot bloat the shared targets file.
    let labelled = |value: String| {
        json!({"apiVersion": "kiln.dev/v1alpha1", "kind": "ProfilingTarget",
               "metadata": {"name": "x"}, "spec": {"storeRef": {"name": "s"},
               "labels": {"team": value}}})
    };
    assert_eq!(
        schema_errors(&labelled("v".repeat(256))),
        Vec::<String>::new()
    );
    let errors = schema_errors(&labelled("v".repeat(257)));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("labels") && e.contains("maxLength")),
        "{errors:?}"
    );
}

#[test]
fn crd_carries_the_cel_rules_users_rely_on() {
    let schema = crd_schema("ProfileStore");
    let spec_rules = schema["properties"]["spec"]["x-kubernetes-validations"].to_string();
    assert!(
        spec_rules.contains("self.replicas <= 1 || has(self.objectStorage)"),
        "{spec_rules}"
    );
    let size_rules = schema["properties"]["spec"]["properties"]["storage"]["properties"]["size"]
        ["x-kubernetes-validations"]
        .to_string();
    assert!(
        size_rules.contains("quantity(self).compareTo(quantity(oldSelf)) >= 0"),
        "{size_rules}"
    );
}

#[test]
fn default_kustomization_installs_namespace_crds_rbac_and_operator() {
    let objects = kustomize::render(&repo_root().join("config/default")).expect("renders");
    let names: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    for expected in [
        "Namespace/kiln-system",
        "CustomResourceDefinition/profilestores.kiln.dev",
        "CustomResourceDefinition/profilingtargets.kiln.dev",
        "ServiceAccount/kiln-operator",
        "ClusterRole/kiln-operator",
        "ClusterRoleBinding/kiln-operator",
        "Role/kiln-operator-stores",
        "RoleBinding/kiln-operator-stores",
        "Deployment/kiln-operator",
    ] {
        assert!(
            names.contains(&expected.to_owned()),
            "{expected} missing from {names:?}"
        );
    }
    let namespace = objects
        .iter()
        .find(|o| o["kind"] == "Namespace")
        .expect("namespace");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("deployment");
    assert_eq!(deployment["metadata"]["namespace"], "kiln-system");
    let binding = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .expect("binding");
    assert_eq!(binding["subjects"][0]["namespace"], "kiln-system");
    assert!(
        objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole")
            .all(|o| o["metadata"]["namespace"].is_null())
    );
}

/// Every (apiGroup, resource, verb) the operator's code uses.
const REQUIRED_PERMISSIONS: [(&str, &str, &str); 32] = [
    ("kiln.dev", "profilestores", "get"),
    ("kiln.dev", "profilestores", "list"),
    ("kiln.dev", "profilestores", "watch"),
    ("kiln.dev", "profilestores", "patch"),
    ("kiln.dev", "profilestores/status", "patch"),
    ("kiln.dev", "profilestores/finalizers", "update"),
    ("kiln.dev", "profilingtargets", "list"),
    ("kiln.dev", "profilingtargets", "watch"),
    ("kiln.dev", "profilingtargets/status", "patch"),
    ("apps", "statefulsets", "get"),
    ("apps", "statefulsets", "watch"),
    ("apps", "statefulsets", "patch"),
    ("apps", "statefulsets", "delete"),
    ("apps", "daemonsets", "patch"),
    ("apps", "daemonsets", "delete"),
    ("apps", "daemonsets", "watch"),
    ("", "services", "patch"),
    ("", "configmaps", "patch"),
    ("", "configmaps", "delete"),
    ("", "serviceaccounts", "patch"),
    ("", "persistentvolumeclaims", "list"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "persistentvolumeclaims", "patch"),
    ("", "secrets", "get"),
    ("", "secrets", "create"),
    ("networking.k8s.io", "networkpolicies", "get"),
    ("networking.k8s.io", "networkpolicies", "patch"),
    ("networking.k8s.io", "networkpolicies", "delete"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "delete"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

fn grants(role: &Value, group: &str, resource: &str, verb: &str) -> bool {
    role["rules"].as_array().into_iter().flatten().any(|rule| {
        let has = |field: &str, wanted: &str| {
            rule[field]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v == wanted || v == "*")
        };
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    })
}

#[test]
fn operator_role_covers_every_call_and_grants_no_wildcards() {
    let role =
        &kustomize::load_documents(&repo_root().join("config/rbac/role.yaml")).expect("role")[0];
    let store_role = &kustomize::load_documents(&repo_root().join("config/rbac/store_role.yaml"))
        .expect("store role")[0];
    assert_eq!(store_role["kind"], "Role", "store writes are namespaced");
    for (group, resource, verb) in REQUIRED_PERMISSIONS {
        assert!(
            grants(role, group, resource, verb) || grants(store_role, group, resource, verb),
            "missing {verb} on {group}/{resource}"
        );
    }
    assert!(
        !role.to_string().contains("\"*\""),
        "wildcards in the operator role"
    );
    // Secrets only where stores live, and only to create each store's tokens once.
    for verb in [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ] {
        assert!(
            !grants(role, "", "secrets", verb),
            "the ClusterRole may {verb} secrets"
        );
        assert_eq!(
            grants(store_role, "", "secrets", verb),
            verb == "get" || verb == "create",
            "the store Role and {verb} on secrets"
        );
    }
    // Agents need no API access, so the operator neither creates bindings nor may bind roles.
    for verb in ["create", "patch", "update", "bind", "escalate"] {
        for resource in [
            "clusterrolebindings",
            "clusterroles",
            "rolebindings",
            "roles",
        ] {
            assert!(
                !grants(role, "rbac.authorization.k8s.io", resource, verb),
                "the operator may {verb} {resource}"
            );
        }
    }
}

/// Every rule of every RBAC object in `config/` and the chart's template, as
/// (kind, rule) pairs.
fn rbac_rules() -> Vec<(String, String, Value)> {
    let mut rules = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("config/rbac"))
        .expect("config/rbac")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for path in files {
        for object in kustomize::load_documents(&path).expect("YAML") {
            let kind = object["kind"].as_str().unwrap_or("").to_owned();
            for rule in object["rules"].as_array().into_iter().flatten() {
                rules.push((path.display().to_string(), kind.clone(), rule.clone()));
            }
        }
    }
    // The chart template: split into documents and drop template lines, which never
    // hold rules.
    let chart = std::fs::read_to_string(repo_root().join("charts/kiln/templates/rbac.yaml"))
        .expect("chart rbac template");
    for document in chart.split("\n---\n") {
        let plain: String = document
            .lines()
            .filter(|l| !l.contains("{{"))
            .collect::<Vec<_>>()
            .join("\n");
        let Ok(object) = serde_yaml::from_str::<Value>(&plain) else {
            continue;
        };
        let kind = object["kind"].as_str().unwrap_or("").to_owned();
        for rule in object["rules"].as_array().into_iter().flatten() {
            rules.push(("chart".to_owned(), kind.clone(), rule.clone()));
        }
    }
    rules
}

#[test]
fn no_cluster_wide_write_on_core_or_apps_resources() {
    let rules = rbac_rules();
    assert!(rules.len() > 10, "rules were read: {}", rules.len());
    let writes = [
        "create",
        "patch",
        "update",
        "delete",
        "deletecollection",
        "*",
    ];
    for (file, kind, rule) in &rules {
        if kind != "ClusterRole" {
            continue;
        }
        let groups = rule["apiGroups"].to_string();
        let core_or_apps = groups.contains("\"\"") || groups.contains("\"apps\"");
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            !core_or_apps || !verbs.iter().any(|v| writes.contains(v)),
            "{file}: a ClusterRole writes core/apps resources: {rule}"
        );
    }
    assert!(
        rules.iter().any(|(_, kind, _)| kind == "Role"),
        "writes come from namespaced Roles"
    );
}

#[test]
fn chart_rbac_matches_config_rbac() {
    let chart_rbac = std::fs::read_to_string(repo_root().join("charts/kiln/templates/rbac.yaml"))
        .expect("chart rbac template");
    let config_role =
        std::fs::read_to_string(repo_root().join("config/rbac/role.yaml")).expect("role");
    let rules = config_role
        .split_once("rules:\n")
        .expect("role has rules")
        .1;
    assert!(
        chart_rbac.contains(rules),
        "charts/kiln/templates/rbac.yaml must repeat config/rbac/role.yaml's rules verbatim"
    );
    let store_role =
        std::fs::read_to_string(repo_root().join("config/rbac/store_role.yaml")).expect("role");
    let store_rules = store_role
        .split_once("rules:\n")
        .expect("store role has rules")
        .1;
    assert!(
        chart_rbac.contains(store_rules),
        "charts/kiln/templates/rbac.yaml must repeat config/rbac/store_role.yaml's rules verbatim"
    );
}

/// The `--flag` names in a manifest's text, in order.
fn operator_flags(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("- --"))
        .map(|flag| format!("--{}", flag.split('=').next().unwrap_or(flag)))
        .collect()
}

#[test]
fn chart_passes_the_operator_every_flag_config_does() {
    let read = |path: &str| std::fs::read_to_string(repo_root().join(path)).expect(path);
    let config = operator_flags(&read("config/manager/manager.yaml"));
    let chart = operator_flags(&read("charts/kiln/templates/deployment.yaml"));
    // The agent policy is the installer's to set in either packaging.
    for flag in ["--allowed-agent-images", "--allowed-agent-tolerations"] {
        assert!(
            config.iter().any(|f| f == flag),
            "{flag} missing in config/manager"
        );
    }
    for flag in &config {
        assert!(
            chart.contains(flag),
            "{flag} is set in config/manager/manager.yaml but not in the chart's deployment"
        );
    }
}

fn tools_dir() -> PathBuf {
    std::env::var_os("KILN_TOOLS_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp/kiln-tools"), PathBuf::from)
}

/// `Some(path)` when the tool is there; otherwise a visible skip, or a failure in CI, where
/// `./kiln-dev test` has installed it.
fn installed_tool(path: PathBuf, hint: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    assert!(!in_ci(), "{} is missing in CI; {hint}", path.display());
    visible_skip(&format!("{} not found; {hint}", path.display()));
    None
}

/// The path of a Python tool, or None (skip with a message) outside CI; in CI a missing tool fails.
fn python_tool(name: &str) -> Option<PathBuf> {
    installed_tool(
        tools_dir().join("venv/bin").join(name),
        "install it with ./kiln-dev test (pip install kubernetes-validate==1.37.0)",
    )
}

fn write_stream(objects: &[Value], path: &Path) {
    let mut text = String::new();
    for object in objects {
        text.push_str("---\n");
        text.push_str(&serde_yaml::to_string(object).expect("object renders"));
    }
    std::fs::write(path, text).expect("write rendered manifests");
}

#[test]
fn rendered_default_kustomization_passes_kubernetes_validate_strict() {
    let Some(validator) = python_tool("kubernetes-validate") else {
        return;
    };
    let objects = kustomize::render(&repo_root().join("config/default")).expect("renders");
    let dir = std::env::temp_dir().join(format!("kiln-operator-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rendered = dir.join("default.yaml");
    write_stream(&objects, &rendered);
    for version in ["1.37.0", "1.32.0"] {
        let output = Command::new(&validator)
            .args(["--strict", "-k", version])
            .arg(&rendered)
            .output()
            .expect("kubernetes-validate runs");
        let report = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "kubernetes-validate {version} failed:\n{report}"
        );
        assert!(!report.contains("ERROR"), "{report}");
        assert_eq!(
            report.matches("passed for resource").count(),
            objects.len(),
            "{report}"
        );
    }
    // And it can fail: a broken Deployment is caught.
    let mut broken = objects.clone();
    if let Some(deployment) = broken.iter_mut().find(|o| o["kind"] == "Deployment") {
        deployment["spec"]["replicas"] = json!("two");
    }
    let broken_path = dir.join("broken.yaml");
    write_stream(&broken, &broken_path);
    let output = Command::new(&validator)
        .arg("--strict")
        .arg(&broken_path)
        .output()
        .expect("runs");
    assert!(
        !output.status.success(),
        "a Deployment with replicas: \"two\" must fail validation"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chart_values_satisfy_the_values_schema() {
    let Some(python) = python_tool("python") else {
        return;
    };
    let chart = repo_root().join("charts/kiln");
    let check = r#"
import json, sys, yaml, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft7Validator.check_schema(schema)
jsonschema.validate(yaml.safe_load(open(sys.argv[2])), schema)
bad = yaml.safe_load(open(sys.argv[2])); bad["operator"]["replicas"] = "two"
try:
    jsonschema.validate(bad, schema)
    sys.exit("schema accepted replicas: two")
except jsonschema.ValidationError:
    pass
"#;
    let output = Command::new(python)
        .args(["-c", check])
        .arg(chart.join("values.schema.json"))
        .arg(chart.join("values.yaml"))
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "values.yaml vs values.schema.json: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// kustomize prints `64.0` as `64`; compare numbers by value.
fn integral_floats_as_integers(value: &mut Value) {
    match value {
        Value::Number(number) => {
            if let Some(float) = number.as_f64()
                && float.fract() == 0.0
                && float.abs() < 9.0e15
            {
                *value = Value::from(float as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

fn sorted_by_kind_and_name(mut objects: Vec<Value>) -> Vec<Value> {
    objects.iter_mut().for_each(integral_floats_as_integers);
    objects.sort_by_key(|o| {
        format!(
            "{}/{}/{}",
            o["kind"].as_str().unwrap_or(""),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("")
        )
    });
    objects
}

#[test]
fn built_in_renderer_agrees_with_kubectl_kustomize_when_available() {
    let Ok(output) = Command::new("kubectl")
        .args(["kustomize"])
        .arg(repo_root().join("config/default"))
        .output()
    else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: kubectl not installed; the built-in renderer alone checks config/default"
        );
        return;
    };
    assert!(
        output.status.success(),
        "kubectl kustomize config/default failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kubectl prints UTF-8");
    let mut from_kubectl = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document).expect("kubectl prints YAML");
        if !value.is_null() {
            from_kubectl.push(value);
        }
    }
    let ours = sorted_by_kind_and_name(
        kustomize::render(&repo_root().join("config/default")).expect("renders"),
    );
    let theirs = sorted_by_kind_and_name(from_kubectl);
    assert_eq!(ours.len(), theirs.len());
    for (mine, kubectl) in ours.iter().zip(&theirs) {
        assert!(
            mine == kubectl,
            "{}/{} differs from kubectl kustomize:\nours:    {mine}\nkubectl: {kubectl}",
            mine["kind"],
            mine["metadata"]["name"]
        );
    }
}

/// Every object the operator would apply for a store, with apiVersion and kind as sent.
fn children_of(store: &ProfileStore) -> Vec<Value> {
    use kiln_operator::resources::{
        BuildDefaults, StoreNames, agent, store as store_objects, targets,
    };

    fn typed<K: k8s_openapi::Resource + serde::Serialize>(object: &K) -> Value {
        let mut value = serde_json::to_value(object).expect("object serializes");
        value["apiVersion"] = json!(K::API_VERSION);
        value["kind"] = json!(K::KIND);
        value
    }
    let defaults = BuildDefaults::default();
    let names = StoreNames::of(store).expect("sample has metadata");
    let config = store_objects::config_map(store, &names).expect("builds");
    let file = targets::aggregate(&names, &[]).file;
    vec![
        typed(&config),
        typed(&store_objects::headless_service(store, &names).expect("builds")),
        typed(&store_objects::client_service(store, &names).expect("builds")),
        typed(&store_objects::stateful_set(store, &names, &config, &defaults).expect("builds")),
        typed(&targets::config_map(store, &names, &file).expect("builds")),
        typed(&agent::service_account(store, &names).expect("builds")),
        typed(&agent::daemon_set(store, &names, &defaults).expect("builds")),
    ]
}

#[test]
fn objects_built_from_every_sample_store_pass_kubernetes_validate_strict() {
    let Some(validator) = python_tool("kubernetes-validate") else {
        return;
    };
    let mut objects = Vec::new();
    for path in sample_files() {
        for object in kustomize::load_documents(&path).expect("sample is YAML") {
            if object["kind"] == "ProfileStore" {
                let mut store: ProfileStore = serde_json::from_value(object).expect("parses");
                store.metadata.uid = Some("00000000-0000-0000-0000-000000000001".to_owned());
                objects.extend(children_of(&store));
            }
        }
    }
    assert!(objects.len() >= 14, "two sample stores, seven objects each");
    let dir = std::env::temp_dir().join(format!("kiln-operator-children-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let rendered = dir.join("children.yaml");
    write_stream(&objects, &rendered);
    let output = Command::new(&validator)
        .args(["--strict", "-k", "1.37.0"])
        .arg(&rendered)
        .output()
        .expect("kubernetes-validate runs");
    let report = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        output.status.success() && !report.contains("ERROR"),
        "{report}"
    );
    assert_eq!(
        report.matches("passed for resource").count(),
        objects.len(),
        "{report}"
    );
}
