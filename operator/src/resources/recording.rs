//! A store's recording rules as the store takes them (`kiln_store_settings::RecordingOptions`),
//! each rule checked first. The CRD's schema refuses most bad rules, but an API server that skips
//! validation, or a rule the schema cannot judge (a regex that does not compile), would stop the
//! store at start-up: such a rule is left out here, and the status names it.

use kiln_store_settings::{RecordingOptions, RecordingRuleList, RecordingRuleOptions};

use crate::api::ProfileStore;
use crate::api::recording_rule::{
    MAX_GROUP_BY_LABEL_LENGTH, MAX_GROUP_BY_LABELS, MAX_MATCH_TEXT_LENGTH, MAX_METRIC_NAME_LENGTH,
    MAX_PROFILE_TYPE_LENGTH, MAX_RECORDING_RULES, RecordingRuleSpec,
};

/// Most bytes a `functionRegex` may compile to. A short pattern can still compile to a huge
/// program (`\w{1000}` with Unicode classes), and the store keeps one per rule.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Most bytes of the rules' JSON in `KILN_RECORDING_RULES`. Linux refuses to start a process
/// with one environment string over 128 KiB, and 64 rules at the schema's limits come to more.
pub const MAX_RENDERED_RULES_BYTES: usize = 96 * 1024;

/// Why one rule is left out of the store's config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleProblem {
    /// `metricName` is not a Prometheus metric name.
    #[error("metricName is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)")]
    MetricName,
    /// An earlier rule that is rendered has the same `metricName`.
    #[error("metricName repeats an earlier rule's")]
    DuplicateMetricName,
    /// A text field is longer than the schema allows.
    #[error("{field} is {length} characters, more than {max}")]
    TooLong {
        /// The field, as the spec spells it.
        field: &'static str,
        /// Its length in characters.
        length: usize,
        /// The most it may have.
        max: usize,
    },
    /// A text field that must not be empty is.
    #[error("{field} is empty")]
    Empty {
        /// The field, as the spec spells it.
        field: &'static str,
    },
    /// `profileType` does not have five `:`-separated parts after a name
    /// (and an optional sixth, `delta`).
    #[error("profileType is not name:sample_type:sample_unit:period_type:period_unit[:delta]")]
    ProfileType,
    /// `selector` is not label matchers in braces.
    #[error("selector is not label matchers in braces, e.g. {{namespace=\"shop\"}}")]
    Selector,
    /// Both `function` and `functionRegex` are set.
    #[error("function and functionRegex are both set; a rule takes one")]
    FunctionAndRegex,
    /// `functionRegex` does not compile within [`REGEX_SIZE_LIMIT`].
    #[error("functionRegex does not compile: {reason}")]
    Regex {
        /// The regex compiler's complaint, without the pattern it quotes.
        reason: String,
    },
    /// `groupBy` lists more labels than the schema allows.
    #[error("groupBy has {count} labels, more than {max}")]
    TooManyGroupByLabels {
        /// Labels listed.
        count: usize,
        /// The most a rule may list.
        max: usize,
    },
    /// A `groupBy` entry is not a Prometheus label name, or is too long.
    #[error("groupBy label {label:?} is not a Prometheus label name of at most {max} characters")]
    GroupByLabel {
        /// The entry, cut to [`SHOWN_TEXT_LENGTH`] characters.
        label: String,
        /// The longest label name allowed.
        max: usize,
    },
    /// A `groupBy` entry repeats an earlier one.
    #[error("groupBy names {label:?} twice")]
    DuplicateGroupByLabel {
        /// The repeated label.
        label: String,
    },
    /// The rule comes after the first [`MAX_RECORDING_RULES`].
    #[error("a store takes at most {max} recording rules")]
    TooManyRules {
        /// The most rules a store takes.
        max: usize,
    },
    /// The rules before this one already fill the environment variable's budget.
    #[error("the rules before it fill the {max_bytes} bytes KILN_RECORDING_RULES may hold")]
    OverRenderBudget {
        /// [`MAX_RENDERED_RULES_BYTES`].
        max_bytes: usize,
    },
}

/// Longest piece of user text a problem or status message repeats, so a rule written past the
/// schema's limits cannot grow the status without bound.
pub const SHOWN_TEXT_LENGTH: usize = 64;

/// A rule left out of the store's config, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRule {
    /// The rule's `metricName`, cut to [`SHOWN_TEXT_LENGTH`] characters.
    pub metric_name: String,
    /// What is wrong with it.
    pub problem: RuleProblem,
}

/// A store's rules split into those rendered to the store and those left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckedRules {
    /// The valid rules, in spec order, as the store's settings take them.
    pub rendered: Vec<RecordingRuleOptions>,
    /// The invalid ones, in spec order.
    pub refused: Vec<RefusedRule>,
}

/// Checks every rule and keeps the valid ones, in order, within [`MAX_RECORDING_RULES`] and
/// [`MAX_RENDERED_RULES_BYTES`].
pub fn check_rules(rules: &[RecordingRuleSpec]) -> CheckedRules {
    let mut checked = CheckedRules::default();
    // `[` and `]` of the JSON array.
    let mut rendered_bytes = 2;
    for (index, rule) in rules.iter().enumerate() {
        let outcome = if index >= MAX_RECORDING_RULES {
            Err(RuleProblem::TooManyRules {
                max: MAX_RECORDING_RULES,
            })
        } else {
            check_rule(rule).and_then(|options| {
                if checked
                    .rendered
                    .iter()
                    .any(|earlier| earlier.metric_name == options.metric_name)
                {
                    return Err(RuleProblem::DuplicateMetricName);
                }
                // Its JSON plus the comma before it; serializing plain strings cannot fail.
                let bytes = serde_json::to_string(&options).map_or(usize::MAX, |json| json.len());
                if rendered_bytes + bytes + 1 > MAX_RENDERED_RULES_BYTES {
                    return Err(RuleProblem::OverRenderBudget {
                        max_bytes: MAX_RENDERED_RULES_BYTES,
                    });
                }
                rendered_bytes += bytes + 1;
                Ok(options)
            })
        };
        match outcome {
            Ok(options) => checked.rendered.push(options),
            Err(problem) => checked.refused.push(RefusedRule {
                metric_name: shown(&rule.metric_name),
                problem,
            }),
        }
    }
    checked
}

