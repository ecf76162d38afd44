//! `RecordingRulesValid`: whether every recording rule of a store reached it, and if not, which
//! were left out and why.

use crate::api::ProfileStore;
use crate::api::condition::{DesiredCondition, RECORDING_RULES_VALID};
use crate::resources::recording::{RefusedRule, check_rules};

/// Reason of `RecordingRulesValid=False`: at least one rule was left out of the store's config.
pub const INVALID_RECORDING_RULE: &str = "InvalidRecordingRule";
/// Reason of `RecordingRulesValid=True`.
pub const RECORDING_RULES_RENDERED: &str = "RecordingRulesRendered";
/// Most refused rules a message names; the rest are counted. With the cut metric names and
/// fixed problem texts this keeps the message far under the API's 32 KiB.
const RULES_NAMED: usize = 16;

/// The condition for the store's rules as [`check_rules`] judges them.
pub fn recording_rules_valid(store: &ProfileStore) -> DesiredCondition {
    let rules = &store.spec.recording_rules;
    let checked = check_rules(rules);
    if checked.refused.is_empty() {
        let message = match checked.rendered.len() {
            0 => "no recording rules".to_owned(),
            1 => "1 recording rule rendered to the store".to_owned(),
            count => format!("{count} recording rules rendered to the store"),
        };
        return DesiredCondition::holds(RECORDING_RULES_VALID, RECORDING_RULES_RENDERED, message);
    }
    DesiredCondition::fails(
        RECORDING_RULES_VALID,
        INVALID_RECORDING_RULE,
        format!(
            "{} of {} recording rules left out of the store's config: {}",
            checked.refused.len(),
            rules.len(),
            named(&checked.refused)
        ),
    )
}

/// `name: problem; …`, at most [`RULES_NAMED`] of them, then how many more.
fn named(refused: &[RefusedRule]) -> String {
    let mut parts: Vec<String> = refused
        .iter()
        .take(RULES_NAMED)
        .map(|rule| {
            let name = if rule.metric_name.is_empty() {
                "(no metricName)"
            } else {
                &rule.metric_name
            };
            format!("{name}: {}", rule.problem)
        })
        .collect();
    if refused.len() > RULES_NAMED {
        parts.push(format!("and {} more", refused.len() - RULES_NAMED));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::status::fixtures::profile_store;

    fn store(rules: Value) -> ProfileStore {
        profile_store(
            "main",
            json!({}),
            json!({"recordingRules": rules}),
            Value::Null,
        )
    }

    fn rule(name: &str) -> Value {
        json!({"metricName": name, "profileType": "process_cpu:cpu:nanoseconds:cpu:nanoseconds"})
    }

    #[test]
    fn valid_rules_hold_and_say_how_many_reached_the_store() {
        let none = recording_rules_valid(&store(json!([])));
        assert_eq!(
            none,
            DesiredCondition::holds(
                RECORDING_RULES_VALID,
                RECORDING_RULES_RENDERED,
                "no recording rules"
            )
        );
        let two = recording_rules_valid(&store(json!([rule("a_total"), rule("b_total")])));
        assert!(two.status, "{two:?}");
        assert_eq!(two.message, "2 recording rules rendered to the store");
    }

    #[test]
    fn invalid_rules_fail_the_condition_naming_each_and_why() {
        let mut bad_regex = rule("json_total");
        bad_regex["functionRegex"] = json!("encoding/json.(Marshal");
        let condition = recording_rules_valid(&store(json!([
            rule("cpu_total"),
            rule("bad-name"),
            bad_regex,
            rule("cpu_total"),
        ])));
        assert!(!condition.status);
        assert_eq!(condition.type_, RECORDING_RULES_VALID);
        assert_eq!(condition.reason, INVALID_RECORDING_RULE);
        assert_eq!(
            condition.message,
            "3 of 4 recording rules left out of the store's config: \
             bad-name: metricName is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*); \
             json_total: functionRegex does not compile: unclosed group; \
             cpu_total: metricName repeats an earlier rule's"
        );
    }

    #[test]
    fn many_invalid_rules_are_counted_past_the_named_ones() {
        let rules: Vec<Value> = (0..40)
            .map(|i| rule(&format!("{i}_starts_with_a_digit")))
            .collect();
        let condition = recording_rules_valid(&store(json!(rules)));
        assert!(
            condition
                .message
                .starts_with("40 of 40 recording rules left out")
        );
        assert!(
            condition.message.ends_with("; and 24 more"),
            "{}",
            condition.message
        );
        assert_eq!(
            condition
                .message
                .matches("not a Prometheus metric name")
                .count(),
            RULES_NAMED
        );
    }
}
