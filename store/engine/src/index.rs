//! The inverted label index: label name -> value -> roaring bitmap of series
//! ids, and label matchers (`=`, `!=`, `=~`, `!~`) evaluated over it.
//!
//! A missing label matches as the empty string, as in Prometheus, so
//! `env=""` selects series without `env` and `env!=""` those with it.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;

use crate::error::{QueryError, RegexRejection};
use crate::model::{LabelSet, MatchOp, Matcher};

/// Postings for every label of every series.
#[derive(Debug, Clone, Default)]
pub struct LabelIndex {
    postings: BTreeMap<String, BTreeMap<String, RoaringBitmap>>,
    series_count: u32,
}

/// Longest `=~`/`!~` pattern accepted, in bytes. The regex crate matches in
/// linear time, but compile time and memory grow with the pattern, so an
/// unauthenticated query could otherwise occupy a core and its memory.
pub const MAX_REGEX_BYTES: usize = 1024;
/// Most memory one compiled regex may take (its program and lazy DFA
/// cache each); `(\w{1,80}){1,80}` needs far more and is refused.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiles `pattern` anchored at both ends, within [`MAX_REGEX_BYTES`] and
/// [`REGEX_SIZE_LIMIT`]. Shared with the selector parser so a pattern it
/// accepts is one a query can compile.
pub fn compile_anchored_regex(pattern: &str) -> Result<regex::Regex, RegexRejection> {
    if pattern.len() > MAX_REGEX_BYTES {
        return Err(RegexRejection::TooLong {
            len: pattern.len(),
            limit: MAX_REGEX_BYTES,
        });
    }
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|source| RegexRejection::Invalid { source })
}

/// A matcher ready to evaluate: regexes compiled once, fully anchored.
#[derive(Debug, Clone)]
pub struct CompiledMatcher {
    name: String,
    op: MatchOp,
    value: String,
    regex: Option<regex::Regex>,
}

impl CompiledMatcher {
    /// Compiles one matcher; `=~`/`!~` patterns are anchored at both ends.
    pub fn new(matcher: &Matcher) -> Result<Self, QueryError> {
        let regex = match matcher.op {
            MatchOp::Regex | MatchOp::NotRegex => {
                Some(compile_anchored_regex(&matcher.value).map_err(|source| {
                    QueryError::InvalidRegex {
                        name: matcher.name.clone(),
                        pattern: matcher.value.chars().take(256).collect(),
                        source,
                    }
                })?)
            }
            MatchOp::Equal | MatchOp::NotEqual => None,
        };
        Ok(Self {
            name: matcher.name.clone(),
            op: matcher.op,
            value: matcher.value.clone(),
            regex,
        })
    }

    /// True when a label value (`""` for a missing label) satisfies the matcher.
    pub fn matches(&self, value: &str) -> bool {
        match (self.op, &self.regex) {
            (MatchOp::Equal, _) => value == self.value,
            (MatchOp::NotEqual, _) => value != self.value,
            (MatchOp::Regex, Some(regex)) => regex.is_match(value),
            (MatchOp::NotRegex, Some(regex)) => !regex.is_match(value),
            (MatchOp::Regex | MatchOp::NotRegex, None) => false,
        }
    }

    /// True when `labels` satisfy the matcher (missing label = `""`).
    pub fn matches_labels(&self, labels: &LabelSet) -> bool {
        self.matches(labels.get(&self.name).unwrap_or(""))
    }
}

/// Compiles every matcher, failing on the first invalid regex.
pub fn compile_matchers(matchers: &[Matcher]) -> Result<Vec<CompiledMatcher>, QueryError> {
    matchers.iter().map(CompiledMatcher::new).collect()
}

