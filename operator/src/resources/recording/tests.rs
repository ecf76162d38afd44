use std::str::FromStr;

use kiln_store_settings::RecordingRuleList;
use serde_json::{Value, json};

use super::*;
use crate::api::recording_rule::{LABEL_NAME_PATTERN, METRIC_NAME_PATTERN};
use crate::resources::StoreNames;
use crate::resources::store::{config_map, stateful_set};
use crate::resources::{BuildDefaults, CONFIG_HASH_ANNOTATION};
use crate::status::fixtures::profile_store;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn rule(name: &str) -> RecordingRuleSpec {
    RecordingRuleSpec {
        metric_name: name.to_owned(),
        profile_type: CPU.to_owned(),
        ..RecordingRuleSpec::default()
    }
}

fn store(spec: Value) -> ProfileStore {
    profile_store("main", json!({"uid": "u-1"}), spec, Value::Null)
}

fn environment(store: &ProfileStore) -> std::collections::BTreeMap<String, String> {
    let names = StoreNames::of(store).expect("names");
    config_map(store, &names)
        .expect("builds")
        .data
        .unwrap_or_default()
}

#[test]
fn rendered_rules_are_json_in_kiln_recording_rules_that_parses_back() {
    let store = store(json!({
        "retention": {"recorded": "90d"},
        "recordingRules": [
            {"metricName": "kiln_cpu_nanoseconds_total", "profileType": CPU, "groupBy": ["namespace"]},
            {"metricName": "kiln_json_marshal_cpu_nanoseconds_total", "profileType": CPU,
             "selector": " {namespace=\"shop\"} ", "function": "encoding/json.Marshal",
             "groupBy": ["service_name"]},
        ],
    }));
    let env = environment(&store);
    assert_eq!(env["KILN_RECORDED_RETENTION"], "90d");
    let rules = RecordingRuleList::from_str(&env["KILN_RECORDING_RULES"]).expect("parses back");
    assert_eq!(
        rules.0,
        [
            RecordingRuleOptions {
                metric_name: "kiln_cpu_nanoseconds_total".to_owned(),
                profile_type: CPU.to_owned(),
                group_by: vec!["namespace".to_owned()],
                ..RecordingRuleOptions::default()
            },
            RecordingRuleOptions {
                metric_name: "kiln_json_marshal_cpu_nanoseconds_total".to_owned(),
                profile_type: CPU.to_owned(),
                selector: Some("{namespace=\"shop\"}".to_owned()),
                function: Some("encoding/json.Marshal".to_owned()),
                function_regex: None,
                group_by: vec!["service_name".to_owned()],
            },
        ]
    );
}

#[test]
fn no_rules_and_no_retention_render_no_variables() {
    let env = environment(&store(json!({})));
    assert!(!env.contains_key("KILN_RECORDING_RULES"), "{env:?}");
    assert!(!env.contains_key("KILN_RECORDED_RETENTION"), "{env:?}");
    // Only invalid rules: still no variable, so the store starts as if there were none.
    let env = environment(&store(
        json!({"recordingRules": [{"metricName": "1x", "profileType": CPU}]}),
    ));
    assert!(!env.contains_key("KILN_RECORDING_RULES"), "{env:?}");
}

#[test]
fn a_rule_change_rolls_the_store_pods() {
    let hash = |spec: Value| {
        let store = store(spec);
        let names = StoreNames::of(&store).expect("names");
        let config = config_map(&store, &names).expect("builds");
        let set = stateful_set(&store, &names, &config, &BuildDefaults::default()).expect("builds");
        set.spec
            .template
            .metadata
            .and_then(|meta| meta.annotations)
            .and_then(|annotations| annotations.get(CONFIG_HASH_ANNOTATION).cloned())
            .expect("the pod template carries the config hash")
    };
    let one = json!({"recordingRules": [{"metricName": "a_total", "profileType": CPU}]});
    let other = json!({"recordingRules": [{"metricName": "b_total", "profileType": CPU}]});
    assert_eq!(hash(one.clone()), hash(one.clone()));
    assert_ne!(hash(one), hash(other));
}

#[test]
fn invalid_rules_are_left_out_and_reported_in_order() {
    let mut both = rule("both_total");
    both.function = Some("f".to_owned());
    both.function_regex = Some("f.*".to_owned());
    let checked = check_rules(&[
        rule("a_total"),
        rule("bad name"),
        both,
        rule("a_total"),
        rule("b_total"),
    ]);
    let kept: Vec<&str> = checked
        .rendered
        .iter()
        .map(|r| r.metric_name.as_str())
        .collect();
    assert_eq!(kept, ["a_total", "b_total"]);
    assert_eq!(
        checked.refused,
        [
            RefusedRule {
                metric_name: "bad name".to_owned(),
                problem: RuleProblem::MetricName
            },
            RefusedRule {
                metric_name: "both_total".to_owned(),
                problem: RuleProblem::FunctionAndRegex
            },
            RefusedRule {
                metric_name: "a_total".to_owned(),
                problem: RuleProblem::DuplicateMetricName
            },
        ]
    );
}

