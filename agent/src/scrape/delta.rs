//! What is stored of a scraped pprof (pure): the sample types kept per
//! profile, and cumulative profiles turned into deltas against the previous
//! scrape of the same endpoint and profile.
//!
//! Go's `allocs`, `mutex` and `block` profiles count since the process
//! started. Stored as scraped, a range query would sum the process's whole
//! history once per scrape; stored as the difference between two scrapes
//! (as Parca and Pyroscope do), a range query means "in this range". Heap
//! `inuse_*` and goroutine counts are already gauges and are stored as
//! scraped.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kiln_pprof::{Profile, proto};
use kiln_targets::PprofProfile;

/// Why a scraped profile cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// None of the profile's sample types is one this profile keeps (a
    /// heap profile without `inuse_*`, not a Go endpoint).
    #[error("the {profile} profile has none of the sample types {wanted} (it has {found})")]
    SampleTypes {
        /// The profile scraped.
        profile: &'static str,
        /// The prefix or names kept.
        wanted: &'static str,
        /// The sample types it had, comma-separated.
        found: String,
    },
}

impl PrepareError {
    /// A fixed metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            PrepareError::SampleTypes { .. } => "sample_types",
        }
    }
}

/// A scraped profile reduced to what is stored, with each sample's stack
/// identity (not its ids, which a process may renumber between scrapes).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The profile, only the kept sample types left in it.
    pub profile: proto::Profile,
    /// Per sample: a hash of its frames (function, file, line; the address
    /// where a location has no lines) and its labels.
    pub stack_keys: Vec<u64>,
}

/// The sample types `profile` keeps: `heap` its `inuse_*` (a gauge; the
/// `alloc_*` it also carries are the `allocs` profile's), `allocs` its
/// `alloc_*`, the others every type.
fn keeps(profile: PprofProfile, sample_type: &str) -> bool {
    match profile {
        PprofProfile::Heap => sample_type.starts_with("inuse_"),
        PprofProfile::Allocs => sample_type.starts_with("alloc_"),
        PprofProfile::Goroutine | PprofProfile::Mutex | PprofProfile::Block => true,
    }
}

fn wanted(profile: PprofProfile) -> &'static str {
    match profile {
        PprofProfile::Heap => "inuse_*",
        PprofProfile::Allocs => "alloc_*",
        PprofProfile::Goroutine | PprofProfile::Mutex | PprofProfile::Block => "any",
    }
}

