//! Offline validation of what Kiln installs: the rendered kustomization and
//! every object built from the sample stores pass `kubernetes-validate
//! --strict`; the chart's values pass its schema; the built-in renderer
//! agrees with `kubectl kustomize` where one is installed.

use super::*;

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