/// Everything the CRD's schema refuses, refused again for API servers that skip it.
#[test]
fn each_schema_limit_is_checked_again() {
    let with = |change: &dyn Fn(&mut RecordingRuleSpec)| {
        let mut rule = rule("m_total");
        change(&mut rule);
        check_rule(&rule).expect_err("refused")
    };
    let long = |n: usize| "a".repeat(n);
    assert_eq!(
        with(&|r| r.metric_name = String::new()),
        RuleProblem::Empty {
            field: "metricName"
        }
    );
    assert_eq!(
        with(&|r| r.metric_name = long(201)),
        RuleProblem::TooLong {
            field: "metricName",
            length: 201,
            max: 200
        }
    );
    assert_eq!(
        with(&|r| r.metric_name = "9lives".to_owned()),
        RuleProblem::MetricName
    );
    assert_eq!(
        with(&|r| r.profile_type = "process_cpu".to_owned()),
        RuleProblem::ProfileType
    );
    assert_eq!(
        with(&|r| r.profile_type = ":a:b:c:d".to_owned()),
        RuleProblem::ProfileType
    );
    assert_eq!(
        with(&|r| r.profile_type = format!("{}:a:b:c:d", long(300))),
        RuleProblem::TooLong {
            field: "profileType",
            length: 308,
            max: 256
        }
    );
    assert_eq!(
        with(&|r| r.selector = Some(format!("{{a=\"{}\"}}", long(1030)))),
        RuleProblem::TooLong {
            field: "selector",
            length: 1036,
            max: 1024
        }
    );
    assert_eq!(
        with(&|r| r.selector = Some("namespace=\"shop\"".to_owned())),
        RuleProblem::Selector
    );
    assert_eq!(
        with(&|r| r.function = Some(String::new())),
        RuleProblem::Empty { field: "function" }
    );
    assert_eq!(
        with(&|r| r.function_regex = Some(long(2000))),
        RuleProblem::TooLong {
            field: "functionRegex",
            length: 2000,
            max: 1024
        }
    );
    assert_eq!(
        with(&|r| r.group_by = (0..17).map(|i| format!("l{i}")).collect()),
        RuleProblem::TooManyGroupByLabels { count: 17, max: 16 }
    );
    assert_eq!(
        with(&|r| r.group_by = vec!["service.name".to_owned()]),
        RuleProblem::GroupByLabel {
            label: "service.name".to_owned(),
            max: 128
        }
    );
    assert_eq!(
        with(&|r| r.group_by = vec![long(129)]),
        RuleProblem::GroupByLabel {
            label: format!("{}…", long(64)),
            max: 128
        }
    );
    assert_eq!(
        with(&|r| r.group_by = vec!["pod".to_owned(), "pod".to_owned()]),
        RuleProblem::DuplicateGroupByLabel {
            label: "pod".to_owned()
        }
    );
    let mut fine = rule("m:total_");
    fine.selector = Some("  ".to_owned());
    fine.function_regex = Some("encoding/json\\..*".to_owned());
    fine.group_by = (0..16).map(|i| format!("_l{i}")).collect();
    let options = check_rule(&fine).expect("valid");
    assert_eq!(options.selector, None, "a blank selector is no selector");
}

#[test]
fn regexes_must_compile_within_the_size_limit() {
    let problem = |pattern: &str| {
        let mut rule = rule("m_total");
        rule.function_regex = Some(pattern.to_owned());
        check_rule(&rule).err()
    };
    assert_eq!(problem("json\\.(Marshal|Unmarshal)"), None);
    assert_eq!(
        problem("json.(Marshal"),
        Some(RuleProblem::Regex {
            reason: "unclosed group".to_owned()
        })
    );
    // Unbalanced the other way: wrapping the pattern before compiling would have hidden this.
    assert_eq!(
        problem("a)|(b"),
        Some(RuleProblem::Regex {
            reason: "unopened group".to_owned()
        })
    );
    match problem("\\w{1000}") {
        Some(RuleProblem::Regex { reason }) => assert!(reason.contains("more than"), "{reason}"),
        other => panic!("a huge program must be refused: {other:?}"),
    }
}

#[test]
fn rules_past_the_count_or_the_byte_budget_are_left_out() {
    let many: Vec<RecordingRuleSpec> = (0..70).map(|i| rule(&format!("m{i}_total"))).collect();
    let checked = check_rules(&many);
    assert_eq!(checked.rendered.len(), MAX_RECORDING_RULES);
    assert_eq!(checked.refused.len(), 6);
    assert_eq!(
        checked.refused[0].problem,
        RuleProblem::TooManyRules { max: 64 }
    );
    let big: Vec<RecordingRuleSpec> = (0..64)
        .map(|i| {
            let mut rule = rule(&format!("m{i}_total"));
            rule.selector = Some(format!("{{a=\"{}\"}}", "x".repeat(1000)));
            rule.function = Some("f".repeat(1024));
            rule.group_by = (0..16).map(|l| format!("{}{l}", "l".repeat(120))).collect();
            rule
        })
        .collect();
    let checked = check_rules(&big);
    assert!(!checked.rendered.is_empty() && !checked.refused.is_empty());
    assert!(checked.refused.iter().all(|r| r.problem
        == RuleProblem::OverRenderBudget {
            max_bytes: MAX_RENDERED_RULES_BYTES
        }));
    let json = RecordingRuleList(checked.rendered).to_string();
    assert!(json.len() <= MAX_RENDERED_RULES_BYTES, "{}", json.len());
}

#[test]
fn name_checks_agree_with_the_schema_patterns() {
    let metric = regex::Regex::new(METRIC_NAME_PATTERN).expect("valid");
    let label = regex::Regex::new(LABEL_NAME_PATTERN).expect("valid");
    for text in [
        "a", "_a", ":a", "a:b", "A9_", "9a", "a-b", "", "é", "a b", "__name__",
    ] {
        assert_eq!(
            is_name(text, true),
            metric.is_match(text),
            "metric {text:?}"
        );
        assert_eq!(is_name(text, false), label.is_match(text), "label {text:?}");
    }
}
