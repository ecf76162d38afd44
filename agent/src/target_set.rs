//! What to profile: the target set the BPF allow-lists are synced from, and
//! the seam ([`TargetSource`]) that discovery plugs into.
//!
//! The command line gives a static source (`--pid`, `--all`, `--cgroup`);
//! Kubernetes discovery (CRI) is another [`TargetSource`] that returns cgroup
//! targets labelled with pod metadata. The sampler asks its source for a fresh
//! [`TargetSet`] every few seconds and applies only the difference
//! ([`TargetSet::allow_list_changes`]) to the kernel maps.

use std::collections::BTreeMap;

use crate::abi::{FilterMode, TargetValue};

/// Labels attached to every profile of a target (e.g. `namespace`, `pod`).
pub type TargetLabels = BTreeMap<String, String>;

/// How one target is sampled and labelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetEntry {
    /// Labels of the target's profiles.
    pub labels: TargetLabels,
    /// Sampling frequency wanted for this target, if lower than the agent's.
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

    /// One sample in how many the kernel keeps so that a perf event at
    /// `base_hz` yields this target's rate (1 keeps all).
    pub fn keep_one_in(&self, base_hz: u32) -> u32 {
        match self.sampling_hz {
            Some(hz) if hz > 0 && hz < base_hz => {
                // Round to the nearest divisor; never 0.
                ((base_hz + hz / 2) / hz).max(1)
            }
            _ => 1,
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

    /// Map changes that turn the PID allow-list of `previous` into this one's.
    pub fn pid_changes(&self, previous: &TargetSet, base_hz: u32) -> AllowListChanges<u32> {
        self.changes_from(previous, base_hz, |set| match set {
            TargetSet::Pids(pids) => Some(pids),
            _ => None,
        })
    }

    /// Map changes that turn the cgroup allow-list of `previous` into this one's.
    pub fn cgroup_changes(&self, previous: &TargetSet, base_hz: u32) -> AllowListChanges<u64> {
        self.changes_from(previous, base_hz, |set| match set {
            TargetSet::Cgroups(cgroups) => Some(cgroups),
            _ => None,
        })
    }

    /// Changes between the allow-lists `list` reads from `previous` and
    /// from this set (a set of another mode allows nothing in that list).
    fn changes_from<K: Ord + Copy>(
        &self,
        previous: &TargetSet,
        base_hz: u32,
        list: fn(&TargetSet) -> Option<&BTreeMap<K, TargetEntry>>,
    ) -> AllowListChanges<K> {
        let empty = BTreeMap::new();
        allow_list_changes(
            list(previous).unwrap_or(&empty),
            list(self).unwrap_or(&empty),
            base_hz,
        )
    }
}

fn allow_list_changes<K: Ord + Copy>(
    old: &BTreeMap<K, TargetEntry>,
    new: &BTreeMap<K, TargetEntry>,
    base_hz: u32,
) -> AllowListChanges<K> {
    let mut changes = AllowListChanges::default();
    for (key, entry) in new {
        let value = TargetValue {
            keep_one_in: entry.keep_one_in(base_hz),
            reserved: 0,
        };
        let unchanged = old
            .get(key)
            .is_some_and(|previous| previous.keep_one_in(base_hz) == value.keep_one_in);
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

    #[test]
    fn keep_one_in_rounds_to_the_nearest_divisor_and_never_upsamples() {
        assert_eq!(entry(None).keep_one_in(99), 1);
        assert_eq!(entry(Some(19)).keep_one_in(99), 5);
        assert_eq!(entry(Some(10)).keep_one_in(99), 10);
        assert_eq!(entry(Some(200)).keep_one_in(99), 1);
        assert_eq!(entry(Some(0)).keep_one_in(99), 1);
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
            (3, entry(Some(10))),
            (4, entry(None)),
        ]));
        let changes = new.cgroup_changes(&old, 100);
        let upserted: Vec<_> = changes
            .upserts
            .iter()
            .map(|(k, v)| (*k, v.keep_one_in))
            .collect();
        assert_eq!(upserted, vec![(3, 10), (4, 1)]);
        assert_eq!(changes.removals, vec![1]);
        assert!(new.pid_changes(&old, 100).upserts.is_empty());
    }

    #[test]
    fn switching_from_pids_to_all_removes_every_pid() {
        let old = TargetSet::Pids(BTreeMap::from([(7, entry(None))]));
        let changes = TargetSet::All.pid_changes(&old, 19);
        assert_eq!(changes.removals, vec![7]);
        assert_eq!(TargetSet::All.filter_mode(), FilterMode::All);
    }
}
