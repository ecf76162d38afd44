//! Kubernetes label selectors (`matchLabels` + `matchExpressions`) with the API server's semantics.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use serde::{Deserialize, Serialize};

/// Read access to a string map of labels or annotations, whatever map type the caller holds.
pub trait LabelSource {
    /// The value stored under `key`, if any.
    fn label(&self, key: &str) -> Option<&str>;
}

impl<S: BuildHasher> LabelSource for HashMap<String, String, S> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl LabelSource for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// A label selector as in `metav1.LabelSelector`. An empty selector matches every pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be present with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements; all must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One set-based requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SelectorRequirement {
    /// The label key the requirement is about.
    pub key: String,
    /// How the key's value relates to `values`.
    pub operator: SelectorOperator,
    /// Values for `In` / `NotIn`; empty for `Exists` / `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The operators of a set-based requirement, spelled as in the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SelectorOperator {
    /// The label is present and its value is one of `values`.
    In,
    /// The label is absent, or its value is none of `values`.
    NotIn,
    /// The label is present, with any value.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// Longest label key Kubernetes allows: a 253-byte DNS prefix, `/`, and a 63-byte name.
const MAX_LABEL_KEY_BYTES: usize = 317;

impl LabelSelector {
    /// True when the pod's labels satisfy every `matchLabels` entry and every expression.
    pub fn matches(&self, labels: &dyn LabelSource) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.label(key) == Some(value.as_str()))
            && self
                .match_expressions
                .iter()
                .all(|requirement| requirement.matches(labels))
    }

    /// Sorts expressions and their values and drops repeated values, so equal selectors serialize equally.
    pub fn normalize(&mut self) {
        for requirement in &mut self.match_expressions {
            requirement.values.sort();
            requirement.values.dedup();
        }
        self.match_expressions.sort();
        self.match_expressions.dedup();
    }

    /// Checks keys and operator/value combinations; returns the offending field path and problem.
    pub(crate) fn problems(&self) -> Option<(String, String)> {
        for key in self.match_labels.keys() {
            if let Some(problem) = label_key_problem(key) {
                return Some((format!("selector.matchLabels[{key:?}]"), problem));
            }
        }
        for (index, requirement) in self.match_expressions.iter().enumerate() {
            if let Some(problem) = label_key_problem(&requirement.key) {
                return Some((format!("selector.matchExpressions[{index}].key"), problem));
            }
            let needs_values = matches!(
                requirement.operator,
                SelectorOperator::In | SelectorOperator::NotIn
            );
            if needs_values && requirement.values.is_empty() {
                return Some((
                    format!("selector.matchExpressions[{index}].values"),
                    format!(
                        "operator {:?} needs at least one value",
                        requirement.operator
                    ),
                ));
            }
            if !needs_values && !requirement.values.is_empty() {
                return Some((
                    format!("selector.matchExpressions[{index}].values"),
                    format!("operator {:?} takes no values", requirement.operator),
                ));
            }
        }
        None
    }
}

impl SelectorRequirement {
    fn matches(&self, labels: &dyn LabelSource) -> bool {
        let value = labels.label(&self.key);
        let listed = |v: &str| self.values.iter().any(|candidate| candidate == v);
        match self.operator {
            SelectorOperator::In => value.is_some_and(listed),
            SelectorOperator::NotIn => !value.is_some_and(listed),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}

fn label_key_problem(key: &str) -> Option<String> {
    if key.is_empty() {
        Some("label key is empty".to_owned())
    } else if key.len() > MAX_LABEL_KEY_BYTES {
        Some(format!(
            "label key is {} bytes, longer than {MAX_LABEL_KEY_BYTES}",
            key.len()
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn requirement(key: &str, operator: SelectorOperator, values: &[&str]) -> SelectorRequirement {
        SelectorRequirement {
            key: key.to_owned(),
            operator,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn empty_selector_matches_every_pod() {
        assert!(LabelSelector::default().matches(&labels(&[])));
        assert!(LabelSelector::default().matches(&labels(&[("app", "x")])));
    }

    #[test]
    fn match_labels_need_exact_values() {
        let selector = LabelSelector {
            match_labels: labels(&[("app", "web")]),
            ..LabelSelector::default()
        };
        assert!(selector.matches(&labels(&[("app", "web"), ("tier", "1")])));
        assert!(!selector.matches(&labels(&[("app", "db")])));
        assert!(!selector.matches(&labels(&[])));
    }

    #[test]
    fn operators_follow_kubernetes_semantics() {
        let pod = labels(&[("env", "prod")]);
        let check = |op, values: &[&str], key: &str| {
            LabelSelector {
                match_labels: BTreeMap::new(),
                match_expressions: vec![requirement(key, op, values)],
            }
            .matches(&pod)
        };
        assert!(check(SelectorOperator::In, &["prod", "staging"], "env"));
        assert!(!check(SelectorOperator::In, &["dev"], "env"));
        assert!(!check(SelectorOperator::In, &["prod"], "missing"));
        assert!(check(SelectorOperator::NotIn, &["dev"], "env"));
        assert!(check(SelectorOperator::NotIn, &["dev"], "missing"));
        assert!(!check(SelectorOperator::NotIn, &["prod"], "env"));
        assert!(check(SelectorOperator::Exists, &[], "env"));
        assert!(!check(SelectorOperator::Exists, &[], "missing"));
        assert!(check(SelectorOperator::DoesNotExist, &[], "missing"));
        assert!(!check(SelectorOperator::DoesNotExist, &[], "env"));
    }

    #[test]
    fn in_without_values_is_a_problem() {
        let selector = LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![requirement("env", SelectorOperator::In, &[])],
        };
        let (field, problem) = selector.problems().expect("In without values is invalid");
        assert_eq!(field, "selector.matchExpressions[0].values");
        assert!(problem.contains("at least one value"), "{problem}");
    }

    #[test]
    fn exists_with_values_is_a_problem() {
        let selector = LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![requirement("env", SelectorOperator::Exists, &["x"])],
        };
        assert!(selector.problems().is_some());
    }

    #[test]
    fn normalize_sorts_and_dedups_values_and_expressions() {
        let mut selector = LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![
                requirement("b", SelectorOperator::In, &["y", "x", "y"]),
                requirement("a", SelectorOperator::Exists, &[]),
            ],
        };
        selector.normalize();
        assert_eq!(selector.match_expressions[0].key, "a");
        assert_eq!(selector.match_expressions[1].values, vec!["x", "y"]);
    }
}
