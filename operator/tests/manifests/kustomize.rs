//! Renders the subset of kustomize that `config/` uses (`resources` files and directories,
//! `namespace`), so CI validates exactly what `kubectl apply -k` would send.

use std::path::Path;

use serde_json::Value;

/// Kinds that have no namespace; kustomize leaves them alone.
const CLUSTER_SCOPED: [&str; 4] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
];

/// Every object `kustomize build dir` would emit.
pub fn render(dir: &Path) -> Result<Vec<Value>, String> {
    let kustomization_path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization_path)
        .map_err(|e| format!("{}: {e}", kustomization_path.display()))?;
    let kustomization: Value = serde_yaml::from_str(&text)
        .map_err(|e| format!("{}: {e}", kustomization_path.display()))?;
    if let Some(map) = kustomization.as_object() {
        for key in map.keys() {
            if key != "resources" && key != "namespace" {
                return Err(format!(
                    "{}: field {key:?} is not supported by this renderer; extend it",
                    kustomization_path.display()
                ));
            }
        }
    }
    let mut objects = Vec::new();
    for resource in kustomization["resources"].as_array().into_iter().flatten() {
        let relative = resource.as_str().ok_or("resources entries are strings")?;
        let path = dir.join(relative);
        if path.is_dir() {
            objects.extend(render(&path)?);
        } else {
            objects.extend(load_documents(&path)?);
        }
    }
    if let Some(namespace) = kustomization["namespace"].as_str() {
        for object in &mut objects {
            set_namespace(object, namespace);
        }
    }
    Ok(objects)
}

/// Every non-empty YAML document of a file.
pub fn load_documents(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

fn set_namespace(object: &mut Value, namespace: &str) {
    let kind = object["kind"].as_str().unwrap_or("").to_owned();
    if !CLUSTER_SCOPED.contains(&kind.as_str()) {
        object["metadata"]["namespace"] = Value::String(namespace.to_owned());
    }
    // Like kustomize: ServiceAccount subjects of bindings follow the namespace.
    if kind.ends_with("RoleBinding")
        && let Some(subjects) = object["subjects"].as_array_mut()
    {
        for subject in subjects {
            if subject["kind"] == "ServiceAccount" {
                subject["namespace"] = Value::String(namespace.to_owned());
            }
        }
    }
}
