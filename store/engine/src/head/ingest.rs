//! Normalizing one pprof profile into series, stacks and values.
//!
//! - each sample type becomes its own profile type (and so its own series);
//! - string sample labels are promoted to series labels (a name colliding
//!   with a series label becomes `exported_<name>` when its value differs
//!   and is dropped when it repeats the series label), except those named in
//!   `kiln_contract::sample_labels` (span, trace and profile ids; the
//!   agent's `pid`, `tid` and `comm`);
//! - those and numeric labels stay per sample, as a deduplicated label set
//!   that is part of the stack key;
//! - zero values are dropped.
//!
//! Everything is checked before the head is touched, so a refused profile
//! leaves no trace. The phases, one module each:
//!
//! 1. `limits`: the request's labels and the profile's size against
//!    [`IngestLimits`];
//! 2. `signatures`: samples grouped by the labels they promote, and the
//!    (signature, profile type) slots that receive a value;
//! 3. `series_labels`: each such slot's series labels, built and checked,
//!    and the series it would create counted against the head's limits;
//! 4. `apply`: symbols interned (`interner`) and points appended to the
//!    series. Phases 1 to 3 only read the head ([`Head::check_ingest`] runs
//!    them alone); phase 4 cannot fail.

use kiln_pprof::{DecodedProfile, ProfileView};

mod apply;
mod interner;
mod limits;
mod location_keys;
mod recording;
mod series_labels;
mod signatures;
#[cfg(test)]
mod tests;

pub use limits::IngestLimits;

use super::{Head, SeriesCensus};
use crate::error::IngestError;
use crate::model::{LabelSet, NAMESPACE_LABEL, ProfileType};
use signatures::Signatures;

const UNSEEN: u32 = u32::MAX;

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

/// The profile types of `profile`, one per sample type.
pub(crate) fn profile_types_of(
    profile: &impl ProfileView,
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
/// (or allocating series label sets) again. It depends on the profile and
/// the labels only, never on what the head holds, so it stays valid while
/// other ingests (or a head cut) change the head.
#[derive(Debug)]
struct Plan {
    /// The profile name (the request's `__name__`).
    name: String,
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
        signatures::is_promoted(&self.per_sample_keys, key, str_index)
    }
}

/// A profile that passed every check of [`Head::ingest`] against a head,
/// with what the checks resolved, so that applying it
/// ([`Head::apply_checked`]) after the request is logged redoes none of
/// them.
#[derive(Debug)]
pub struct CheckedIngest {
    profile: DecodedProfile,
    plan: Plan,
}

impl CheckedIngest {
    /// Runs every check of [`Head::check`] that does not depend on what a
    /// head holds: limits, signatures and series labels. The series limits
    /// are [`CheckedIngest::count_series`]'s, against the head it will be
    /// applied to. This is the expensive part of a check, so a sharded
    /// head runs it holding no lock.
    pub fn prepare(
        profile: impl Into<DecodedProfile>,
        labels: &LabelSet,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<Self, IngestError> {
        let profile = profile.into();
        let plan = plan_labels(&profile, labels, duration_nanos, limits)?;
        Ok(Self { profile, plan })
    }

    /// Counts the series this profile would create against `limits`, as
    /// the head (or the shards) `census` describes stands. One lookup per
    /// series the profile writes.
    pub fn count_series(
        &self,
        census: &impl SeriesCensus,
        limits: &IngestLimits,
    ) -> Result<(), IngestError> {
        series_labels::count_new_series(census, &self.plan.name, &self.plan.slot_labels, limits)
    }

    /// True when `census` holds every series this profile writes, so it
    /// creates none and no series limit can refuse it. One lookup per
    /// series; a sharded head asks the profile's own shard first and
    /// counts against every shard only when this is false.
    pub fn writes_only_held_series(&self, census: &impl SeriesCensus) -> bool {
        self.plan
            .slot_labels
            .iter()
            .flatten()
            .all(|labels| census.holds_series(labels))
    }

    /// The `namespace` label of each series the profile writes (`""` for
    /// a series without one), once per series.
    pub fn series_namespaces(&self) -> impl Iterator<Item = &str> {
        self.plan
            .slot_labels
            .iter()
            .flatten()
            .map(|labels| labels.get(NAMESPACE_LABEL).unwrap_or(""))
    }

    /// The profile that was checked.
    pub fn profile(&self) -> &DecodedProfile {
        &self.profile
    }

    /// Approximate bytes the resolved series label sets take while the
    /// checked profile waits to be applied.
    pub fn approx_plan_bytes(&self) -> usize {
        let labels: usize = self
            .plan
            .slot_labels
            .iter()
            .flatten()
            .flat_map(LabelSet::iter)
            .map(|l| limits::label_bytes(&l.name, &l.value))
            .sum();
        labels + self.plan.sample_signature.len() * 4 + self.plan.per_sample_keys.len()
    }
}

impl Head {
    /// Runs every check [`Head::ingest`] runs, without changing the head,
    /// and keeps what they resolved with the profile. The store calls it
    /// before logging a request, so nothing the engine would refuse
    /// reaches the write-ahead log, then applies the result.
    pub fn check(
        &self,
        profile: impl Into<DecodedProfile>,
        labels: &LabelSet,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<CheckedIngest, IngestError> {
        let checked = CheckedIngest::prepare(profile, labels, duration_nanos, limits)?;
        checked.count_series(self, limits)?;
        Ok(checked)
    }

    /// Applies a checked profile at `time_ms`; nothing is checked again,
    /// and nothing can fail. The head may have changed since the check
    /// (other ingests, a cut): series counts may then overshoot their
    /// limits by what was in flight, as for a logged record.
    pub fn apply_checked(&mut self, checked: CheckedIngest, time_ms: i64) -> IngestStats {
        self.apply(&checked.profile, checked.plan, time_ms)
    }

    /// Runs every check [`Head::ingest`] runs, without changing the head.
    pub fn check_ingest(
        &self,
        profile: &impl ProfileView,
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
        profile: &impl ProfileView,
        labels: &LabelSet,
        time_ms: i64,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<IngestStats, IngestError> {
        let plan = self.plan(profile, labels, duration_nanos, limits)?;
        Ok(self.apply(profile, plan, time_ms))
    }

    /// Phases 1 to 3: every check, nothing changed.
    fn plan(
        &self,
        profile: &impl ProfileView,
        labels: &LabelSet,
        duration_nanos: i64,
        limits: &IngestLimits,
    ) -> Result<Plan, IngestError> {
        let plan = plan_labels(profile, labels, duration_nanos, limits)?;
        series_labels::count_new_series(self, &plan.name, &plan.slot_labels, limits)?;
        Ok(plan)
    }
}

/// Phases 1 to 3 but the series count: every check that reads no head.
fn plan_labels(
    profile: &impl ProfileView,
    labels: &LabelSet,
    duration_nanos: i64,
    limits: &IngestLimits,
) -> Result<Plan, IngestError> {
    let name = limits::check_request(profile, labels, limits)?;
    let types = profile_types_of(profile, name, duration_nanos);
    let signatures = Signatures::group(profile, types.len());
    let slot_labels = series_labels::resolve(profile, labels, &types, &signatures, limits)?;
    let Signatures {
        per_sample_keys,
        sample_signature,
        ..
    } = signatures;
    Ok(Plan {
        name: name.to_owned(),
        types,
        per_sample_keys,
        sample_signature,
        slot_labels,
    })
}
