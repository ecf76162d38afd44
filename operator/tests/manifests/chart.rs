//! The Helm chart as the pinned `helm` renders it (`e2e/cluster/helm/build.sh` builds it;
//! `./kiln-dev test` lints the chart and runs these): with default values it installs what
//! `config/default` applies but for the differences `parity::INTENDED_DIFFERENCES` lists and
//! docs/helm.md explains; with every value set in `charts/kiln/ci/` its objects pass
//! `kubernetes-validate`, every store namespace gets config's Role, and the ProfileStore it
//! creates passes the CRD schema.

mod parity;

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_operator::api::ProfileStore;
use kube::CustomResourceExt;
use parity::{Expect, INTENDED_DIFFERENCES, Intended};
use serde_json::{Value, json};

use super::{installed_tool, kustomize, repo_root, schema_check, tools_dir, write_stream};

/// The namespace config/default installs into, and the one the chart is rendered for.
const NAMESPACE: &str = "kiln-system";

/// The helm that `e2e/cluster/helm/go.mod` pins, where `build.sh` puts it.
fn helm() -> Option<PathBuf> {
    let go_mod = std::fs::read_to_string(repo_root().join("e2e/cluster/helm/go.mod"))
        .expect("e2e/cluster/helm/go.mod");
    let version = go_mod
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("helm.sh/helm/v3")).then(|| words.next())?
        })
        .expect("go.mod requires helm.sh/helm/v3");
    installed_tool(
        tools_dir().join(format!("helm-{version}/bin/helm")),
        "build it with e2e/cluster/helm/build.sh (./kiln-dev test does)",
    )
}

fn kubernetes_validate() -> Option<PathBuf> {
    installed_tool(
        tools_dir().join("venv/bin/kubernetes-validate"),
        "install it with ./kiln-dev test (pip install kubernetes-validate==1.37.0)",
    )
}

/// `kiln-<version>`, the value of Helm's `helm.sh/chart` label.
fn chart_label() -> String {
    let text =
        std::fs::read_to_string(repo_root().join("charts/kiln/Chart.yaml")).expect("Chart.yaml");
    let chart: Value = serde_yaml::from_str(&text).expect("Chart.yaml is YAML");
    format!(
        "{}-{}",
        chart["name"].as_str().expect("chart name"),
        chart["version"].as_str().expect("chart version")
    )
}

