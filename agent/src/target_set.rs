//! What to profile: the target set the BPF allow-lists are synced from, and
//! the seam ([`TargetSource`]) that discovery plugs into.
//!
//! The command line gives a static source (`--pid`, `--all`, `--cgroup`);
//! Kubernetes discovery (CRI) is another [`TargetSource`] that returns cgroup
//! targets labelled with pod metadata. The sampler asks its source for a fresh
//! [`TargetSet`] every few seconds and applies only the difference
//! ([`TargetSet::cgroup_changes`], [`TargetSet::pid_changes`]) to the kernel
//! maps, at the rates [`SamplingRates`] gives each target.

use std::collections::BTreeMap;

use crate::abi::{FilterMode, TargetValue};

/// Labels attached to every profile of a target (e.g. `namespace`, `pod`).
pub type TargetLabels = BTreeMap<String, String>;

/// How one target is sampled and labelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetEntry {
    /// Labels of the target's profiles.
    pub labels: TargetLabels,
    /// Sampling frequency this target asks for (a `ProfilingTarget`'s
    /// `samplingHz` or the pod's annotation); the agent's default if none.
    pub sampling_hz: Option<u32>,
}

impl TargetEntry {
    /// A target with labels and the agent's frequency.
    pub fn with_labels(labels: TargetLabels) -> TargetEntry {
        TargetEntry {
            labels,
            sampling_hz: None,
        }
    }
}

/// The agent's sampling rates: what a target that asks for none gets, and
/// the most any target may get.
///
/// The perf events of all CPUs run at one rate, the base: the highest any
/// current target asks for, within `max_hz`. Each target then keeps its
/// share of the base's samples in BPF ([`SamplingRates::keep_one_in`]), so
/// a 19 Hz target next to a 99 Hz one is still sampled at 19 Hz. The cap
/// bounds what one pod's annotation can cost the whole node: every CPU
/// takes an interrupt per base period, whatever it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplingRates {
    /// Rate of targets that ask for none, and of `--all` (Hz, at least 1).
    pub default_hz: u32,
    /// Highest base rate (Hz); below `default_hz` it is `default_hz`.
    pub max_hz: u32,
}

impl SamplingRates {
    /// The rate `entry` (none: a process outside any target) is sampled at.
    pub fn wanted_hz(&self, entry: Option<&TargetEntry>) -> u32 {
        let default = self.default_hz.max(1);
        entry
            .and_then(|e| e.sampling_hz)
            .filter(|&hz| hz > 0)
            .unwrap_or(default)
            .min(self.max_hz.max(default))
    }

    /// The rate the perf events run at for `targets`: the highest any
    /// target wants, and the default when there is none.
    pub fn base_hz(&self, targets: &TargetSet) -> u32 {
        let entries = match targets {
            TargetSet::All => None,
            TargetSet::Pids(pids) => pids.values().map(|e| self.wanted_hz(Some(e))).max(),
            TargetSet::Cgroups(cgroups) => cgroups.values().map(|e| self.wanted_hz(Some(e))).max(),
        };
        entries.unwrap_or_else(|| self.wanted_hz(None))
    }

    /// One sample in how many the kernel keeps so that perf events at
    /// `base_hz` give `entry` its rate, rounded to the nearest divisor
    /// (1 keeps all; a target is never sampled above the base).
    pub fn keep_one_in(&self, entry: Option<&TargetEntry>, base_hz: u32) -> u32 {
        let wanted = self.wanted_hz(entry);
        if wanted < base_hz {
            ((base_hz + wanted / 2) / wanted).max(1)
        } else {
            1
        }
    }
}

/// A complete description of what the kernel should sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSet {
    /// Every process on the host.
    All,
    /// Processes by tgid (root PID namespace).
    Pids(BTreeMap<u32, TargetEntry>),
    /// Processes by cgroup v2 id (the inode number of the cgroup directory).
    Cgroups(BTreeMap<u64, TargetEntry>),
}

/// Changes to one allow-list map: keys to insert or update, keys to remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowListChanges<K> {
    /// Keys whose value is new or changed.
    pub upserts: Vec<(K, TargetValue)>,
    /// Keys no longer allowed.
    pub removals: Vec<K>,
}

