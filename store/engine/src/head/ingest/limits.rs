//! Phase 1 of ingest, and the limits every phase checks against: the
//! request's own labels and the profile's size, label lengths, and the
//! series a profile may add (per profile name, per namespace and in all)
//! to what the census it is counted against holds: a head's series for a
//! lone [`crate::Head`], every retained series (heads and blocks) for a
//! store.

use hashbrown::HashMap;
use kiln_pprof::ProfileView;

use crate::error::IngestError;
use crate::head::SeriesCensus;
use crate::model::{LabelSet, NAME_LABEL};

/// Bookkeeping bytes counted per label on top of its name and value (two
/// `String` headers), so many tiny labels still count.
const LABEL_OVERHEAD_BYTES: usize = 48;

/// Bounds on what one profile may add to the head.
#[derive(Debug, Clone)]
pub struct IngestLimits {
    /// Most labels on one series, including `__name__` and `__profile_type__`.
    pub max_labels_per_series: usize,
    /// Longest label name in bytes.
    pub max_label_name_bytes: usize,
    /// Longest label value in bytes.
    pub max_label_value_bytes: usize,
    /// Most series per profile name (`__name__`) in the census counted
    /// against (a store's: every series it retains, blocks included).
    pub max_series_per_profile_name: usize,
    /// Most series per `namespace` label value in the census (series
    /// without the label share the namespace `""`), so one tenant's churn
    /// (a fork-heavy pod, random labels) cannot use up everyone's series.
    pub max_series_per_namespace: usize,
    /// Most series in the census, all names and namespaces together.
    pub max_series: usize,
    /// Most samples in one profile.
    pub max_samples_per_profile: usize,
    /// Most bytes of series label sets one profile may create (an upper
    /// estimate, checked before any set is built). Without it, every
    /// distinct promoted sample label copies the request's labels once:
    /// 20k signatures over 46 labels of 4 KiB come to 3.7 GiB, enough to
    /// kill the store on ingest and again on every replay of its WAL.
    pub max_series_label_bytes_per_profile: usize,
}

impl IngestLimits {
    /// The limits to apply a record that is already in the write-ahead log:
    /// the same, minus those that depend on what the head holds (the series
    /// counts). The record passed them under the head's read lock before it
    /// was logged; concurrent ingests may have added series since, and a
    /// logged, acknowledged record must never be refused on apply or on
    /// replay. The overshoot is bounded by the ingests in flight.
    pub fn for_logged_records(&self) -> Self {
        Self {
            max_series_per_profile_name: usize::MAX,
            max_series_per_namespace: usize::MAX,
            max_series: usize::MAX,
            ..self.clone()
        }
    }
}

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_labels_per_series: 48,
            max_label_name_bytes: 256,
            max_label_value_bytes: 2048,
            max_series_per_profile_name: 100_000,
            max_series_per_namespace: 100_000,
            max_series: 500_000,
            max_samples_per_profile: 1_000_000,
            max_series_label_bytes_per_profile: 64 << 20,
        }
    }
}

/// Checks the request's labels (`__name__` present, every name and value
/// within its length limit) and the profile's sample count; returns the
/// profile name.
pub(super) fn check_request<'l>(
    profile: &impl ProfileView,
    labels: &'l LabelSet,
    limits: &IngestLimits,
) -> Result<&'l str, IngestError> {
    let name = labels
        .get(NAME_LABEL)
        .filter(|n| !n.is_empty())
        .ok_or(IngestError::MissingName)?;
    for label in labels.iter() {
        check_label(&label.name, &label.value, limits)?;
    }
    let samples = profile.sample_count();
    if samples > limits.max_samples_per_profile {
        return Err(IngestError::TooManySamples {
            count: samples,
            limit: limits.max_samples_per_profile,
        });
    }
    Ok(name)
}

pub(super) fn check_label(
    name: &str,
    value: &str,
    limits: &IngestLimits,
) -> Result<(), IngestError> {
    if name.is_empty() {
        return Err(IngestError::EmptyLabelName);
    }
    if name.len() > limits.max_label_name_bytes {
        return Err(IngestError::LabelNameTooLong {
            name_prefix: name.chars().take(64).collect(),
            len: name.len(),
            limit: limits.max_label_name_bytes,
        });
    }
    if value.len() > limits.max_label_value_bytes {
        return Err(IngestError::LabelValueTooLong {
            name: name.chars().take(256).collect(),
            len: value.len(),
            limit: limits.max_label_value_bytes,
        });
    }
    Ok(())
}

/// What one label counts for in the series label byte budget.
pub(super) fn label_bytes(name: &str, value: &str) -> usize {
    name.len() + value.len() + LABEL_OVERHEAD_BYTES
}

/// The series a profile would create, counted against the head's limits
/// per profile name, per namespace and in all, so one tenant (or anyone
/// posting random labels) cannot take every other tenant's room.
pub(super) struct SeriesBudget<'a> {
    name: &'a str,
    limits: &'a IngestLimits,
    for_name: usize,
    total: usize,
    /// New series per namespace in this profile: a map, as a hostile
    /// profile may spread its samples over thousands of namespaces.
    per_namespace: HashMap<String, usize>,
}

impl<'a> SeriesBudget<'a> {
    pub(super) fn new(census: &impl SeriesCensus, name: &'a str, limits: &'a IngestLimits) -> Self {
        Self {
            name,
            limits,
            for_name: census.series_for_name(name),
            total: census.series_total(),
            per_namespace: HashMap::new(),
        }
    }

    /// Counts one new series in `namespace`, or says which limit it breaks.
    pub(super) fn add(
        &mut self,
        census: &impl SeriesCensus,
        namespace: &str,
    ) -> Result<(), IngestError> {
        self.for_name = self.for_name.saturating_add(1);
        if self.for_name > self.limits.max_series_per_profile_name {
            return Err(IngestError::TooManySeries {
                name: self.name.to_owned(),
                count: self.for_name,
                limit: self.limits.max_series_per_profile_name,
            });
        }
        let added = match self.per_namespace.get_mut(namespace) {
            Some(added) => {
                *added += 1;
                *added
            }
            None => {
                self.per_namespace.insert(namespace.to_owned(), 1);
                1
            }
        };
        let in_namespace = census.series_for_namespace(namespace).saturating_add(added);
        if in_namespace > self.limits.max_series_per_namespace {
            return Err(IngestError::TooManySeriesInNamespace {
                namespace: namespace.chars().take(256).collect(),
                count: in_namespace,
                limit: self.limits.max_series_per_namespace,
            });
        }
        self.total = self.total.saturating_add(1);
        if self.total > self.limits.max_series {
            return Err(IngestError::TooManySeriesInStore {
                count: self.total,
                limit: self.limits.max_series,
            });
        }
        Ok(())
    }
}
