//! `spec.recordingRules` as the API server judges it: the CRD's schema (patterns, lengths, item
//! counts) and its CEL rules together.

use kiln_operator::api::ProfileStore;
use serde_json::{Value, json};

use super::{crd_schema, schema_errors};

/// Every refusal of a store with these rules, schema and CEL alike.
fn refusals(rules: Value) -> Vec<String> {
    let object = json!({"apiVersion": "kiln.dev/v1alpha1", "kind": "ProfileStore",
                        "metadata": {"name": "x"}, "spec": {"recordingRules": rules}});
    let mut errors = schema_errors(&object);
    let store: ProfileStore = serde_json::from_value(object).expect("parses into the Rust types");
    if let Err(cel) = kube::core::cel::validate_cel(&store) {
        errors.push(format!("{cel:?}"));
    }
    errors
}

fn rule(extra: Value) -> Value {
    let mut rule = json!({
        "metricName": "kiln_cpu_nanoseconds_total",
        "profileType": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "groupBy": ["namespace"],
    });
    if let (Some(rule), Some(extra)) = (rule.as_object_mut(), extra.as_object()) {
        rule.extend(extra.clone());
    }
    rule
}

#[test]
fn a_valid_recording_rule_is_admitted() {
    let errors = refusals(json!([
        rule(json!({})),
        rule(
            json!({"metricName": "kiln_json_marshal_cpu_nanoseconds_total",
                    "selector": "{namespace=\"shop\"}", "function": "encoding/json.Marshal",
                    "groupBy": ["service_name"]})
        ),
    ]));
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn bad_recording_rules_are_refused() {
    let labels: Vec<String> = (0..17).map(|i| format!("label_{i}")).collect();
    for (extra, needle) in [
        (json!({"metricName": "kiln-cpu"}), "does not match"),
        (
            json!({"metricName": "k".repeat(201)}),
            "longer than maxLength",
        ),
        (json!({"groupBy": labels}), "more than 16 items"),
        (json!({"groupBy": ["service.name"]}), "does not match"),
        (
            json!({"function": "encoding/json.Marshal", "functionRegex": "json.*"}),
            "function or functionRegex, not both",
        ),
        (
            json!({"functionRegex": "a".repeat(2000)}),
            "longer than maxLength",
        ),
        (json!({"profileType": "process_cpu"}), "does not match"),
        (json!({"profileType": ""}), "shorter than minLength"),
        (
            json!({"selector": "x".repeat(1025)}),
            "longer than maxLength",
        ),
    ] {
        let errors = refusals(json!([rule(extra.clone())]));
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "{extra}: expected {needle:?} in {errors:?}"
        );
    }
    let too_many: Vec<Value> = (0..65)
        .map(|i| rule(json!({"metricName": format!("m{i}_total")})))
        .collect();
    let errors = refusals(json!(too_many));
    assert!(
        errors.iter().any(|e| e.contains("more than 64 items")),
        "{errors:?}"
    );
}

/// Metric names are unique through the list's map type (the API server refuses a repeated key),
/// and `groupBy` labels through its set type; `recorded` takes the retention grammar.
#[test]
fn recording_rule_keys_and_recorded_retention_are_declared() {
    let spec = &crd_schema("ProfileStore")["properties"]["spec"]["properties"];
    let rules = &spec["recordingRules"];
    assert_eq!(rules["x-kubernetes-list-type"], "map");
    assert_eq!(rules["x-kubernetes-list-map-keys"], json!(["metricName"]));
    assert_eq!(
        rules["items"]["properties"]["groupBy"]["x-kubernetes-list-type"],
        "set"
    );
    assert_eq!(
        spec["retention"]["properties"]["recorded"]["pattern"],
        spec["retention"]["properties"]["duration"]["pattern"]
    );
    let object = |recorded: &str| {
        json!({"apiVersion": "kiln.dev/v1alpha1", "kind": "ProfileStore",
               "metadata": {"name": "x"}, "spec": {"retention": {"recorded": recorded}}})
    };
    assert!(schema_errors(&object("90d")).is_empty());
    assert!(!schema_errors(&object("0d")).is_empty());
    assert!(!schema_errors(&object("forever")).is_empty());
}