impl<K> Default for AllowListChanges<K> {
    fn default() -> Self {
        AllowListChanges {
            upserts: Vec::new(),
            removals: Vec::new(),
        }
    }
}

impl TargetSet {
    /// The filter mode the kernel program runs in for this set.
    pub fn filter_mode(&self) -> FilterMode {
        match self {
            TargetSet::All => FilterMode::All,
            TargetSet::Pids(_) => FilterMode::Pids,
            TargetSet::Cgroups(_) => FilterMode::Cgroups,
        }
    }

    /// The labels and rate of the target a sample of `(pid, cgroup)` belongs to.
    pub fn entry_for(&self, pid: u32, cgroup_id: u64) -> Option<&TargetEntry> {
        match self {
            TargetSet::All => None,
            TargetSet::Pids(pids) => pids.get(&pid),
            TargetSet::Cgroups(cgroups) => cgroups.get(&cgroup_id),
        }
    }

    /// Map changes that turn the PID allow-list of `previous` (kept at
    /// `rates.base_hz(previous)`) into this one's.
    pub fn pid_changes(&self, previous: &TargetSet, rates: SamplingRates) -> AllowListChanges<u32> {
        self.changes_from(previous, rates, |set| match set {
            TargetSet::Pids(pids) => Some(pids),
            _ => None,
        })
    }

    /// Map changes that turn the cgroup allow-list of `previous` into this one's.
    pub fn cgroup_changes(
        &self,
        previous: &TargetSet,
        rates: SamplingRates,
    ) -> AllowListChanges<u64> {
        self.changes_from(previous, rates, |set| match set {
            TargetSet::Cgroups(cgroups) => Some(cgroups),
            _ => None,
        })
    }

    /// Changes between the allow-lists `list` reads from `previous` and
    /// from this set (a set of another mode allows nothing in that list).
    /// A new base rate rewrites every entry whose share it changes.
    fn changes_from<K: Ord + Copy>(
        &self,
        previous: &TargetSet,
        rates: SamplingRates,
        list: fn(&TargetSet) -> Option<&BTreeMap<K, TargetEntry>>,
    ) -> AllowListChanges<K> {
        let empty = BTreeMap::new();
        let old = list(previous).unwrap_or(&empty);
        let new = list(self).unwrap_or(&empty);
        let (old_base, new_base) = (rates.base_hz(previous), rates.base_hz(self));
        let mut changes = AllowListChanges::default();
        for (key, entry) in new {
            let value = TargetValue {
                keep_one_in: rates.keep_one_in(Some(entry), new_base),
                reserved: 0,
            };
            let unchanged = old.get(key).is_some_and(|previous| {
                rates.keep_one_in(Some(previous), old_base) == value.keep_one_in
            });
            if !unchanged {
                changes.upserts.push((*key, value));
            }
        }
        changes.removals = old
            .keys()
            .filter(|key| !new.contains_key(key))
            .copied()
            .collect();
        changes
    }
}

/// Where the target set comes from. Implemented by the command line's static
/// lists and by Kubernetes discovery; polled by the agent every few seconds.
pub trait TargetSource: Send {
    /// The current targets. An error keeps the previous set in force.
    fn current_targets(&mut self) -> Result<TargetSet, TargetSourceError>;
}

/// Why a target source could not produce a target set.
#[derive(Debug, thiserror::Error)]
pub enum TargetSourceError {
    /// A cgroup directory could not be resolved to its id.
    #[error("cannot resolve cgroup {path} to an id")]
    CgroupUnresolvable {
        /// The cgroup directory.
        path: std::path::PathBuf,
        /// What stat(2) said.
        #[source]
        source: std::io::Error,
    },
    /// Discovery (e.g. the container runtime) failed.
    #[error("target discovery failed: {detail}")]
    Discovery {
        /// What went wrong.
        detail: String,
    },
}

