//! `[recording]`: recording rules checked and compiled, and their series'
//! retention. A rule that does not compile stops the store at start with
//! the rule's metric name and why, never at an ingest.

use std::collections::BTreeSet;
use std::time::Duration;

use kiln_engine::model::ProfileType;
use kiln_engine::recording::{FunctionFilter, MAX_RULES, RecordingRule, RecordingRules};
use kiln_store_settings::{RecordingOptions, RecordingRuleOptions};

use super::ConfigError;
use crate::query::selector::parse_selector;

const RULES_SETTING: &str = "recording.recording_rules";

/// The resolved `[recording]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordingSettings {
    /// The rules as written (each one compiles; [`compile_rules`]).
    pub rules: Vec<RecordingRuleOptions>,
    /// How long recorded series are kept.
    pub retention: Duration,
}

impl RecordingSettings {
    /// Checks the section: every rule compiles, names are unique, and the
    /// retention is a positive duration.
    pub fn resolve(options: &RecordingOptions) -> Result<Self, ConfigError> {
        let retention = super::duration(
            "recording.recorded_retention",
            options.recorded_retention.as_deref(),
            "90d",
        )?;
        if retention.is_zero() {
            return Err(ConfigError::Invalid {
                setting: "recording.recorded_retention",
                message: "must be greater than 0".to_owned(),
            });
        }
        let rules = options
            .recording_rules
            .as_ref()
            .map(|list| list.0.clone())
            .unwrap_or_default();
        compile_rules(&rules)?;
        Ok(Self { rules, retention })
    }
}

/// Compiles every rule, refusing more than [`MAX_RULES`], a metric name
/// used twice, or any rule that does not compile.
pub fn compile_rules(rules: &[RecordingRuleOptions]) -> Result<RecordingRules, ConfigError> {
    if rules.len() > MAX_RULES {
        return Err(invalid(format!(
            "{} rules; at most {MAX_RULES} are evaluated",
            rules.len()
        )));
    }
    let mut names = BTreeSet::new();
    let mut compiled = Vec::with_capacity(rules.len());
    for rule in rules {
        if !names.insert(rule.metric_name.as_str()) {
            return Err(invalid(format!(
                "metric name {:?} is used by two rules",
                rule.metric_name
            )));
        }
        compiled.push(
            compile_rule(rule)
                .map_err(|message| invalid(format!("rule {:?}: {message}", rule.metric_name)))?,
        );
    }
    RecordingRules::new(compiled).map_err(|e| invalid(e.to_string()))
}

fn compile_rule(rule: &RecordingRuleOptions) -> Result<RecordingRule, String> {
    let profile_type = ProfileType::parse(&rule.profile_type).ok_or_else(|| {
        format!(
            "profile_type {:?} is not name:sample_type:sample_unit:period_type:period_unit[:delta]",
            rule.profile_type
        )
    })?;
    let match_delta = rule.profile_type.split(':').count() == 6;
    let matchers = match rule.selector.as_deref().map(str::trim) {
        None | Some("") => Vec::new(),
        Some(text) => {
            let parsed = parse_selector(text).map_err(|e| format!("selector: {e}"))?;
            if !parsed.profile_type_parts.is_empty() {
                return Err(
                    "selector names a profile type; give it in profile_type and only `{...}` here"
                        .to_owned(),
                );
            }
            parsed.matchers
        }
    };
    let function = match (&rule.function, &rule.function_regex) {
        (Some(_), Some(_)) => {
            return Err("function and function_regex are exclusive".to_owned());
        }
        (Some(exact), None) => FunctionFilter::Exact(exact.clone()),
        (None, Some(pattern)) => FunctionFilter::regex(pattern).map_err(|e| e.to_string())?,
        (None, None) => FunctionFilter::Any,
    };
    RecordingRule::new(
        &rule.metric_name,
        profile_type,
        match_delta,
        &matchers,
        function,
        &rule.group_by,
    )
    .map_err(|e| e.to_string())
}

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid {
        setting: RULES_SETTING,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_store_settings::RecordingRuleList;

    fn rule(name: &str) -> RecordingRuleOptions {
        RecordingRuleOptions {
            metric_name: name.to_owned(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".to_owned(),
            selector: Some("{namespace=\"shop\"}".to_owned()),
            group_by: vec!["pod".to_owned()],
            ..RecordingRuleOptions::default()
        }
    }

    fn resolve(rules: Vec<RecordingRuleOptions>) -> Result<RecordingSettings, ConfigError> {
        RecordingSettings::resolve(&RecordingOptions {
            recorded_retention: None,
            recording_rules: Some(RecordingRuleList(rules)),
        })
    }

    #[test]
    fn good_rules_resolve_with_the_default_retention() {
        let settings = resolve(vec![rule("a"), rule("b")]).unwrap();
        assert_eq!(settings.retention, Duration::from_secs(90 * 86_400));
        assert_eq!(compile_rules(&settings.rules).unwrap().rules().len(), 2);
    }

    #[test]
    fn bad_rules_name_the_rule_and_why() {
        let refused = |rules: Vec<RecordingRuleOptions>| resolve(rules).unwrap_err().to_string();
        assert!(refused(vec![rule("a"), rule("a")]).contains("used by two rules"));
        let mut typed = rule("a");
        typed.selector = Some("process_cpu{pod=\"x\"}".to_owned());
        assert!(refused(vec![typed]).contains("names a profile type"));
        let mut both = rule("a");
        both.function = Some("f".to_owned());
        both.function_regex = Some("g".to_owned());
        assert!(refused(vec![both]).contains("exclusive"));
        let mut bad_type = rule("a");
        bad_type.profile_type = "cpu".to_owned();
        assert!(refused(vec![bad_type]).contains("profile_type"));
        let mut bad_regex = rule("a");
        bad_regex.function_regex = Some("(".to_owned());
        assert!(refused(vec![bad_regex]).contains("rule \"a\""));
        assert!(refused(vec![rule("9a")]).contains("metric name"));
        let many: Vec<RecordingRuleOptions> = (0..65).map(|i| rule(&format!("m{i}"))).collect();
        assert!(refused(many).contains("at most 64"));
    }
}
