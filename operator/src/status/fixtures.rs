//! Objects for the status tests, shaped as the API server hands them over.

use serde_json::{Value, json};

use crate::api::ProfileStore;

/// A `ProfileStore` named `name` in namespace `kiln`, with `metadata`'s fields added to its
/// metadata (`Value::Null` for a store without status).
pub fn profile_store(name: &str, metadata: Value, spec: Value, status: Value) -> ProfileStore {
    let mut meta = json!({"name": name, "namespace": "kiln"});
    if let (Some(meta), Some(extra)) = (meta.as_object_mut(), metadata.as_object()) {
        meta.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "kiln.dev/v1alpha1",
        "kind": "ProfileStore",
        "metadata": meta,
        "spec": spec,
        "status": status,
    }))
    .expect("a valid ProfileStore")
}