/// The value sets CI renders: the defaults (`None`) and every file in charts/kiln/ci/.
fn value_sets() -> Vec<Option<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("charts/kiln/ci"))
        .expect("charts/kiln/ci")
        .map(|entry| entry.expect("readable dir entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "charts/kiln/ci holds value sets");
    std::iter::once(None)
        .chain(files.into_iter().map(Some))
        .collect()
}

/// `helm template` of charts/kiln into NAMESPACE with the CRDs: Ok(objects) or Err(stderr).
fn helm_template(helm: &Path, values: Option<&Path>, set: &[&str]) -> Result<Vec<Value>, String> {
    let mut command = Command::new(helm);
    command
        .args(["template", "kiln"])
        .arg(repo_root().join("charts/kiln"))
        .args(["--namespace", NAMESPACE, "--include-crds"]);
    if let Some(values) = values {
        command.arg("--values").arg(values);
    }
    for assignment in set {
        command.args(["--set", assignment]);
    }
    let output = command.output().expect("helm runs");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let text = String::from_utf8(output.stdout).expect("helm prints UTF-8");
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document).expect("helm prints YAML");
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

fn config_default() -> Vec<Value> {
    kustomize::render(&repo_root().join("config/default")).expect("config/default renders")
}

#[test]
fn docs_name_every_intended_difference() {
    let docs = std::fs::read_to_string(repo_root().join("docs/helm.md")).expect("docs/helm.md");
    for entry in &INTENDED_DIFFERENCES {
        for needle in [entry.object, entry.pointer] {
            assert!(
                docs.contains(&format!("`{needle}`")) || needle.is_empty(),
                "docs/helm.md does not name the intended difference `{needle}`"
            );
        }
    }
}

#[test]
fn chart_with_default_values_installs_what_config_default_applies() {
    let Some(helm) = helm() else { return };
    let chart = helm_template(&helm, None, &[]).expect("helm template with default values");
    let problems = parity::compare(
        &config_default(),
        &chart,
        &chart_label(),
        &INTENDED_DIFFERENCES,
    );
    assert!(
        problems.is_empty(),
        "the chart and config/default differ beyond docs/helm.md's intended differences:\n{}",
        problems.join("\n")
    );
}

/// What a faithful chart would render: config/default's objects less the intended
/// differences, with Helm's labels.
fn faithful_chart(config: &[Value], label: &str) -> Vec<Value> {
    let mut chart: Vec<Value> = config
        .iter()
        .filter(|o| o["kind"] != "Namespace")
        .cloned()
        .collect();
    for object in &mut chart {
        if object["kind"] == "CustomResourceDefinition" {
            continue;
        }
        object["metadata"]["labels"]["helm.sh/chart"] = json!(label);
        object["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("Helm");
        if object["kind"] == "Deployment" {
            object["spec"]["template"]["metadata"]["labels"]["helm.sh/chart"] = json!(label);
            object["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
                json!("IfNotPresent");
        }
    }
    chart
}

#[test]
fn the_comparison_reports_every_other_difference() {
    let config = config_default();
    let label = chart_label();
    let chart = faithful_chart(&config, &label);
    let compare = |chart: &[Value]| parity::compare(&config, chart, &label, &INTENDED_DIFFERENCES);
    assert_eq!(compare(&chart), Vec::<String>::new());

    let mut granted_more = chart.clone();
    let role = granted_more
        .iter_mut()
        .find(|o| o["kind"] == "ClusterRole")
        .expect("ClusterRole");
    role["rules"][0]["verbs"]
        .as_array_mut()
        .expect("verbs")
        .push(json!("delete"));
    let problems = compare(&granted_more);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("ClusterRole/kiln-operator/rules/0/verbs"),
        "{problems:?}"
    );

    let mut without_binding = chart.clone();
    without_binding.retain(|o| o["kind"] != "RoleBinding");
    let mut extra = chart.clone();
    extra.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "x", "namespace": NAMESPACE}}));
    let mut wrong_label = chart.clone();
    wrong_label[0]["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("kustomize");
    let mut pull_always = chart.clone();
    let deployment = pull_always
        .iter_mut()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!("Always");
    for (case, needle) in [
        (
            &without_binding,
            "config/default has it, the chart does not",
        ),
        (&extra, "the chart has it, config/default does not"),
        (&wrong_label, "Helm's convention is \"Helm\""),
        (&pull_always, "no longer as documented"),
    ] {
        let problems = compare(case);
        assert!(problems.iter().any(|p| p.contains(needle)), "{problems:?}");
    }

    // An intended difference that no longer happens is reported, so the list stays true.
    let stale = [Intended {
        object: "ServiceAccount/kiln-system/kiln-operator",
        pointer: "/automountServiceAccountToken",
        in_config: Expect::Absent,
        in_chart: Expect::Equals("false"),
        why: "a test of the comparison",
    }];
    let problems = parity::compare(&config, &config, &label, &stale);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("no longer as documented")),
        "{problems:?}"
    );
}

