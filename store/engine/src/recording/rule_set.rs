//! The rules a store evaluates, compiled together so one profile's frames
//! are matched once for all of them: a function's name is looked up once
//! among the exact names and run once through one `RegexSet`, giving a
//! bit per rule it satisfies. A sample's bits are its frames' bits OR'd.

use hashbrown::HashMap;

use super::{FunctionFilter, MAX_RULES, RecordingRule, RuleError};
use crate::index::REGEX_SIZE_LIMIT;

/// Compiled rules, at most [`MAX_RULES`] (one bit each).
#[derive(Debug, Clone, Default)]
pub struct RecordingRules {
    rules: Vec<RecordingRule>,
    /// Function name to the rules naming it exactly.
    exact: HashMap<String, u64>,
    /// Every regex filter, and the rule bit of each pattern in order.
    regexes: Option<(regex::RegexSet, Vec<u64>)>,
    /// The rules (by bit) without a function filter.
    unfiltered: u64,
}

impl RecordingRules {
    /// No rules.
    pub fn none() -> Self {
        Self::default()
    }

    /// Compiles the rules' function filters together.
    pub fn new(rules: Vec<RecordingRule>) -> Result<Self, RuleError> {
        if rules.len() > MAX_RULES {
            return Err(RuleError::TooManyRules { count: rules.len() });
        }
        let mut exact: HashMap<String, u64> = HashMap::new();
        let mut patterns = Vec::new();
        let mut bits = Vec::new();
        let mut unfiltered = 0;
        for (i, rule) in rules.iter().enumerate() {
            match rule.function() {
                FunctionFilter::Any => unfiltered |= 1 << i,
                FunctionFilter::Exact(name) => *exact.entry(name.clone()).or_default() |= 1 << i,
                FunctionFilter::Regex(regex) => {
                    // Already anchored, and each within the size limit.
                    patterns.push(regex.as_str().to_owned());
                    bits.push(1u64 << i);
                }
            }
        }
        let regexes = if patterns.is_empty() {
            None
        } else {
            let limit = REGEX_SIZE_LIMIT.saturating_mul(patterns.len());
            let set = regex::RegexSetBuilder::new(&patterns)
                .size_limit(limit)
                .dfa_size_limit(limit)
                .build()
                .map_err(|source| RuleError::FunctionRegex {
                    pattern: "(the rules' patterns together)".to_owned(),
                    source: crate::RegexRejection::Invalid { source },
                })?;
            Some((set, bits))
        };
        Ok(Self {
            rules,
            exact,
            regexes,
            unfiltered,
        })
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[RecordingRule] {
        &self.rules
    }

    /// True without rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules (by bit) whose function filter a frame of `name` satisfies.
    pub(crate) fn function_bits(&self, name: &str) -> u64 {
        let mut bits = self.exact.get(name).copied().unwrap_or(0);
        if let Some((set, rule_bits)) = &self.regexes {
            for matched in set.matches(name).iter() {
                bits |= rule_bits.get(matched).copied().unwrap_or(0);
            }
        }
        bits
    }

    /// The rules (by bit) that count a sample whatever its frames.
    pub(crate) fn unfiltered_bits(&self) -> u64 {
        self.unfiltered
    }

    /// True when some rule filters by function, so frames need matching.
    pub(crate) fn filters_functions(&self) -> bool {
        !self.exact.is_empty() || self.regexes.is_some()
    }
}
