//! Normalizing one pprof profile into series, stacks and values.
//!
//! - each sample type becomes its own profile type (and so its own series);
//! - string sample labels are promoted to series labels (a name colliding
//!   with a series label becomes `exported_<name>`), except those named in
//!   `kiln_contract::sample_labels` (span, trace and profile ids; the
//!   agent's `pid`, `tid` and `comm`);
//! - those and numeric labels stay per sample, as a deduplicated label set
//!   that is part of the stack key;
//! - zero values are dropped.
//!
//! Everything is checked before the head is touched, so a refused profile
//! leaves no trace.

use hashbrown::HashMap;
use kiln_pprof::Profile;

mod interner;

use super::{Head, HeadPoint, Run};
use crate::error::IngestError;
use crate::model::{Label, LabelSet, NAME_LABEL, NAMESPACE_LABEL, PROFILE_TYPE_LABEL, ProfileType};
use interner::ProfileInterner;

const UNSEEN: u32 = u32::MAX;
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
    /// Most series per profile name (`__name__`) in the head.
    pub max_series_per_profile_name: usize,
    /// Most series per `namespace` label value in the head (series without
    /// the label share the namespace `""`), so one tenant's churn (a
    /// fork-heavy pod, random labels) cannot use up everyone's series.
    pub max_series_per_namespace: usize,
    /// Most series in the head, all names and namespaces together.
    pub max_series: usize,
    /// Most samples in one profile.
    pub max_samples_per_profile: usize,
    /// Most bytes of series label sets one profile may create (an upper
    /// estimate, checked before any set is built). Without it, every
    /// distinct promoted sample label copies the request's labels once:
    /// 20k signatures over 46 labels of 4 KiB come to 3.7 GiB (audit D1).
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

/// What one ingest did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IngestStats {
    /// Values stored (one per sample, sample type and non-zero value).
    pub samples: u64,
    /// Values dropped because they were zero.
    pub zero_values_dropped: u64,
    /// Series created by this profile.
    pub series_created: u64,
    /// Profile types (sample types) in the profile.
    pub profile_types: u64,
}

/// Maps pprof ids to table positions; producers almost always use `index + 1`.
pub(super) enum PositionById {
    Sequential(usize),
    Sparse(HashMap<u64, usize>),
}

impl PositionById {
    pub(super) fn build(ids: impl ExactSizeIterator<Item = u64> + Clone) -> Self {
        let len = ids.len();
        if ids.clone().enumerate().all(|(i, id)| id == i as u64 + 1) {
            return Self::Sequential(len);
        }
        Self::Sparse(ids.enumerate().map(|(i, id)| (id, i)).collect())
    }

    pub(super) fn get(&self, id: u64) -> Option<usize> {
        match self {
            Self::Sequential(len) => {
                let i = usize::try_from(id.checked_sub(1)?).ok()?;
                (i < *len).then_some(i)
            }
            Self::Sparse(map) => map.get(&id).copied(),
        }
    }
}

