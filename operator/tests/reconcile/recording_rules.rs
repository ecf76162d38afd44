//! Recording rules reach the store through its config ConfigMap; one the operator finds invalid is
//! left out, so the store still starts, and the status says which and why.

use kiln_operator::controller::store;
use serde_json::json;

use super::{STORE_PATH, STS_PATH, condition, current_store, setup, store_json};

const CONFIG_PATH: &str = "/api/v1/namespaces/kiln/configmaps/main-config";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[tokio::test]
async fn invalid_rules_are_left_out_of_the_config_and_named_in_the_status() {
    let spec = json!({
        "retention": {"recorded": "30d"},
        "recordingRules": [
            {"metricName": "kiln_cpu_nanoseconds_total", "profileType": CPU, "groupBy": ["namespace"]},
            {"metricName": "kiln_json_total", "profileType": CPU, "functionRegex": "json.(Marshal"},
        ],
    });
    let (fake, ctx) = setup(&store_json(spec, &[]));
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    let config = fake.get(CONFIG_PATH).expect("config applied");
    assert_eq!(config["data"]["KILN_RECORDED_RETENTION"], "30d");
    let rules: serde_json::Value = serde_json::from_str(
        config["data"]["KILN_RECORDING_RULES"]
            .as_str()
            .expect("rules rendered"),
    )
    .expect("JSON");
    assert_eq!(
        rules,
        json!([{"metric_name": "kiln_cpu_nanoseconds_total", "profile_type": CPU, "group_by": ["namespace"]}])
    );
    let status = fake.get(STORE_PATH).unwrap();
    let valid = condition(&status, "RecordingRulesValid");
    assert_eq!(valid["status"], "False");
    assert_eq!(valid["reason"], "InvalidRecordingRule");
    let message = valid["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("kiln_json_total: functionRegex does not compile: unclosed group"),
        "{message}"
    );

    // Fixing the rule renders it, rolls the store and clears the condition.
    let hash = |fake: &super::FakeApi| {
        fake.get(STS_PATH).unwrap()["spec"]["template"]["metadata"]["annotations"]
            ["kiln.dev/config-hash"]
            .clone()
    };
    let before = hash(&fake);
    let mut edited = fake.get(STORE_PATH).unwrap();
    edited["spec"]["recordingRules"][1]["functionRegex"] = json!("json.(Marshal)");
    fake.put(STORE_PATH, edited);
    store::reconcile(current_store(&fake), ctx.clone())
        .await
        .unwrap();
    assert_ne!(hash(&fake), before, "a rule change rolls the store");
    let config = fake.get(CONFIG_PATH).unwrap();
    assert!(
        config["data"]["KILN_RECORDING_RULES"]
            .as_str()
            .is_some_and(|rules| rules.contains("kiln_json_total"))
    );
    let status = fake.get(STORE_PATH).unwrap();
    assert_eq!(condition(&status, "RecordingRulesValid")["status"], "True");
}
