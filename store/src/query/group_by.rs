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
use kiln_storage::store::with_request_deadline;

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
        check_label_name(name)?;
        if labels.iter().any(|l| l == name) {
            return Err(ApiError::BadParameter {
                parameter: "group_by",
                message: format!("{name:?} is named twice"),
            });
        }
        labels.push(name.to_owned());
        check_label_count(labels.len())?;
    }
    Ok(labels)
}

/// Checks a list of `group_by` label names given as a list (Pyroscope's
/// `SelectSeries`): repeats are dropped, keeping the first, so that a list
/// of one name a million times costs one name per series, not a million;
/// more than [`MAX_GROUP_LABELS`] distinct names are refused.
pub fn group_by_list(names: Vec<String>) -> Result<Vec<String>, ApiError> {
    let mut labels: Vec<String> = Vec::new();
    for name in names {
        check_label_name(&name)?;
        if !labels.contains(&name) {
            labels.push(name);
            check_label_count(labels.len())?;
        }
    }
    Ok(labels)
}

fn check_label_name(name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'));
    if valid {
        return Ok(());
    }
    Err(ApiError::BadParameter {
        parameter: "group_by",
        message: format!(
            "{:?} is not a label name; give label names separated by commas, e.g. group_by=namespace,pod",
            name.chars().take(64).collect::<String>()
        ),
    })
}

fn check_label_count(count: usize) -> Result<(), ApiError> {
    if count > MAX_GROUP_LABELS {
        return Err(ApiError::BadParameter {
            parameter: "group_by",
            message: format!(
                "more than {MAX_GROUP_LABELS} labels given; group by at most {MAX_GROUP_LABELS}"
            ),
        });
    }
    Ok(())
}

/// The distinct values of `group_by` over `series` (`""` where a series
/// lacks the label), sorted; refused as soon as they pass [`MAX_GROUPS`],
/// since each group is a query of its own.
pub fn series_groups(
    series: &[LabelSet],
    group_by: &[String],
) -> Result<BTreeSet<Vec<String>>, ApiError> {
    let mut groups = BTreeSet::new();
    for labels in series {
        groups.insert(
            group_by
                .iter()
                .map(|name| labels.get(name).unwrap_or("").to_owned())
                .collect(),
        );
        if groups.len() > MAX_GROUPS {
            return Err(ApiError::BadParameter {
                parameter: "group_by",
                message: format!(
                    "grouping by {} makes more than {MAX_GROUPS} groups; narrow the selector or group by fewer labels",
                    group_by.join(",")
                ),
            });
        }
    }
    Ok(groups)
}

/// The series matchers of `selector`: its matchers and its profile type.
pub fn series_matchers(selector: &Selector) -> Vec<Matcher> {
    let mut matchers = selector.matchers.clone();
    matchers.push(Matcher {
        name: PROFILE_TYPE_LABEL.to_owned(),
        op: MatchOp::Equal,
        value: selector.profile_type.to_string(),
    });
    matchers
}

/// `selector` narrowed to one group: `label=value` for each grouped label
/// (`label=""` selects the series without the label).
pub fn group_selector(selector: &Selector, group_by: &[String], values: &[String]) -> Selector {
    let mut group = selector.clone();
    group
        .matchers
        .extend(group_by.iter().zip(values).map(|(name, value)| Matcher {
            name: name.clone(),
            op: MatchOp::Equal,
            value: value.clone(),
        }));
    group
}

/// Runs `query`, every visit of it together, within one query deadline
/// (the store's query timeout): a grouped query makes a visit per group,
/// and each visit's own deadline would let one request run for the
/// deadline times its groups while it holds a query slot. Each visit
/// stops at the request's deadline, its scans too, and a visit still
/// running when the deadline fires here is told to stop (dropping it
/// cancels it), rather than scanning on for an answer no one will read.
pub async fn within_deadline<T>(
    store: &Store,
    query: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let timeout = store.config().query_timeout;
    let deadline = std::time::Instant::now() + timeout;
    tokio::time::timeout(timeout, with_request_deadline(deadline, query))
        .await
        .map_err(|_| ApiError::QueryDeadline { timeout })?
}

/// Merges the selection, grouped by `group_by` when it is not empty, all
/// groups within one deadline.
pub async fn merge_grouped(
    store: &Store,
    selector: &Selector,
    range: TimeRange,
    group_by: &[String],
) -> Result<MergedProfile, ApiError> {
    if group_by.is_empty() {
        return Ok(store.merge(selector, range).await?);
    }
    within_deadline(store, async {
        let series = store.series(&series_matchers(selector), range).await?;
        let groups = series_groups(&series, group_by)?;
        drop(series);
        let mut grouped = MergedProfile::new();
        for values in groups {
            let group_selector = group_selector(selector, group_by, &values);
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
    })
    .await
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
        let nine = "a,b,c,d,e,f,g,h,i";
        let err = parse_group_by(Some(nine)).unwrap_err().to_string();
        assert!(err.contains("at most 8"), "{err}");
    }

    #[test]
    fn group_by_lists_drop_repeats_and_keep_the_label_cap() {
        let repeats = vec!["pod".to_owned(); 1_000_000];
        assert_eq!(group_by_list(repeats).unwrap(), ["pod"]);
        let names = ["namespace", "pod", "namespace", "comm"].map(str::to_owned);
        assert_eq!(
            group_by_list(names.to_vec()).unwrap(),
            ["namespace", "pod", "comm"]
        );
        let nine: Vec<String> = (0..=MAX_GROUP_LABELS).map(|i| format!("l{i}")).collect();
        let err = group_by_list(nine).unwrap_err().to_string();
        assert!(err.contains("at most 8"), "{err}");
        let err = group_by_list(vec!["pod\n".to_owned()]).unwrap_err();
        assert!(err.to_string().contains("not a label name"), "{err}");
        assert!(group_by_list(vec![String::new()]).is_err());
    }

    #[test]
    fn series_groups_stop_past_the_group_cap() {
        let series: Vec<LabelSet> = (0..=MAX_GROUPS)
            .map(|i| LabelSet::new(vec![Label::new("pod", format!("p{i}"))]))
            .collect();
        let err = series_groups(&series, &["pod".to_owned()]).unwrap_err();
        assert!(err.to_string().contains("more than 2000 groups"), "{err}");
        let groups = series_groups(&series[..MAX_GROUPS], &["pod".to_owned()]).unwrap();
        assert_eq!(groups.len(), MAX_GROUPS);
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
        let groups = series_groups(&series, &["namespace".to_owned(), "pod".to_owned()]).unwrap();
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