fn check_label(name: &str, value: &str, limits: &IngestLimits) -> Result<(), IngestError> {
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

/// The profile types of `profile`, one per sample type.
pub(crate) fn profile_types_of(
    profile: &Profile,
    name: &str,
    duration_nanos: i64,
) -> Vec<ProfileType> {
    let (period_type, period_unit) =
        profile
            .period_type()
            .map_or((String::new(), String::new()), |p| {
                (
                    profile.string(p.r#type).to_owned(),
                    profile.string(p.unit).to_owned(),
                )
            });
    profile
        .sample_types()
        .iter()
        .map(|st| ProfileType {
            name: name.to_owned(),
            sample_type: profile.string(st.r#type).to_owned(),
            sample_unit: profile.string(st.unit).to_owned(),
            period_type: period_type.clone(),
            period_unit: period_unit.clone(),
            delta: duration_nanos != 0,
        })
        .collect()
}

/// What the checks resolved: enough to apply the profile without checking
/// (or allocating series label sets) again.
struct Plan {
    types: Vec<ProfileType>,
    /// Per string-table entry: whether a label with that key stays per sample.
    per_sample_keys: Vec<bool>,
    /// The signature (promoted label set) of each sample.
    sample_signature: Vec<u32>,
    /// Per (signature, profile type) slot that receives a value: its labels.
    slot_labels: Vec<Option<LabelSet>>,
}

impl Plan {
    fn is_promoted(&self, key: i64, str_index: i64) -> bool {
        is_promoted(&self.per_sample_keys, key, str_index)
    }
}

fn is_promoted(per_sample_keys: &[bool], key: i64, str_index: i64) -> bool {
    str_index != 0
        && !usize::try_from(key)
            .ok()
            .and_then(|k| per_sample_keys.get(k))
            .copied()
            .unwrap_or(false)
}

fn label_bytes(name: &str, value: &str) -> usize {
    name.len() + value.len() + LABEL_OVERHEAD_BYTES
}

/// The series a profile would create, counted against the head's limits
/// per profile name, per namespace and in all (audit R6).
struct SeriesBudget<'a> {
    name: &'a str,
    limits: &'a IngestLimits,
    for_name: usize,
    total: usize,
    /// New series per namespace in this profile: a map, as a hostile
    /// profile may spread its samples over thousands of namespaces.
    per_namespace: HashMap<String, usize>,
}

impl<'a> SeriesBudget<'a> {
    fn new(head: &Head, name: &'a str, limits: &'a IngestLimits) -> Self {
        Self {
            name,
            limits,
            for_name: head.series_for_name(name),
            total: head.series_count(),
            per_namespace: HashMap::new(),
        }
    }

    /// Counts one new series in `namespace`, or says which limit it breaks.
    fn add(&mut self, head: &Head, namespace: &str) -> Result<(), IngestError> {
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
        let in_namespace = head.series_for_namespace(namespace).saturating_add(added);
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

impl Head {
    /// Runs every check [`Head::ingest`] runs, without changing the head.
    /// The store calls it before logging a request, so nothing the engine
    /// would refuse reaches the write-ahead log.
    pub fn check_ingest(
        &self,
        profile: &Profile,
        labels: &LabelSet,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<(), IngestError> {
        self.plan(profile, labels, duration_nanos, limits)
            .map(|_| ())
    }

    /// Ingests one validated profile under `labels` (which must hold
    /// `__name__`) at `time_ms`. `duration_nanos != 0` marks delta profiles.
    pub fn ingest(
        &mut self,
        profile: &Profile,
        labels: &LabelSet,
        time_ms: i64,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<IngestStats, IngestError> {
        let plan = self.plan(profile, labels, duration_nanos, limits)?;
        Ok(self.apply(profile, plan, time_ms))
    }

    fn plan(
        &self,
        profile: &Profile,
        labels: &LabelSet,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<Plan, IngestError> {
        let name = labels
            .get(NAME_LABEL)
            .filter(|n| !n.is_empty())
            .ok_or(IngestError::MissingName)?
            .to_owned();
        for label in labels.iter() {
            check_label(&label.name, &label.value, limits)?;
        }
        let samples = profile.samples();
        if samples.len() > limits.max_samples_per_profile {
            return Err(IngestError::TooManySamples {
                count: samples.len(),
                limit: limits.max_samples_per_profile,
            });
        }
        let types = profile_types_of(profile, &name, duration_nanos);
        let type_count = types.len();

        // Pass 1: group samples by their promoted labels ("signature") and
        // find which (signature, type) slots receive a non-zero value.
        let mut signatures: HashMap<Vec<(i64, i64)>, u32> = HashMap::new();
        let mut signature_keys: Vec<Vec<(i64, i64)>> = vec![Vec::new()];
        signatures.insert(Vec::new(), 0);
        let mut sample_signature: Vec<u32> = Vec::with_capacity(samples.len());
        let mut slot_used: Vec<bool> = vec![false; type_count];
        let mut scratch: Vec<(i64, i64)> = Vec::new();
        let per_sample_keys: Vec<bool> = profile
            .strings()
            .iter()
            // Ids with a value per request, process or thread would make a
            // series each (audit R6).
            .map(|s| kiln_contract::sample_labels::stays_per_sample(s))
            .collect();
        for sample in samples {
            scratch.clear();
            for label in &sample.label {
                if is_promoted(&per_sample_keys, label.key, label.str) {
                    scratch.push((label.key, label.str));
                }
            }
            let signature = if scratch.is_empty() {
                0
            } else {
                scratch.sort_unstable();
                match signatures.get(scratch.as_slice()) {
                    Some(&s) => s,
                    None => {
                        let s = signature_keys.len() as u32;
                        signatures.insert(scratch.clone(), s);
                        signature_keys.push(scratch.clone());
                        slot_used.extend(std::iter::repeat_n(false, type_count));
                        s
                    }
                }
            };
            sample_signature.push(signature);
            let base = signature as usize * type_count;
            for (t, &value) in sample.value.iter().enumerate() {
                if value != 0 {
                    slot_used[base + t] = true;
                }
            }
        }
        drop(signatures);

        // Resolve every used slot's series labels and check limits. Sizes
        // and series counts are checked before each set is built, so a
        // hostile profile fails before it allocates (audit D1).
        let base_bytes: usize = labels.iter().map(|l| label_bytes(&l.name, &l.value)).sum();
        let type_label_bytes = types
            .iter()
            .map(|t| label_bytes(PROFILE_TYPE_LABEL, &t.to_string()))
            .max()
            .unwrap_or(0);
        let mut planned_bytes = 0usize;
        let mut slot_labels: Vec<Option<LabelSet>> = vec![None; slot_used.len()];
        let mut new_series = SeriesBudget::new(self, &name, limits);
        for (signature, key) in signature_keys.iter().enumerate() {
            let base = signature * type_count;
            let used = slot_used[base..base + type_count]
                .iter()
                .filter(|&&u| u)
                .count();
            if used == 0 {
                continue;
            }
            let set_bytes = base_bytes
                + key
                    .iter()
                    .map(|&(k, v)| {
                        "exported_".len() + label_bytes(profile.string(k), profile.string(v))
                    })
                    .sum::<usize>();
            planned_bytes = planned_bytes.saturating_add(
                set_bytes
                    .saturating_add(type_label_bytes)
                    .saturating_mul(used + 1),
            );
            if planned_bytes > limits.max_series_label_bytes_per_profile {
                return Err(IngestError::SeriesLabelsTooLarge {
                    bytes: planned_bytes,
                    limit: limits.max_series_label_bytes_per_profile,
                });
            }
            let mut set = labels.clone();
            for &(k, v) in key {
                let (k, v) = (profile.string(k), profile.string(v));
                let promoted_name = if labels.get(k).is_some() || k == PROFILE_TYPE_LABEL {
                    format!("exported_{k}")
                } else {
                    k.to_owned()
                };
                check_label(&promoted_name, v, limits)?;
                set.insert(Label::new(promoted_name, v));
            }
            if set.len() + 1 > limits.max_labels_per_series {
                return Err(IngestError::TooManyLabels {
                    count: set.len() + 1,
                    limit: limits.max_labels_per_series,
                });
            }
            for (t, profile_type) in types.iter().enumerate() {
                if !slot_used[base + t] {
                    continue;
                }
                let mut full = set.clone();
                full.insert(Label::new(PROFILE_TYPE_LABEL, profile_type.to_string()));
                // Only a series the head does not hold yet counts: a tenant
                // over its limit keeps ingesting into the series it has.
                if self.existing_series(&full).is_none() {
                    new_series.add(self, full.get(NAMESPACE_LABEL).unwrap_or(""))?;
                }
                slot_labels[base + t] = Some(full);
            }
        }
        Ok(Plan {
            types,
            per_sample_keys,
            sample_signature,
            slot_labels,
        })
    }

    /// Pass 2: applies a checked plan. Nothing here can fail.
    fn apply(&mut self, profile: &Profile, plan: Plan, time_ms: i64) -> IngestStats {
        let type_count = plan.types.len();
        let samples = profile.samples();
        let series_before = self.series.len();
        let mut slot_series: Vec<u32> = vec![UNSEEN; plan.slot_labels.len()];
        for (slot, labels) in plan.slot_labels.iter().enumerate() {
            if let Some(labels) = labels {
                slot_series[slot] = self.series_id(labels, &plan.types[slot % type_count]);
            }
        }
        let slot_start: Vec<usize> = slot_series
            .iter()
            .map(|&s| self.series.get(s as usize).map_or(0, |s| s.points.len()))
            .collect();
        // Sizes before this profile, to keep the head's byte count by delta.
        let mut touched: Vec<(u32, usize)> = slot_series
            .iter()
            .filter(|&&s| s != UNSEEN)
            .map(|&s| (s, 0))
            .collect();
        touched.sort_unstable();
        touched.dedup();
        for (series, before) in &mut touched {
            *before = self.series_heap_bytes(*series);
        }
        let mut interner = ProfileInterner::new(profile);
        let mut stats = IngestStats {
            profile_types: type_count as u64,
            ..IngestStats::default()
        };
        let mut totals: Vec<i64> = vec![0; slot_series.len()];
        let promoted = |key: i64, str_index: i64| plan.is_promoted(key, str_index);
        for (sample, &signature) in samples.iter().zip(&plan.sample_signature) {
            if sample.value.iter().all(|&v| v == 0) {
                stats.zero_values_dropped += sample.value.len() as u64;
                continue;
            }
            let stack = interner.stack(self, &sample.location_id);
            let sample_labels = interner.sample_labels(self, sample, &promoted);
            let base = signature as usize * type_count;
            for (t, &value) in sample.value.iter().enumerate() {
                if value == 0 {
                    stats.zero_values_dropped += 1;
                    continue;
                }
                let Some(series) = self.series.get_mut(slot_series[base + t] as usize) else {
                    continue;
                };
                series.points.push(HeadPoint {
                    stack,
                    labels: sample_labels,
                    value,
                });
                totals[base + t] = totals[base + t].wrapping_add(value);
                stats.samples += 1;
            }
        }
        // NB: two slots can resolve to the same series (a string table may hold
        // the same label value twice), so runs are made per series, not per slot.
        let mut runs: HashMap<u32, (usize, i64)> = HashMap::new();
        for (slot, &series_id) in slot_series.iter().enumerate() {
            if series_id == UNSEEN {
                continue;
            }
            let run = runs.entry(series_id).or_insert((slot_start[slot], 0));
            run.0 = run.0.min(slot_start[slot]);
            run.1 = run.1.wrapping_add(totals[slot]);
        }
        for (series_id, (start, total)) in runs {
            let Some(series) = self.series.get_mut(series_id as usize) else {
                continue;
            };
            if series.points.len() > start {
                series.runs.push(Run {
                    time_ms,
                    start: u32::try_from(start).expect("a series holds fewer than 2^32 points"),
                    total,
                    count: 1,
                });
            }
        }
        for (series, before) in touched {
            self.recount_series(series, before);
        }
        stats.series_created = (self.series.len() - series_before) as u64;
        self.points += stats.samples;
        self.profiles += 1;
        if stats.samples > 0 {
            self.note_time(time_ms);
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, ProfileBuilder};

    use super::*;

    /// `samples` samples, each with its own string label `k=<i>`.
    fn distinct_label_profile(samples: usize) -> Profile {
        let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        let f = b.function(&FunctionSpec {
            name: "main".into(),
            ..Default::default()
        });
        let loc = b.location(0, 0x1000, &[(f, 1)]);
        for i in 0..samples {
            b.sample(&[loc], &[1], &[("k", LabelValue::Str(i.to_string()))]);
        }
        let limits = DecodeLimits {
            max_decoded_bytes: usize::MAX,
            ..DecodeLimits::default()
        };
        kiln_pprof::decode(&kiln_pprof::encode_gzip(&b.finish()), &limits).expect("decodes")
    }

    fn long_labels(count: usize, bytes: usize) -> LabelSet {
        let mut labels = vec![Label::new(NAME_LABEL, "process_cpu")];
        labels.extend((1..count).map(|i| Label::new(format!("{i:0>bytes$}"), "v".repeat(bytes))));
        LabelSet::new(labels)
    }

    /// Audit D1: 46 labels of 2 KiB names and values times 20k distinct
    /// promoted labels is 3.7 GiB of label sets; it is refused before the
    /// first set beyond the budget is built, by the same check the store runs
    /// before logging.
    #[test]
    fn many_signatures_on_long_labels_are_refused_before_their_sets_are_built() {
        let limits = IngestLimits {
            max_label_name_bytes: 2048,
            max_label_value_bytes: 2048,
            ..IngestLimits::default()
        };
        let profile = distinct_label_profile(20_000);
        let labels = long_labels(46, 2048);
        let mut head = Head::new();
        let check = head.check_ingest(&profile, &labels, 10, &limits);
        assert!(
            matches!(check, Err(IngestError::SeriesLabelsTooLarge { limit, .. }) if limit == 64 << 20),
            "{check:?}"
        );
        let err = head.ingest(&profile, &labels, 1, 10, &limits).unwrap_err();
        assert_eq!(err.reason(), "series_labels_too_large");
        assert!(head.is_empty());
        // The same profile under short labels fits.
        let short = long_labels(3, 8);
        head.check_ingest(&profile, &short, 10, &limits)
            .expect("fits the budget");
        let stats = head
            .ingest(&profile, &short, 1, 10, &limits)
            .expect("ingest");
        assert_eq!(stats.series_created, 20_000);
    }

    /// The series limit is the one check that depends on the head, so a
    /// logged record is applied without it (see `for_logged_records`).
    #[test]
    fn logged_records_are_applied_past_the_series_limit_but_checked_ones_are_not() {
        let limits = IngestLimits {
            max_series_per_profile_name: 5,
            ..IngestLimits::default()
        };
        let profile = distinct_label_profile(8);
        let labels = long_labels(1, 1);
        let mut head = Head::new();
        let err = head
            .check_ingest(&profile, &labels, 10, &limits)
            .unwrap_err();
        assert!(
            matches!(
                err,
                IngestError::TooManySeries {
                    count: 6,
                    limit: 5,
                    ..
                }
            ),
            "{err}"
        );
        let stats = head
            .ingest(&profile, &labels, 1, 10, &limits.for_logged_records())
            .expect("a logged record is applied");
        assert_eq!(stats.series_created, 8);
    }

    fn labels_in(namespace: &str, pod: &str) -> LabelSet {
        LabelSet::new(vec![
            Label::new(NAME_LABEL, "process_cpu"),
            Label::new(NAMESPACE_LABEL, namespace),
            Label::new("pod", pod),
        ])
    }

    /// Audit R6: a tenant at its limit cannot add series, keeps ingesting
    /// into those it has, and leaves other tenants' room alone.
    #[test]
    fn a_namespace_at_its_series_limit_gets_no_new_series_but_keeps_its_own() {
        let limits = IngestLimits {
            max_series_per_namespace: 3,
            ..IngestLimits::default()
        };
        let profile = distinct_label_profile(1);
        let mut head = Head::new();
        for pod in ["a", "b", "c"] {
            head.ingest(&profile, &labels_in("churn", pod), 1, 10, &limits)
                .expect("within the namespace's limit");
        }
        let err = head
            .check_ingest(&profile, &labels_in("churn", "d"), 10, &limits)
            .unwrap_err();
        assert!(
            matches!(
                &err,
                IngestError::TooManySeriesInNamespace { namespace, count: 4, limit: 3 }
                    if namespace == "churn"
            ),
            "{err}"
        );
        assert_eq!(err.reason(), "too_many_series_in_namespace");
        let stats = head
            .ingest(&profile, &labels_in("churn", "a"), 2, 10, &limits)
            .expect("an existing series still ingests");
        assert_eq!(stats.series_created, 0);
        head.ingest(&profile, &labels_in("quiet", "a"), 2, 10, &limits)
            .expect("another namespace still creates series");
        // Series without the label share the namespace "".
        let mut bare = LabelSet::new(vec![Label::new(NAME_LABEL, "process_cpu")]);
        for pod in ["a", "b", "c"] {
            bare.insert(Label::new("pod", pod));
            head.ingest(&profile, &bare, 3, 10, &limits)
                .expect("within the limit of the unnamed namespace");
        }
        bare.insert(Label::new("pod", "d"));
        let err = head.check_ingest(&profile, &bare, 10, &limits).unwrap_err();
        assert!(
            matches!(&err, IngestError::TooManySeriesInNamespace { namespace, .. } if namespace.is_empty()),
            "{err}"
        );
        head.ingest(
            &profile,
            &labels_in("churn", "d"),
            3,
            10,
            &limits.for_logged_records(),
        )
        .expect("a logged record is applied past the namespace limit");
    }

    /// A profile whose samples promote a `namespace` label counts each new
    /// series in its own namespace, and the store-wide limit caps them all.
    #[test]
    fn the_store_wide_series_limit_counts_every_namespace_and_only_new_series() {
        let limits = IngestLimits {
            max_series_per_namespace: 1,
            max_series: 4,
            ..IngestLimits::default()
        };
        let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        let f = b.function(&FunctionSpec {
            name: "main".into(),
            ..Default::default()
        });
        let loc = b.location(0, 0x1000, &[(f, 1)]);
        for ns in ["n1", "n2", "n3"] {
            b.sample(
                &[loc],
                &[1],
                &[(NAMESPACE_LABEL, LabelValue::Str(ns.into()))],
            );
        }
        let spread = kiln_pprof::decode(
            &kiln_pprof::encode_gzip(&b.finish()),
            &DecodeLimits::default(),
        )
        .expect("decodes");
        let name_only = LabelSet::new(vec![Label::new(NAME_LABEL, "process_cpu")]);
        let mut head = Head::new();
        let stats = head
            .ingest(&spread, &name_only, 1, 10, &limits)
            .expect("one new series in each of three namespaces");
        assert_eq!(stats.series_created, 3);
        let one = distinct_label_profile(1);
        head.ingest(&one, &labels_in("n4", "a"), 1, 10, &limits)
            .expect("the fourth series fits");
        let err = head
            .check_ingest(&one, &labels_in("n5", "a"), 10, &limits)
            .unwrap_err();
        assert!(
            matches!(
                err,
                IngestError::TooManySeriesInStore { count: 5, limit: 4 }
            ),
            "{err}"
        );
        assert_eq!(err.reason(), "too_many_series_in_store");
        let stats = head
            .ingest(&spread, &name_only, 2, 10, &limits)
            .expect("existing series still ingest at the store-wide limit");
        assert_eq!(stats.series_created, 0);
    }
}