/// The `[recording]` settings of the store: its valid rules and the recorded series' retention.
/// No valid rule, no rules setting (so no variable).
pub fn recording_options(store: &ProfileStore) -> RecordingOptions {
    let rendered = check_rules(&store.spec.recording_rules).rendered;
    RecordingOptions {
        recorded_retention: store.spec.retention.recorded.clone(),
        recording_rules: (!rendered.is_empty()).then_some(RecordingRuleList(rendered)),
    }
}

/// One rule on its own: everything the schema checks, then what it cannot (the selector's
/// shape, the regex).
pub fn check_rule(rule: &RecordingRuleSpec) -> Result<RecordingRuleOptions, RuleProblem> {
    check_length("metricName", &rule.metric_name, MAX_METRIC_NAME_LENGTH)?;
    if !is_name(&rule.metric_name, true) {
        return Err(RuleProblem::MetricName);
    }
    check_length("profileType", &rule.profile_type, MAX_PROFILE_TYPE_LENGTH)?;
    let parts: Vec<&str> = rule.profile_type.split(':').collect();
    let delta_only = parts.len() == 6 && parts[5] == "delta";
    if !(parts.len() == 5 || delta_only) || parts[0].is_empty() {
        return Err(RuleProblem::ProfileType);
    }
    // An empty selector means every series, as an absent one does.
    let selector = rule
        .selector
        .as_deref()
        .map(str::trim)
        .filter(|selector| !selector.is_empty());
    if let Some(selector) = selector {
        check_length("selector", selector, MAX_MATCH_TEXT_LENGTH)?;
        if !(selector.starts_with('{') && selector.ends_with('}')) {
            return Err(RuleProblem::Selector);
        }
    }
    if rule.function.is_some() && rule.function_regex.is_some() {
        return Err(RuleProblem::FunctionAndRegex);
    }
    if let Some(function) = &rule.function {
        check_filled("function", function)?;
    }
    if let Some(pattern) = &rule.function_regex {
        check_filled("functionRegex", pattern)?;
        check_regex(pattern)?;
    }
    check_group_by(&rule.group_by)?;
    Ok(RecordingRuleOptions {
        metric_name: rule.metric_name.clone(),
        profile_type: rule.profile_type.clone(),
        selector: selector.map(str::to_owned),
        function: rule.function.clone(),
        function_regex: rule.function_regex.clone(),
        group_by: rule.group_by.clone(),
    })
}

fn check_group_by(labels: &[String]) -> Result<(), RuleProblem> {
    if labels.len() > MAX_GROUP_BY_LABELS {
        return Err(RuleProblem::TooManyGroupByLabels {
            count: labels.len(),
            max: MAX_GROUP_BY_LABELS,
        });
    }
    for (index, label) in labels.iter().enumerate() {
        if label.chars().count() > MAX_GROUP_BY_LABEL_LENGTH || !is_name(label, false) {
            return Err(RuleProblem::GroupByLabel {
                label: shown(label),
                max: MAX_GROUP_BY_LABEL_LENGTH,
            });
        }
        if labels[..index].contains(label) {
            return Err(RuleProblem::DuplicateGroupByLabel {
                label: shown(label),
            });
        }
    }
    Ok(())
}

/// Compiles the pattern as written (wrapping it first would let `a)|(b` through) under the size
/// limit; the regex crate's syntax is the store's.
fn check_regex(pattern: &str) -> Result<(), RuleProblem> {
    check_length("functionRegex", pattern, MAX_MATCH_TEXT_LENGTH)?;
    let error = match regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
    {
        Ok(_) => return Ok(()),
        Err(error) => error,
    };
    let reason = match error {
        regex::Error::CompiledTooBig(limit) => {
            format!("it compiles to more than {limit} bytes")
        }
        // The syntax error quotes the whole pattern with a caret under the mistake; its last
        // line (`error: unclosed group`) is the part worth a status message.
        regex::Error::Syntax(text) => text
            .lines()
            .rev()
            .find_map(|line| line.trim().strip_prefix("error: "))
            .map_or_else(|| shown(&text), shown),
        other => shown(&other.to_string()),
    };
    Err(RuleProblem::Regex { reason })
}

fn check_length(field: &'static str, text: &str, max: usize) -> Result<(), RuleProblem> {
    let length = text.chars().count();
    if length > max {
        return Err(RuleProblem::TooLong { field, length, max });
    }
    check_filled(field, text)
}

fn check_filled(field: &'static str, text: &str) -> Result<(), RuleProblem> {
    if text.is_empty() {
        return Err(RuleProblem::Empty { field });
    }
    Ok(())
}

/// Whether `text` is a Prometheus metric name (`colons`) or label name: what
/// [`crate::api::recording_rule::METRIC_NAME_PATTERN`] and `LABEL_NAME_PATTERN` match.
fn is_name(text: &str, colons: bool) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|first| {
        first.is_ascii_alphabetic() || first == '_' || (colons && first == ':')
    }) && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

/// `text` cut to [`SHOWN_TEXT_LENGTH`] characters, with `…` when cut.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_TEXT_LENGTH) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests;
