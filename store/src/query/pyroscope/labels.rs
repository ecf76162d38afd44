//! `LabelNames`, `LabelValues` and `Series`: what a selection's series are
//! called, for Grafana's label pickers.

use super::*;

/// `LabelNames`.
pub async fn label_names(
    store: &Store,
    request: t::LabelNamesRequest,
    names: LabelNameScheme,
) -> Result<Vec<String>, ApiError> {
    let range = range_ms(request.start, request.end)?;
    let mut all = BTreeSet::new();
    for set in matcher_sets(store, &request.matchers, range).await? {
        all.extend(
            store
                .label_names(&set, range)
                .await?
                .into_iter()
                .filter(|name| names.shows(name)),
        );
    }
    Ok(all.into_iter().collect())
}

/// Which label names a client can read back, from its `Accept` header:
/// Grafana and `profilecli` add `allow-utf8-labelnames=true` when they can
/// quote any name in a selector (`{"k8s.pod.name"="..."}`). Without it, as
/// in Pyroscope, only names of Prometheus' legacy form are listed, so an
/// older client never offers a name it cannot select on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelNameScheme {
    /// Every name (`allow-utf8-labelnames=true`).
    Utf8,
    /// `[A-Za-z_][A-Za-z0-9_]*` only.
    Legacy,
}

impl LabelNameScheme {
    /// The scheme an `Accept` header value asks for.
    pub fn from_accept(accept: &str) -> Self {
        let allows = accept.split(',').any(|media| {
            media.split(';').skip(1).any(|parameter| {
                parameter.split_once('=').is_some_and(|(name, value)| {
                    name.trim().eq_ignore_ascii_case("allow-utf8-labelnames")
                        && value.trim().trim_matches('"').eq_ignore_ascii_case("true")
                })
            })
        });
        if allows { Self::Utf8 } else { Self::Legacy }
    }

    /// Whether a label name is listed under this scheme.
    pub fn shows(self, name: &str) -> bool {
        self == Self::Utf8 || is_legacy_label_name(name)
    }
}

fn is_legacy_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `LabelValues`.
pub async fn label_values(
    store: &Store,
    request: t::LabelValuesRequest,
) -> Result<Vec<String>, ApiError> {
    if request.name.is_empty() {
        return Err(ApiError::BadParameter {
            parameter: "name",
            message: "the label name is required".to_owned(),
        });
    }
    let range = range_ms(request.start, request.end)?;
    let mut all = BTreeSet::new();
    for set in matcher_sets(store, &request.matchers, range).await? {
        all.extend(store.label_values(&request.name, &set, range).await?);
    }
    Ok(all.into_iter().collect())
}

/// `Series`: label sets, reduced to `label_names` when given.
pub async fn series(
    store: &Store,
    request: q::SeriesRequest,
    names: LabelNameScheme,
) -> Result<q::SeriesResponse, ApiError> {
    let range = range_ms(request.start, request.end)?;
    let mut sets: BTreeSet<Vec<(String, String)>> = BTreeSet::new();
    for matchers in matcher_sets(store, &request.matchers, range).await? {
        for set in store.series(&matchers, range).await? {
            let pairs = set
                .iter()
                .filter(|l| request.label_names.is_empty() || request.label_names.contains(&l.name))
                .filter(|l| names.shows(&l.name))
                .map(|l| (l.name.clone(), l.value.clone()))
                .collect();
            sets.insert(pairs);
        }
    }
    Ok(q::SeriesResponse {
        labels_set: sets
            .into_iter()
            .map(|pairs| t::Labels {
                labels: pairs
                    .into_iter()
                    .map(|(name, value)| t::LabelPair { name, value })
                    .collect(),
            })
            .collect(),
    })
}
