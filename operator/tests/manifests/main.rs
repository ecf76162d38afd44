//! The packaged manifests: samples against the generated CRD schemas, the kustomize layout,
//! offline validation with `kubernetes-validate`, the chart's values schema, and RBAC coverage;
//! and, in [`chart`], the Helm chart against `config/default`. They are one test target because
//! both read the manifests with the same kustomize renderer and CRD schema checker.

mod chart;
mod kubernetes_validate;
mod kustomize;
mod rbac;
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
