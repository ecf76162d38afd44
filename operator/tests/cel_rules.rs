//! The CEL rules in the CRD, evaluated locally by kube's CEL interpreter exactly as the API
//! server would on create and update.

use std::collections::BTreeMap;

use kiln_operator::api::profiling_target::MAX_LABEL_NAME_LENGTH;
use kiln_operator::api::{ProfileStore, ProfileStoreSpec, ProfilingTarget, ProfilingTargetSpec};

fn store(spec: serde_json::Value) -> ProfileStore {
    let spec: ProfileStoreSpec = serde_json::from_value(spec).expect("valid spec");
    ProfileStore::new("main", spec)
}

#[test]
fn one_replica_needs_no_object_storage() {
    kube::core::cel::validate_cel(&store(serde_json::json!({}))).expect("valid");
}

#[test]
fn more_replicas_without_object_storage_are_rejected() {
    let errors = kube::core::cel::validate_cel(&store(serde_json::json!({"replicas": 3})))
        .expect_err("replicas 3 without a bucket must fail");
    assert!(
        format!("{errors:?}").contains("objectStorage"),
        "{errors:?}"
    );
    kube::core::cel::validate_cel(&store(serde_json::json!({
        "replicas": 3, "objectStorage": {"bucket": "profiles"}
    })))
    .expect("replicas with a bucket are fine");
}

#[test]
fn storage_can_grow_but_not_shrink() {
    let old = store(serde_json::json!({"storage": {"size": "10Gi"}}));
    let grown = store(serde_json::json!({"storage": {"size": "20Gi"}}));
    let same_in_other_units = store(serde_json::json!({"storage": {"size": "10240Mi"}}));
    let shrunk = store(serde_json::json!({"storage": {"size": "5Gi"}}));
    kube::core::cel::validate_cel_update(&grown, &old).expect("growing is allowed");
    kube::core::cel::validate_cel_update(&same_in_other_units, &old)
        .expect("equal size is allowed");
    let errors =
        kube::core::cel::validate_cel_update(&shrunk, &old).expect_err("shrinking must fail");
    assert!(
        format!("{errors:?}").contains("can only grow"),
        "{errors:?}"
    );
}

#[test]
fn storage_class_and_ephemeral_are_immutable() {
    let old = store(serde_json::json!({"storage": {"storageClassName": "fast"}}));
    let changed = store(serde_json::json!({"storage": {"storageClassName": "slow"}}));
    assert!(kube::core::cel::validate_cel_update(&changed, &old).is_err());
    // A rule on the optional field itself would skip these two: it runs only when both set it.
    let unset = store(serde_json::json!({}));
    let errors = kube::core::cel::validate_cel_update(&old, &unset)
        .expect_err("setting a class after creation must fail");
    assert!(
        format!("{errors:?}").contains("storage.storageClassName is immutable"),
        "{errors:?}"
    );
    assert!(kube::core::cel::validate_cel_update(&unset, &old).is_err());
    kube::core::cel::validate_cel_update(&old, &old).expect("an unchanged class is fine");
    let persistent = store(serde_json::json!({}));
    let ephemeral = store(serde_json::json!({"storage": {"ephemeral": true}}));
    assert!(kube::core::cel::validate_cel_update(&ephemeral, &persistent).is_err());
    kube::core::cel::validate_cel_update(&persistent, &persistent).expect("unchanged is fine");
}

/// The store refuses a debug file cap under 64 KiB at start (no real debug file fits), so the
/// CRD refuses it first instead of leaving a crash-looping StatefulSet.
#[test]
fn a_debug_file_cap_under_64ki_is_rejected() {
    let capped = |size: &str| {
        kube::core::cel::validate_cel(&store(serde_json::json!({
            "symbolization": {"maxDebugFileSize": size}
        })))
    };
    for fine in ["64Ki", "65536", "1Gi", "0.5Mi"] {
        capped(fine).unwrap_or_else(|errors| panic!("{fine}: {errors:?}"));
    }
    for small in ["63Ki", "65535", "1k"] {
        let errors = capped(small).expect_err(small);
        assert!(
            format!("{errors:?}").contains("maxDebugFileSize must be at least 64Ki"),
            "{small}: {errors:?}"
        );
    }
    kube::core::cel::validate_cel(&store(serde_json::json!({"symbolization": {}})))
        .expect("no cap: the store's default");
}