impl TargetSourceError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            TargetSourceError::CgroupUnresolvable { .. } => "cgroup_unresolvable",
            TargetSourceError::Discovery { .. } => "discovery",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hz: Option<u32>) -> TargetEntry {
        TargetEntry {
            labels: TargetLabels::new(),
            sampling_hz: hz,
        }
    }

    const RATES: SamplingRates = SamplingRates {
        default_hz: 19,
        max_hz: 100,
    };

    #[test]
    fn keep_one_in_rounds_to_the_nearest_divisor_and_never_upsamples() {
        assert_eq!(RATES.keep_one_in(Some(&entry(None)), 99), 5, "the default");
        assert_eq!(RATES.keep_one_in(None, 19), 1);
        assert_eq!(RATES.keep_one_in(Some(&entry(Some(19))), 99), 5);
        assert_eq!(RATES.keep_one_in(Some(&entry(Some(10))), 99), 10);
        assert_eq!(RATES.keep_one_in(Some(&entry(Some(99))), 99), 1);
        assert_eq!(RATES.keep_one_in(Some(&entry(Some(200))), 99), 1);
        assert_eq!(RATES.keep_one_in(Some(&entry(Some(0))), 19), 1);
    }

    #[test]
    fn the_base_is_the_highest_rate_asked_within_the_cap() {
        let set = |hz: &[Option<u32>]| {
            TargetSet::Cgroups(
                hz.iter()
                    .enumerate()
                    .map(|(i, h)| (i as u64, entry(*h)))
                    .collect(),
            )
        };
        assert_eq!(RATES.base_hz(&TargetSet::All), 19);
        assert_eq!(RATES.base_hz(&set(&[])), 19);
        assert_eq!(RATES.base_hz(&set(&[None, Some(7)])), 19);
        assert_eq!(RATES.base_hz(&set(&[Some(19), Some(99)])), 99);
        assert_eq!(RATES.base_hz(&set(&[Some(1000)])), 100, "capped");
        let low_cap = SamplingRates {
            default_hz: 49,
            max_hz: 10,
        };
        assert_eq!(
            low_cap.base_hz(&set(&[Some(99)])),
            49,
            "never below the default"
        );
    }

    #[test]
    fn cgroup_changes_insert_new_update_changed_and_remove_gone_targets() {
        let old = TargetSet::Cgroups(BTreeMap::from([
            (1, entry(None)),
            (2, entry(None)),
            (3, entry(None)),
        ]));
        let new = TargetSet::Cgroups(BTreeMap::from([
            (2, entry(None)),
            (3, entry(Some(2))),
            (4, entry(None)),
        ]));
        let changes = new.cgroup_changes(&old, RATES);
        let upserted: Vec<_> = changes
            .upserts
            .iter()
            .map(|(k, v)| (*k, v.keep_one_in))
            .collect();
        assert_eq!(upserted, vec![(3, 10), (4, 1)]);
        assert_eq!(changes.removals, vec![1]);
        assert!(new.pid_changes(&old, RATES).upserts.is_empty());
    }

    #[test]
    fn a_new_base_rate_rewrites_the_shares_it_changes() {
        let old = TargetSet::Cgroups(BTreeMap::from([(1, entry(None)), (2, entry(Some(19)))]));
        let new = TargetSet::Cgroups(BTreeMap::from([
            (1, entry(None)),
            (2, entry(Some(19))),
            (3, entry(Some(99))),
        ]));
        let changes = new.cgroup_changes(&old, RATES);
        let upserted: Vec<_> = changes
            .upserts
            .iter()
            .map(|(k, v)| (*k, v.keep_one_in))
            .collect();
        assert_eq!(upserted, vec![(1, 5), (2, 5), (3, 1)]);
        let back = old.cgroup_changes(&new, RATES);
        let upserted: Vec<_> = back
            .upserts
            .iter()
            .map(|(k, v)| (*k, v.keep_one_in))
            .collect();
        assert_eq!(upserted, vec![(1, 1), (2, 1)]);
        assert_eq!(back.removals, vec![3]);
    }

    #[test]
    fn switching_from_pids_to_all_removes_every_pid() {
        let old = TargetSet::Pids(BTreeMap::from([(7, entry(None))]));
        let changes = TargetSet::All.pid_changes(&old, RATES);
        assert_eq!(changes.removals, vec![7]);
        assert_eq!(TargetSet::All.filter_mode(), FilterMode::All);
    }
}
