//! `[recording]`: rules that turn profiles into time series at ingest
//! (`[[recording.recording_rules]]` in the file), and how long those series
//! are kept.
//!
//! A rule list is structured, so besides the file's array of tables it is
//! also one JSON value: the `--recording-rules` flag and the
//! `KILN_RECORDING_RULES` variable take the list as a JSON array, which is
//! how the operator hands a `ProfileStore`'s rules to its pods. The list
//! serializes as that JSON text, so a rendered environment parses back.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One recording rule as written in the file or the spec; the store checks
/// it (metric name, selector, regex) when it resolves its config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecordingRuleOptions {
    /// The metric's name, e.g. `kiln_json_marshal_cpu_nanoseconds_total`.
    pub metric_name: String,
    /// The profile type recorded, e.g. `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
    pub profile_type: String,
    /// A label selector over series labels, e.g. `{namespace="shop"}` (empty: every series).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Only samples with a frame whose function is exactly this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Only samples with a frame whose function matches this regex (anchored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_regex: Option<String>,
    /// Series labels kept on the metric (group by); the rest are summed over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_by: Vec<String>,
}

/// The rules, in the order given. Deserializes from an array of tables or
/// from the JSON text of one; serializes as that JSON text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordingRuleList(pub Vec<RecordingRuleOptions>);

impl FromStr for RecordingRuleList {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        serde_json::from_str::<Vec<RecordingRuleOptions>>(text)
            .map(Self)
            .map_err(|error| format!("recording rules are not a JSON array of rules: {error}"))
    }
}

impl fmt::Display for RecordingRuleList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_string(&self.0).map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

impl Serialize for RecordingRuleList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RecordingRuleList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Tables(Vec<RecordingRuleOptions>),
            Json(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Tables(rules) => Ok(Self(rules)),
            Written::Json(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// `[recording]` in the file: where recorded series are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecordingOptions {
    /// How long the series that recording rules write are kept, e.g. `90d`;
    /// independent of the profiles' retention [default: 90d].
    #[arg(long, env = "KILN_RECORDED_RETENTION")]
    pub recorded_retention: Option<String>,
    /// Recording rules as a JSON array (the file takes `[[recording.recording_rules]]` tables).
    #[arg(long, env = "KILN_RECORDING_RULES")]
    pub recording_rules: Option<RecordingRuleList>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_list_reads_as_tables_or_json_and_writes_json_that_reads_back() {
        let rules = RecordingRuleList(vec![RecordingRuleOptions {
            metric_name: "m".to_owned(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".to_owned(),
            selector: Some("{namespace=\"shop\"}".to_owned()),
            function: None,
            function_regex: Some("json\\..*".to_owned()),
            group_by: vec!["pod".to_owned()],
        }]);
        let text = rules.to_string();
        assert_eq!(text.parse::<RecordingRuleList>().unwrap(), rules);
        let json: RecordingRuleList = serde_json::from_value(serde_json::json!(text)).unwrap();
        assert_eq!(json, rules);
        assert!("{\"metric_name\":1}".parse::<RecordingRuleList>().is_err());
        assert!("[{\"metric\":\"x\"}]".parse::<RecordingRuleList>().is_err());
    }
}