fn target_with_label(name: String) -> ProfilingTarget {
    let mut spec: ProfilingTargetSpec =
        serde_json::from_value(serde_json::json!({"storeRef": {"name": "main"}}))
            .expect("valid spec");
    spec.labels = BTreeMap::from([(name, "v".to_owned())]);
    ProfilingTarget::new("web", spec)
}

/// Label names are bounded by a CEL rule (a structural schema cannot bound map keys), so one
/// target cannot bloat the targets file that every tenant shares.
#[test]
fn label_names_longer_than_63_characters_are_rejected() {
    kube::core::cel::validate_cel(&target_with_label("n".repeat(MAX_LABEL_NAME_LENGTH)))
        .expect("the longest allowed name passes");
    let errors =
        kube::core::cel::validate_cel(&target_with_label("n".repeat(MAX_LABEL_NAME_LENGTH + 1)))
            .expect_err("a longer name must fail");
    assert!(
        format!("{errors:?}").contains("label names are at most 63 characters"),
        "{errors:?}"
    );
}

#[test]
fn an_allow_from_entry_needs_a_selector() {
    let errors = kube::core::cel::validate_cel(&store(serde_json::json!({
        "networkPolicy": {"enabled": true, "allowFrom": [{}]}
    })))
    .expect_err("an empty peer would admit nothing the API server accepts");
    assert!(format!("{errors:?}").contains("allowFrom"), "{errors:?}");
    kube::core::cel::validate_cel(&store(serde_json::json!({
        "networkPolicy": {"enabled": true, "allowFrom": [{"podSelector": {"app": "grafana"}}]}
    })))
    .expect("a pod selector is enough");
}

fn recording_rule(extra: serde_json::Value) -> serde_json::Value {
    let mut rule = serde_json::json!({
        "metricName": "kiln_json_marshal_cpu_nanoseconds_total",
        "profileType": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "groupBy": ["service_name"],
    });
    if let (Some(rule), Some(extra)) = (rule.as_object_mut(), extra.as_object()) {
        rule.extend(extra.clone());
    }
    rule
}

#[test]
fn a_recording_rule_takes_function_or_function_regex_but_not_both() {
    for one in [
        serde_json::json!({"function": "encoding/json.Marshal"}),
        serde_json::json!({"functionRegex": "encoding/json\\..*"}),
        serde_json::json!({}),
    ] {
        kube::core::cel::validate_cel(&store(serde_json::json!({
            "recordingRules": [recording_rule(one.clone())]
        })))
        .unwrap_or_else(|errors| panic!("{one} is valid: {errors:?}"));
    }
    let errors = kube::core::cel::validate_cel(&store(serde_json::json!({
        "recordingRules": [recording_rule(serde_json::json!({
            "function": "encoding/json.Marshal", "functionRegex": "encoding/json\\..*"
        }))]
    })))
    .expect_err("both must fail");
    assert!(
        format!("{errors:?}").contains("function or functionRegex, not both"),
        "{errors:?}"
    );
}

#[test]
fn a_pprof_scrape_may_not_take_longer_than_its_interval() {
    let scraped = |pprof: serde_json::Value| {
        let spec: ProfilingTargetSpec = serde_json::from_value(serde_json::json!({
            "storeRef": {"name": "main"}, "pprof": pprof
        }))
        .expect("valid spec");
        ProfilingTarget::new("go", spec)
    };
    kube::core::cel::validate_cel(&scraped(serde_json::json!({"port": 6060})))
        .expect("the defaults pass");
    // The port is an int-or-string; the object rule beside it reads a name as well.
    kube::core::cel::validate_cel(&scraped(serde_json::json!({"port": "http-debug"})))
        .expect("a named port passes");
    let errors = kube::core::cel::validate_cel(&scraped(serde_json::json!({
        "port": 6060, "intervalSeconds": 10, "timeoutSeconds": 20
    })))
    .expect_err("a timeout past the interval must fail");
    assert!(
        format!("{errors:?}").contains("pprof.timeoutSeconds must be at most"),
        "{errors:?}"
    );
}
