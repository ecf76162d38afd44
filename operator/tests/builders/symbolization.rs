//! Issue 51: `spec.symbolization` reaches the store as its own flags, and only what the spec
//! sets: an unset field keeps the store's default.

use kiln_operator::resources::store;
use serde_json::json;

use super::profile_store;

fn symbolization_args(spec: serde_json::Value) -> Vec<String> {
    store::store_args(&profile_store(json!({"symbolization": spec})))
        .expect("renders")
        .into_iter()
        .filter(|arg| arg.contains("debuginfo") || arg.contains("symbol"))
        .collect()
}

#[test]
fn symbolization_fields_become_the_stores_flags() {
    assert_eq!(
        symbolization_args(json!({
            "debuginfodUrls": ["https://debuginfod.debian.net", "http://debuginfod.tools.svc:8002"],
            "acceptUploads": false,
            "maxDebugFileSize": "1Gi",
            "cacheSize": "256Mi"
        })),
        [
            "--debuginfod-urls=https://debuginfod.debian.net,http://debuginfod.tools.svc:8002",
            "--debuginfo-max-bytes=1073741824",
            "--debuginfo-uploads=false",
            "--symbol-cache-bytes=268435456",
        ]
    );
}

#[test]
fn an_unset_symbolization_keeps_the_stores_defaults() {
    assert!(symbolization_args(json!({})).is_empty());
    assert!(symbolization_args(json!({"acceptUploads": true})).is_empty());
    let args = store::store_args(&profile_store(json!({}))).expect("renders");
    assert!(
        !args
            .iter()
            .any(|arg| arg.contains("debuginfo") || arg.contains("symbol")),
        "{args:?}"
    );
}