#[test]
fn every_value_set_renders_objects_that_pass_kubernetes_validate_strict() {
    let (Some(helm), Some(validator)) = (helm(), kubernetes_validate()) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("kiln-operator-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for values in value_sets() {
        let name = values.as_deref().map_or("default values".into(), |p| {
            p.file_name().expect("file name").to_string_lossy()
        });
        let objects = helm_template(&helm, values.as_deref(), &[]).expect("helm template");
        // kubernetes-validate knows the built-in kinds; ProfileStores are checked against
        // the CRD schema by the next test.
        let built_in: Vec<Value> = objects
            .iter()
            .filter(|o| o["apiVersion"] != "kiln.dev/v1alpha1")
            .cloned()
            .collect();
        let rendered = dir.join("chart.yaml");
        write_stream(&built_in, &rendered);
        // The chart's kubeVersion floor and the newest release the validator knows.
        for version in ["1.32.0", "1.37.0"] {
            let output = Command::new(&validator)
                .args(["--strict", "-k", version])
                .arg(&rendered)
                .output()
                .expect("kubernetes-validate runs");
            let report = String::from_utf8_lossy(&output.stdout).to_string()
                + &String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success() && !report.contains("ERROR"),
                "{name}, kubernetes {version}:\n{report}"
            );
            assert_eq!(
                report.matches("passed for resource").count(),
                built_in.len(),
                "{name}, kubernetes {version}:\n{report}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn profile_store_schema_errors(object: &Value) -> Vec<String> {
    let crd = serde_json::to_value(ProfileStore::crd()).expect("CRD serializes");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut errors = Vec::new();
    schema_check::validate(
        &object["spec"],
        &schema["properties"]["spec"],
        "spec",
        &mut errors,
    );
    errors
}

fn values_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("values file");
    serde_yaml::from_str(&text).expect("values file is YAML")
}

#[test]
fn every_value_set_gives_each_store_namespace_config_rbac_and_a_valid_store() {
    let Some(helm) = helm() else { return };
    let config = config_default();
    let label = chart_label();
    let find = |objects: &[Value], kind: &str| -> Value {
        let mut object = objects
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("{kind} in config/default"))
            .clone();
        parity::integral_floats_as_integers(&mut object);
        object
    };
    let mut stores_seen = 0;
    for values in value_sets() {
        let values_doc = values.as_deref().map_or(Value::Null, values_file);
        // The default values' store too, which the chart creates only when asked.
        let set: &[&str] = if values.is_none() {
            &["profileStore.create=true"]
        } else {
            &[]
        };
        let objects = helm_template(&helm, values.as_deref(), set).expect("helm template");
        let mut namespaces: Vec<String> = values_doc["storeNamespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n.as_str().expect("namespace names").to_owned())
            .collect();
        if namespaces.is_empty() {
            namespaces.push(NAMESPACE.to_owned());
        }
        for kind in ["Role", "RoleBinding"] {
            let rendered: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
            assert_eq!(
                rendered.len(),
                namespaces.len(),
                "{values:?}: one {kind} each"
            );
            for namespace in &namespaces {
                let mut expected = find(&config, kind);
                expected["metadata"]["namespace"] = json!(namespace);
                let mut chart = rendered
                    .iter()
                    .find(|o| o["metadata"]["namespace"] == namespace.as_str())
                    .unwrap_or_else(|| panic!("{values:?}: no {kind} in {namespace}"))
                    .to_owned()
                    .clone();
                let mut problems = Vec::new();
                parity::strip_helm_labels(&mut chart, &label, &mut problems);
                problems.extend(parity::differences(&expected, &chart));
                assert!(
                    problems.is_empty(),
                    "{values:?} {kind} in {namespace}: {problems:?}"
                );
            }
        }
        for store in objects.iter().filter(|o| o["kind"] == "ProfileStore") {
            stores_seen += 1;
            assert_eq!(store["metadata"]["namespace"], NAMESPACE);
            serde_json::from_value::<ProfileStore>(store.clone())
                .unwrap_or_else(|e| panic!("{values:?}: the ProfileStore does not parse: {e}"));
            let errors = profile_store_schema_errors(store);
            assert!(errors.is_empty(), "{values:?}: {errors:?}");
        }
    }
    assert!(
        stores_seen >= 2,
        "the default and CI value sets create stores"
    );
}

#[test]
fn a_store_in_a_namespace_the_operator_may_not_write_is_refused() {
    let Some(helm) = helm() else { return };
    let error = helm_template(
        &helm,
        None,
        &["profileStore.create=true", "storeNamespaces={profiling}"],
    )
    .expect_err("the operator has no Role in kiln-system");
    assert!(
        error.contains("add kiln-system to storeNamespaces"),
        "{error}"
    );
    // Without a store in the release namespace, other store namespaces are fine.
    helm_template(&helm, None, &["storeNamespaces={profiling}"]).expect("renders");
}
