//! Recording rules as pure logic: a rule compiled once, the values a checked
//! profile gives each rule ([`crate::CheckedIngest::recorded_values`]), and
//! the recorded series those values are summed into ([`RecordedPoints`]),
//! with their file encoding for the bucket.
//!
//! A rule sums, per profile, the values of one profile type over the
//! samples of the series its matchers select, optionally only the samples
//! with a frame of a given function, grouped by some of the series labels.
//! Evaluating at ingest makes a month's chart cost a month of points, not a
//! month of profiles.

mod files;
mod points;
mod rule_set;

pub use files::{RecordedFile, select_recorded};
pub use points::{RECORDED_RESOLUTION_MS, RecordedFileError, RecordedPoints, Steps, bucket_of};
pub use rule_set::RecordingRules;

use crate::index::{CompiledMatcher, compile_anchored_regex};

use crate::model::{Label, LabelSet, Matcher, ProfileType};
use crate::{QueryError, RegexRejection};

/// The label holding a recorded series' metric name, as in Prometheus.
pub const METRIC_NAME_LABEL: &str = "__name__";
/// Most rules one store evaluates: each costs every ingest a pass.
pub const MAX_RULES: usize = 64;
/// Most labels one rule keeps.
pub const MAX_GROUP_BY: usize = 16;
/// Longest metric or label name accepted.
pub const MAX_NAME_BYTES: usize = 200;

/// Why a rule cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// The metric name is not a Prometheus metric name.
    #[error(
        "metric name {name:?} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, at most {MAX_NAME_BYTES} bytes)"
    )]
    MetricName {
        /// The name (its first 256 characters).
        name: String,
    },
    /// A group-by label is not a Prometheus label name, or repeats.
    #[error("group_by label {name:?} is not a Prometheus label name or is named twice")]
    GroupBy {
        /// The label name (its first 256 characters).
        name: String,
    },
    /// More rules than one store evaluates.
    #[error("{count} recording rules; at most {MAX_RULES} are evaluated")]
    TooManyRules {
        /// How many were given.
        count: usize,
    },
    /// More group-by labels than allowed.
    #[error("group_by names {count} labels; at most {MAX_GROUP_BY} are kept")]
    TooManyGroupBy {
        /// How many were named.
        count: usize,
    },
    /// A selector matcher's regex was refused.
    #[error("selector: {source}")]
    Matcher {
        /// The compile error.
        #[source]
        source: QueryError,
    },
    /// The function filter's regex was refused.
    #[error("function_regex {pattern:?}: {source}")]
    FunctionRegex {
        /// The pattern (its first 256 characters).
        pattern: String,
        /// Why.
        #[source]
        source: RegexRejection,
    },
}

/// Which samples of a selected series a rule counts.
#[derive(Debug, Clone)]
pub enum FunctionFilter {
    /// Every sample.
    Any,
    /// Samples with a frame (inlined ones included) of exactly this function.
    Exact(String),
    /// Samples with a frame whose function matches this anchored regex.
    Regex(regex::Regex),
}

impl FunctionFilter {
    /// True when a frame of function `name` makes a sample count.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(exact) => name == exact,
            Self::Regex(regex) => regex.is_match(name),
        }
    }

    /// The function regex, compiled anchored within the selector's limits
    /// ([`crate::index::MAX_REGEX_BYTES`]).
    pub fn regex(pattern: &str) -> Result<Self, RuleError> {
        compile_anchored_regex(pattern)
            .map(Self::Regex)
            .map_err(|source| RuleError::FunctionRegex {
                pattern: pattern.chars().take(256).collect(),
                source,
            })
    }
}

/// One compiled recording rule.
#[derive(Debug, Clone)]
pub struct RecordingRule {
    metric_name: String,
    profile_type: ProfileType,
    /// Whether `profile_type.delta` must match too; a type written with
    /// five parts takes both, as a user who names CPU time means it
    /// whether an agent sent it as deltas or not.
    match_delta: bool,
    matchers: Vec<CompiledMatcher>,
    function: FunctionFilter,
    group_by: Vec<String>,
}

impl RecordingRule {
    /// Compiles a rule; every name and pattern is checked here, so a rule
    /// that compiles cannot fail at ingest. With `match_delta` false the
    /// rule reads `profile_type` whether its values are deltas or not.
    pub fn new(
        metric_name: &str,
        profile_type: ProfileType,
        match_delta: bool,
        matchers: &[Matcher],
        function: FunctionFilter,
        group_by: &[String],
    ) -> Result<Self, RuleError> {
        if !is_metric_name(metric_name) {
            return Err(RuleError::MetricName {
                name: metric_name.chars().take(256).collect(),
            });
        }
        if group_by.len() > MAX_GROUP_BY {
            return Err(RuleError::TooManyGroupBy {
                count: group_by.len(),
            });
        }
        for (i, name) in group_by.iter().enumerate() {
            if !is_label_name(name) || group_by[..i].contains(name) {
                return Err(RuleError::GroupBy {
                    name: name.chars().take(256).collect(),
                });
            }
        }
        let matchers = matchers
            .iter()
            .map(CompiledMatcher::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| RuleError::Matcher { source })?;
        Ok(Self {
            metric_name: metric_name.to_owned(),
            profile_type,
            match_delta,
            matchers,
            function,
            group_by: group_by.to_vec(),
        })
    }

    /// The metric name.
    pub fn metric_name(&self) -> &str {
        &self.metric_name
    }

    /// True when the rule reads values of `profile_type` from a series
    /// labelled `labels`.
    pub fn selects(&self, profile_type: &ProfileType, labels: &LabelSet) -> bool {
        let wanted = &self.profile_type;
        let same_type = profile_type.name == wanted.name
            && profile_type.sample_type == wanted.sample_type
            && profile_type.sample_unit == wanted.sample_unit
            && profile_type.period_type == wanted.period_type
            && profile_type.period_unit == wanted.period_unit
            && (!self.match_delta || profile_type.delta == wanted.delta);
        same_type && self.matchers.iter().all(|m| m.matches_labels(labels))
    }

    /// The function filter.
    pub fn function(&self) -> &FunctionFilter {
        &self.function
    }

    /// The recorded series' labels for a series labelled `labels`: the
    /// metric name and the group-by labels the series has (a label it
    /// lacks is left out, as Prometheus leaves out empty labels).
    pub fn recorded_labels(&self, labels: &LabelSet) -> LabelSet {
        let mut kept = Vec::with_capacity(self.group_by.len() + 1);
        kept.push(Label::new(METRIC_NAME_LABEL, self.metric_name.as_str()));
        for name in &self.group_by {
            if let Some(value) = labels.get(name).filter(|v| !v.is_empty()) {
                kept.push(Label::new(name.as_str(), value));
            }
        }
        LabelSet::new(kept)
    }
}

/// What one profile gives one rule: a value for one recorded series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedValue {
    /// The recorded series (metric name and group-by labels).
    pub labels: LabelSet,
    /// The sum of the counted samples' values.
    pub value: i64,
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, within [`MAX_NAME_BYTES`].
pub fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= MAX_NAME_BYTES
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, within [`MAX_NAME_BYTES`].
pub fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= MAX_NAME_BYTES
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests;
