//! `group_by` on the flame graph, top, pprof and folded queries: one
//! synthetic root frame per grouped label, `label=value`, outermost first
//! (`docs/api.md`).
//!
//! Series labels (what the agent sets per process or pod: `comm`, `pod`,
//! `namespace`, ...) are grouped by merging each group of series apart;
//! labels that live on samples instead are grouped inside the engine
//! ([`kiln_engine::MergedProfile::add_grouped`]), so either kind works.

use std::collections::BTreeSet;

use kiln_engine::MergedProfile;
use kiln_engine::model::{LabelSet, MatchOp, Matcher, PROFILE_TYPE_LABEL, Selector, TimeRange};
use kiln_storage::Store;

use crate::error::ApiError;

/// Most labels one query may group by.
pub const MAX_GROUP_LABELS: usize = 8;
/// Most groups one query may produce: each series group is its own merge.
pub const MAX_GROUPS: usize = 2_000;

/// Parses `group_by`: label names separated by commas, outermost first.
pub fn parse_group_by(text: Option<&str>) -> Result<Vec<String>, ApiError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let mut labels: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim) {
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'));
        if !valid {
            return Err(ApiError::BadParameter {
                parameter: "group_by",
                message: format!(
                    "{name:?} is not a label name; give label names separated by commas, e.g. group_by=namespace,pod"
                ),
            });
        }
        if labels.iter().any(|l| l == name) {
            return Err(ApiError::BadParameter {
                parameter: "group_by",
                message: format!("{name:?} is named twice"),
            });
        }
        labels.push(name.to_owned());
    }
    if labels.len() > MAX_GROUP_LABELS {
        return Err(ApiError::BadParameter {
            parameter: "group_by",
            message: format!(
                "{} labels given; group by at most {MAX_GROUP_LABELS}",
                labels.len()
            ),
        });
    }
    Ok(labels)
}

/// The distinct values of `group_by` over `series` (`""` where a series
/// lacks the label), sorted.
pub fn series_groups(series: &[LabelSet], group_by: &[String]) -> BTreeSet<Vec<String>> {
    series
        .iter()
        .map(|labels| {
            group_by
                .iter()
                .map(|name| labels.get(name).unwrap_or("").to_owned())
                .collect()
        })
        .collect()
}

/// Merges the selection, grouped by `group_by` when it is not empty.
pub async fn merge_grouped(
    store: &Store,
    selector: &Selector,
    range: TimeRange,
    group_by: &[String],
) -> Result<MergedProfile, ApiError> {
    if group_by.is_empty() {
        return Ok(store.merge(selector, range).await?);
    }
    let mut matchers = selector.matchers.clone();
    matchers.push(Matcher {
        name: PROFILE_TYPE_LABEL.to_owned(),
        op: MatchOp::Equal,
        value: selector.profile_type.to_string(),
    });
    let series = store.series(&matchers, range).await?;
    let groups = series_groups(&series, group_by);
    if groups.len() > MAX_GROUPS {
        return Err(ApiError::BadParameter {
            parameter: "group_by",
            message: format!(
                "grouping by {} makes {} groups, more than {MAX_GROUPS}; narrow the selector or group by fewer labels",
                group_by.join(","),
                groups.len()
            ),
        });
    }
    let mut grouped = MergedProfile::new();
    for values in groups {
        let mut group_selector = selector.clone();
        // `label=""` selects the series without the label.
        for (name, value) in group_by.iter().zip(&values) {
            group_selector.matchers.push(Matcher {
                name: name.clone(),
                op: MatchOp::Equal,
                value: value.clone(),
            });
        }
        let merged = store.merge(&group_selector, range).await?;
        let group_by = group_by.to_vec();
        grouped = store
            .run_query_work(move || {
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                grouped.add_grouped(&merged, &group_by, &values);
                grouped
            })
            .await?;
    }
    Ok(grouped)
}

#[cfg(test)]
mod tests {
    use kiln_engine::model::{Label, LabelSet};

    use super::*;

    #[test]
    fn group_by_takes_label_names_separated_by_commas() {
        assert_eq!(
            parse_group_by(Some("namespace, pod")).unwrap(),
            ["namespace", "pod"]
        );
        assert!(parse_group_by(None).unwrap().is_empty());
        let err = parse_group_by(Some("pod,,comm")).unwrap_err().to_string();
        assert!(err.contains("group_by") && err.contains("\"\""), "{err}");
        let err = parse_group_by(Some("pod,pod")).unwrap_err().to_string();
        assert!(err.contains("named twice"), "{err}");
        let err = parse_group_by(Some("pod{x}")).unwrap_err().to_string();
        assert!(err.contains("not a label name"), "{err}");
    }

    #[test]
    fn series_groups_are_distinct_and_name_a_missing_label_empty() {
        let series = [
            LabelSet::new(vec![
                Label::new("pod", "a"),
                Label::new("namespace", "shop"),
            ]),
            LabelSet::new(vec![
                Label::new("pod", "a"),
                Label::new("namespace", "shop"),
            ]),
            LabelSet::new(vec![Label::new("pod", "b")]),
        ];
        let groups = series_groups(&series, &["namespace".to_owned(), "pod".to_owned()]);
        let groups: Vec<Vec<String>> = groups.into_iter().collect();
        assert_eq!(
            groups,
            [
                vec![String::new(), "b".to_owned()],
                vec!["shop".to_owned(), "a".to_owned()]
            ]
        );
    }
}