impl LabelIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Indexes series `series_id` (ids are dense: `0..series_count`).
    pub fn add(&mut self, series_id: u32, labels: &LabelSet) {
        for label in labels.iter() {
            if label.value.is_empty() {
                continue;
            }
            self.postings
                .entry(label.name.clone())
                .or_default()
                .entry(label.value.clone())
                .or_default()
                .insert(series_id);
        }
        self.series_count = self.series_count.max(series_id.saturating_add(1));
    }

    /// Rebuilds an index from stored postings.
    pub(crate) fn from_postings(
        postings: BTreeMap<String, BTreeMap<String, RoaringBitmap>>,
        series_count: u32,
    ) -> Self {
        Self {
            postings,
            series_count,
        }
    }

    /// Every posting list, by name then value.
    pub(crate) fn postings(&self) -> &BTreeMap<String, BTreeMap<String, RoaringBitmap>> {
        &self.postings
    }

    /// Number of series indexed.
    pub fn series_count(&self) -> u32 {
        self.series_count
    }

    /// All series ids.
    pub fn all(&self) -> RoaringBitmap {
        let mut all = RoaringBitmap::new();
        all.insert_range(0..self.series_count);
        all
    }

    /// Series matching every matcher.
    pub fn select(&self, matchers: &[CompiledMatcher]) -> RoaringBitmap {
        let mut selected = self.all();
        for matcher in matchers {
            if selected.is_empty() {
                break;
            }
            selected &= self.select_one(matcher);
        }
        selected
    }

    fn select_one(&self, matcher: &CompiledMatcher) -> RoaringBitmap {
        let mut matched = RoaringBitmap::new();
        let values = self.postings.get(&matcher.name);
        if let (MatchOp::Equal, Some(values)) = (matcher.op, values) {
            // Fast path: one posting list.
            if !matcher.value.is_empty() {
                return values.get(&matcher.value).cloned().unwrap_or_default();
            }
        }
        let mut having = RoaringBitmap::new();
        if let Some(values) = values {
            for (value, series) in values {
                having |= series;
                if matcher.matches(value) {
                    matched |= series;
                }
            }
        }
        if matcher.matches("") {
            matched |= self.all() - having;
        }
        matched
    }

    /// Label names present on at least one series in `within`, sorted.
    pub fn label_names(&self, within: &RoaringBitmap) -> Vec<String> {
        self.postings
            .iter()
            .filter(|(_, values)| values.values().any(|s| !s.is_disjoint(within)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Values of label `name` on series in `within`, sorted.
    pub fn label_values(&self, name: &str, within: &RoaringBitmap) -> Vec<String> {
        self.postings.get(name).map_or_else(Vec::new, |values| {
            values
                .iter()
                .filter(|(_, s)| !s.is_disjoint(within))
                .map(|(value, _)| value.clone())
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::Label;

    fn matcher(name: &str, op: MatchOp, value: &str) -> Matcher {
        Matcher {
            name: name.into(),
            op,
            value: value.into(),
        }
    }

    #[test]
    fn missing_label_matches_as_empty_string() {
        let mut index = LabelIndex::new();
        index.add(0, &LabelSet::new(vec![Label::new("env", "prod")]));
        index.add(1, &LabelSet::new(vec![Label::new("pod", "a")]));
        let select = |m: Matcher| {
            index
                .select(&compile_matchers(&[m]).unwrap())
                .iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(select(matcher("env", MatchOp::Equal, "")), vec![1]);
        assert_eq!(select(matcher("env", MatchOp::NotEqual, "")), vec![0]);
        assert_eq!(select(matcher("env", MatchOp::Regex, "p.*")), vec![0]);
        assert_eq!(
            select(matcher("env", MatchOp::Regex, "p")),
            Vec::<u32>::new()
        );
        assert_eq!(select(matcher("env", MatchOp::NotRegex, "pr.d")), vec![1]);
        assert_eq!(select(matcher("nope", MatchOp::Equal, "")), vec![0, 1]);
    }

    #[test]
    fn invalid_regex_is_a_clear_error() {
        let error = compile_matchers(&[matcher("a", MatchOp::Regex, "(")]).unwrap_err();
        assert_eq!(error.reason(), "invalid_regex");
    }

    /// Patterns are capped in length and in compiled size, so a hostile
    /// pattern cannot make compiling it the query's cost.
    #[test]
    fn long_or_huge_patterns_are_refused_and_ordinary_ones_compile() {
        let long = "a".repeat(MAX_REGEX_BYTES + 1);
        assert!(matches!(
            compile_anchored_regex(&long),
            Err(RegexRejection::TooLong {
                len: 1025,
                limit: 1024
            })
        ));
        let huge = r"(\w{1,80}){1,80}";
        assert!(matches!(
            compile_anchored_regex(huge),
            Err(RegexRejection::Invalid { .. })
        ));
        let regex = compile_anchored_regex("check.*|pay(ment)?").expect("ordinary pattern");
        assert!(regex.is_match("payment") && !regex.is_match("xpayment"));
    }

    fn arb_labels() -> impl Strategy<Value = LabelSet> {
        proptest::collection::vec(
            (
                prop::sample::select(vec!["a", "b", "c"]),
                prop::sample::select(vec!["", "x", "y", "xy", "z"]),
            ),
            0..3,
        )
        .prop_map(|pairs| {
            LabelSet::new(
                pairs
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(n, v)| Label::new(n, v))
                    .collect(),
            )
        })
    }

    fn arb_matcher() -> impl Strategy<Value = Matcher> {
        (
            prop::sample::select(vec!["a", "b", "c", "d"]),
            prop::sample::select(vec![
                MatchOp::Equal,
                MatchOp::NotEqual,
                MatchOp::Regex,
                MatchOp::NotRegex,
            ]),
            prop::sample::select(vec!["", "x", "y", "x.*", ".*", "x|y", "y?"]),
        )
            .prop_map(|(n, op, v)| matcher(n, op, v))
    }

    proptest! {
        #[test]
        fn index_selection_equals_brute_force(
            series in proptest::collection::vec(arb_labels(), 0..20),
            matchers in proptest::collection::vec(arb_matcher(), 0..3),
        ) {
            let mut index = LabelIndex::new();
            for (id, labels) in series.iter().enumerate() {
                index.add(id as u32, labels);
            }
            let compiled = compile_matchers(&matchers).unwrap();
            let got: Vec<u32> = index.select(&compiled).iter().collect();
            let expected: Vec<u32> = series
                .iter()
                .enumerate()
                .filter(|(_, labels)| compiled.iter().all(|m| m.matches_labels(labels)))
                .map(|(id, _)| id as u32)
                .collect();
            prop_assert_eq!(got, expected);
        }
    }
}