/// Keeps `kind`'s sample types of `profile` and keys its samples by stack.
pub fn prepare(kind: PprofProfile, profile: Profile) -> Result<Prepared, PrepareError> {
    let names: Vec<&str> = profile
        .sample_types()
        .iter()
        .map(|t| profile.string(t.r#type))
        .collect();
    let kept: Vec<usize> = (0..names.len())
        .filter(|&i| names.get(i).is_some_and(|name| keeps(kind, name)))
        .collect();
    if kept.is_empty() {
        return Err(PrepareError::SampleTypes {
            profile: kind.path(),
            wanted: wanted(kind),
            found: names.join(","),
        });
    }
    let stack_keys = profile
        .samples()
        .iter()
        .map(|s| stack_key(&profile, s))
        .collect();
    // The default type must stay one of the kept ones: the first kept
    // `*_space` (bytes) if any, as `go tool pprof` would pick, else the last.
    let default_name = kept
        .iter()
        .filter_map(|&i| names.get(i).copied())
        .find(|name| name.ends_with("_space"))
        .or_else(|| kept.last().and_then(|&i| names.get(i).copied()))
        .unwrap_or_default()
        .to_owned();
    let mut raw = profile.into_raw();
    if kept.len() != raw.sample_type.len() {
        raw.sample_type = kept
            .iter()
            .filter_map(|&i| raw.sample_type.get(i).copied())
            .collect();
        for sample in &mut raw.sample {
            sample.value = kept
                .iter()
                .map(|&i| sample.value.get(i).copied().unwrap_or(0))
                .collect();
        }
    }
    raw.default_sample_type = raw
        .string_table
        .iter()
        .position(|s| s.as_slice() == default_name.as_bytes())
        .and_then(|i| i64::try_from(i).ok())
        .unwrap_or(0);
    Ok(Prepared {
        profile: raw,
        stack_keys,
    })
}

/// A sample's identity across scrapes: its frames by name, file and line
/// (the address for a location without lines), then its labels sorted.
fn stack_key(profile: &Profile, sample: &proto::Sample) -> u64 {
    let mut hasher = DefaultHasher::new();
    for &id in &sample.location_id {
        let Some(location) = profile.location(id) else {
            continue;
        };
        if location.line.is_empty() {
            (0u8, location.address).hash(&mut hasher);
        }
        for line in &location.line {
            let function = profile.function(line.function_id);
            1u8.hash(&mut hasher);
            profile
                .string(function.map_or(0, |f| f.name))
                .hash(&mut hasher);
            profile
                .string(function.map_or(0, |f| f.filename))
                .hash(&mut hasher);
            line.line.hash(&mut hasher);
        }
        2u8.hash(&mut hasher);
    }
    let mut labels: Vec<(&str, &str, i64, &str)> = sample
        .label
        .iter()
        .map(|l| {
            (
                profile.string(l.key),
                profile.string(l.str),
                l.num,
                profile.string(l.num_unit),
            )
        })
        .collect();
    labels.sort_unstable();
    labels.hash(&mut hasher);
    hasher.finish()
}

/// What became of one scrape of a cumulative profile.
#[derive(Debug, Clone, PartialEq)]
pub enum DeltaOutcome {
    /// The first scrape of this endpoint and profile: only a baseline, since
    /// it counts from a process start at an unknown time.
    Baseline,
    /// What happened since the previous scrape (samples that did not change
    /// are left out).
    Delta(proto::Profile),
    /// A stack's value fell or a stack vanished, so the process restarted
    /// since the previous scrape: everything it counted happened since
    /// then, and the scrape is stored whole over that interval.
    Restarted(proto::Profile),
    /// The previous scrape could not be kept within the state budget, so no
    /// delta can be taken; this scrape is not kept either.
    OverBudget,
}

/// The previous scrape of one endpoint's profile.
#[derive(Debug)]
struct Previous {
    scraped_unix_ns: i64,
    values: HashMap<u64, Vec<i64>>,
    bytes: usize,
}

/// Bytes one kept stack costs: its key, its values, the map's overhead.
fn entry_bytes(values: usize) -> usize {
    8 + 24 + 8 * values + 16
}

/// The previous scrape of every (endpoint, cumulative profile), bounded in
/// bytes. The endpoint names the process: a pod and container, or a URL.
#[derive(Debug)]
pub struct DeltaState {
    previous: HashMap<(String, PprofProfile), Previous>,
    bytes: usize,
    budget_bytes: usize,
}

impl DeltaState {
    /// State of at most `budget_bytes`.
    pub fn new(budget_bytes: usize) -> DeltaState {
        DeltaState {
            previous: HashMap::new(),
            bytes: 0,
            budget_bytes,
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets every endpoint `keep` refuses (gone pods, removed targets).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let mut freed = 0;
        self.previous.retain(|(endpoint, _), previous| {
            let kept = keep(endpoint);
            if !kept {
                freed += previous.bytes;
            }
            kept
        });
        self.bytes = self.bytes.saturating_sub(freed);
    }

    /// The delta of `scrape` (of cumulative `kind` from `endpoint`, taken at
    /// `scraped_unix_ns`) against the previous scrape, which it replaces.
    pub fn delta(
        &mut self,
        endpoint: &str,
        kind: PprofProfile,
        scrape: Prepared,
        scraped_unix_ns: i64,
    ) -> DeltaOutcome {
        let Prepared {
            profile,
            stack_keys,
        } = scrape;
        // Sum samples of equal identity; `first` keeps where each was first
        // seen, the sample written out for it.
        let mut current: HashMap<u64, Vec<i64>> = HashMap::with_capacity(stack_keys.len());
        let mut first: Vec<(u64, usize)> = Vec::new();
        for (index, (key, sample)) in stack_keys.iter().zip(&profile.sample).enumerate() {
            // Go lists buckets it has not published yet as zeros without
            // their `bytes` label, which they gain once counted: a zero
            // sample names no stack yet, and its vanishing is no restart.
            if sample.value.iter().all(|v| *v == 0) {
                continue;
            }
            match current.get_mut(key) {
                Some(sum) => {
                    for (total, value) in sum.iter_mut().zip(&sample.value) {
                        *total = total.saturating_add(*value);
                    }
                }
                None => {
                    current.insert(*key, sample.value.clone());
                    first.push((*key, index));
                }
            }
        }
        let id = (endpoint.to_owned(), kind);
        let previous = self.previous.remove(&id);
        if let Some(previous) = &previous {
            self.bytes = self.bytes.saturating_sub(previous.bytes);
        }
        let outcome = match &previous {
            None => DeltaOutcome::Baseline,
            Some(previous) => {
                let restarted = previous.values.iter().any(|(key, before)| {
                    current
                        .get(key)
                        .is_none_or(|now| now.iter().zip(before).any(|(now, before)| now < before))
                });
                let zero = Vec::new();
                let mut out = profile.clone();
                out.sample = first
                    .iter()
                    .filter_map(|&(key, index)| {
                        let now = current.get(&key)?;
                        let before = if restarted {
                            &zero
                        } else {
                            previous.values.get(&key).unwrap_or(&zero)
                        };
                        let value: Vec<i64> = now
                            .iter()
                            .enumerate()
                            .map(|(i, v)| v.saturating_sub(before.get(i).copied().unwrap_or(0)))
                            .collect();
                        if value.iter().all(|v| *v == 0) {
                            return None;
                        }
                        let mut sample = profile.sample.get(index)?.clone();
                        sample.value = value;
                        Some(sample)
                    })
                    .collect();
                out.time_nanos = previous.scraped_unix_ns;
                out.duration_nanos = scraped_unix_ns
                    .saturating_sub(previous.scraped_unix_ns)
                    .max(1);
                if restarted {
                    DeltaOutcome::Restarted(out)
                } else {
                    DeltaOutcome::Delta(out)
                }
            }
        };
        let bytes = current
            .values()
            .map(|v| entry_bytes(v.len()))
            .sum::<usize>()
            .saturating_add(endpoint.len());
        if self.bytes.saturating_add(bytes) > self.budget_bytes {
            return DeltaOutcome::OverBudget;
        }
        self.bytes += bytes;
        self.previous.insert(
            id,
            Previous {
                scraped_unix_ns,
                values: current,
                bytes,
            },
        );
        outcome
    }
}

/// A gauge as stored: stamped at the scrape, with no duration, so the store
/// files it as a point in time (a profile with a duration is a delta).
pub fn as_gauge(mut profile: proto::Profile, scraped_unix_ns: i64) -> proto::Profile {
    profile.time_nanos = scraped_unix_ns;
    profile.duration_nanos = 0;
    profile
}

#[cfg(test)]
mod tests;
