//! `spec.recordingRules`: rules that turn a store's profiles into Prometheus counters at ingest.
//!
//! The limits below are both the CRD's schema (so the API server refuses a bad rule, and the
//! CEL cost estimate of the one rule here stays bounded) and what
//! [`crate::resources::recording`] checks again before it renders rules to the store, for API
//! servers that skip validation.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// A Prometheus metric name.
pub const METRIC_NAME_PATTERN: &str = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$";
/// A Prometheus label name.
pub const LABEL_NAME_PATTERN: &str = r"^[a-zA-Z_][a-zA-Z0-9_]*$";
/// A profile type, `name:sample_type:sample_unit:period_type:period_unit`: a name, then four
/// parts that may be empty (`memory:inuse_space:bytes::`), as the store's selectors write it.
pub const PROFILE_TYPE_PATTERN: &str = r"^[^:]+(:[^:]*){4}(:delta)?$";
/// Most rules one store takes.
pub const MAX_RECORDING_RULES: usize = 64;
/// Longest metric name.
pub const MAX_METRIC_NAME_LENGTH: usize = 200;
/// Longest profile type.
pub const MAX_PROFILE_TYPE_LENGTH: usize = 256;
/// Longest selector, function name or function regex.
pub const MAX_MATCH_TEXT_LENGTH: usize = 1024;
/// Most `groupBy` labels of one rule.
pub const MAX_GROUP_BY_LABELS: usize = 16;
/// Longest `groupBy` label name.
pub const MAX_GROUP_BY_LABEL_LENGTH: usize = 128;

/// One recording rule: the samples of one profile type, optionally narrowed to some series and to
/// stacks through one function, summed per `groupBy` labels into a counter the store serves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
// `function` is a reserved word in CEL, so the API server names the field `__function__` in rules
// (and refuses a CRD whose rule says `self.function`).
#[x_kube(validation = Rule::new("!has(self.__function__) || !has(self.functionRegex)").message("a recording rule takes function or functionRegex, not both").reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct RecordingRuleSpec {
    /// Name of the counter the rule writes, a Prometheus metric name unique among the store's
    /// rules, e.g. `kiln_cpu_nanoseconds_total`.
    #[schemars(length(min = 1, max = 200), pattern(METRIC_NAME_PATTERN))]
    pub metric_name: String,
    /// Profile type whose samples are counted,
    /// `name:sample_type:sample_unit:period_type:period_unit`, e.g.
    /// `process_cpu:cpu:nanoseconds:cpu:nanoseconds` (counted whether agents send deltas or
    /// not); a sixth part `:delta` counts delta profiles only.
    #[schemars(length(min = 1, max = 256), pattern(PROFILE_TYPE_PATTERN))]
    pub profile_type: String,
    /// Series label matchers, e.g. `{namespace="shop"}`; every series of the profile type when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub selector: Option<String>,
    /// Count only samples whose stack has a frame of exactly this function, e.g.
    /// `encoding/json.Marshal`. Not together with `functionRegex`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub function: Option<String>,
    /// Count only samples whose stack has a frame whose function matches this regular
    /// expression (RE2 syntax, anchored at both ends). Not together with `function`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub function_regex: Option<String>,
    /// Series labels the counter keeps, e.g. `[namespace]`; the others are summed over. Without
    /// any, the rule writes one series.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(min = 1, max = 128), pattern(LABEL_NAME_PATTERN))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub group_by: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants the resource checks use are the ones the schema attributes spell out.
    #[test]
    fn schema_limits_equal_the_checked_limits() {
        let schema = serde_json::to_value(
            schemars::SchemaGenerator::default().into_root_schema_for::<RecordingRuleSpec>(),
        )
        .expect("schema serializes");
        let property = |name: &str| schema["properties"][name].clone();
        let max = |value: &serde_json::Value, key: &str| value[key].as_u64().map(|n| n as usize);
        assert_eq!(
            max(&property("metricName"), "maxLength"),
            Some(MAX_METRIC_NAME_LENGTH)
        );
        assert_eq!(
            max(&property("profileType"), "maxLength"),
            Some(MAX_PROFILE_TYPE_LENGTH)
        );
        for name in ["selector", "function", "functionRegex"] {
            assert_eq!(
                max(&property(name), "maxLength"),
                Some(MAX_MATCH_TEXT_LENGTH),
                "{name}"
            );
        }
        let group_by = property("groupBy");
        assert_eq!(max(&group_by, "maxItems"), Some(MAX_GROUP_BY_LABELS));
        assert_eq!(
            max(&group_by["items"], "maxLength"),
            Some(MAX_GROUP_BY_LABEL_LENGTH)
        );
        assert_eq!(group_by["items"]["pattern"], LABEL_NAME_PATTERN);
        assert_eq!(group_by["x-kubernetes-list-type"], "set");
    }

    #[test]
    fn profile_types_need_a_name_and_five_parts() {
        let pattern = regex::Regex::new(PROFILE_TYPE_PATTERN).expect("valid pattern");
        for good in [
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "memory:inuse_space:bytes::",
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta",
        ] {
            assert!(pattern.is_match(good), "{good}");
        }
        for bad in [
            "",
            "process_cpu",
            ":cpu:nanoseconds:cpu:nanoseconds",
            "a:b:c:d:e:f",
        ] {
            assert!(!pattern.is_match(bad), "{bad}");
        }
    }
}
