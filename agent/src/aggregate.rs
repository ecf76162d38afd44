//! Turning one drained generation of kernel maps into per-target groups of
//! stack samples (pure: no maps, no /proc).

use std::collections::{BTreeMap, HashMap};

use crate::abi::{
    self, CountKey, CountValue, FilterMode, MAX_STACK_DEPTH, SampleKind, StackSnapshot,
};

/// One generation as read from the kernel.
#[derive(Debug, Clone, Default)]
pub struct DrainedWindow {
    /// Count map entries.
    pub counts: Vec<(CountKey, CountValue)>,
    /// Stack map entries: id to instruction pointers, leaf first.
    pub stacks: HashMap<u32, Vec<u64>>,
}

/// Which profile a sample goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKey {
    /// One process (a PID and its start time, so a reused PID is another group).
    Process {
        /// Process id.
        pid: u32,
        /// Process start, ns since boot.
        start_boottime_ns: u64,
    },
    /// One cgroup (a container).
    Cgroup {
        /// cgroup v2 id.
        cgroup_id: u64,
    },
}

/// A stack and how often it was sampled, with the process it ran in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSample {
    /// Process id.
    pub pid: u32,
    /// Thread id (0 when not recorded).
    pub tid: u32,
    /// Process start, ns since boot.
    pub start_boottime_ns: u64,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// comm recorded by the kernel for the first sample of this key.
    pub comm: String,
    /// User instruction pointers, leaf first (empty when missing).
    pub user: Vec<u64>,
    /// Kernel instruction pointers, leaf first (empty when missing).
    pub kernel: Vec<u64>,
    /// A CPU sample or an off-CPU block: which profile it goes into.
    pub kind: SampleKind,
    /// Number of samples (CPU) or of captured blocks (off-CPU).
    pub count: u64,
    /// Off-CPU time the blocks stand for, ns (0 for CPU samples).
    pub off_cpu_ns: u64,
}

/// What was lost while turning a window into groups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowLosses {
    /// Stacks at the maximum depth, so probably cut short (samples).
    pub truncated_stacks: u64,
    /// Stack ids missing from the stack map (samples).
    pub missing_stacks: u64,
}

/// The group a sample belongs to in `mode`'s grouping: per process for PID
/// and whole-host modes, per cgroup for cgroup targets.
pub fn group_of(sample: &StackSample, mode: FilterMode) -> GroupKey {
    match mode {
        FilterMode::Cgroups => GroupKey::Cgroup {
            cgroup_id: sample.cgroup_id,
        },
        FilterMode::All | FilterMode::Pids => GroupKey::Process {
            pid: sample.pid,
            start_boottime_ns: sample.start_boottime_ns,
        },
    }
}

/// Stacks unwound in userspace during one window, counted per (process,
/// thread, cgroup, user stack, kernel stack) like the kernel's count maps,
/// and bounded like them.
#[derive(Debug, Default)]
pub struct UnwoundWindow {
    counts: HashMap<UnwoundKey, UnwoundValue>,
    capacity: usize,
    dropped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct UnwoundKey {
    pid: u32,
    tid: u32,
    start_boottime_ns: u64,
    cgroup_id: u64,
    user: Vec<u64>,
    kernel: Vec<u64>,
    kind: SampleKind,
}

#[derive(Debug, Clone, Copy)]
struct UnwoundValue {
    count: u64,
    off_cpu_ns: u64,
    comm: [u8; 16],
}

impl UnwoundWindow {
    /// An empty window holding at most `capacity` distinct stacks.
    pub fn new(capacity: usize) -> UnwoundWindow {
        UnwoundWindow {
            counts: HashMap::new(),
            capacity: capacity.max(1),
            dropped: 0,
        }
    }

    /// Counts one sample of `snapshot` whose user stack unwound to `user`.
    /// A new stack past the capacity is dropped (and counted).
    pub fn add(&mut self, snapshot: &StackSnapshot<'_>, user: Vec<u64>) {
        let key = UnwoundKey {
            pid: snapshot.pid,
            tid: snapshot.tid,
            start_boottime_ns: snapshot.start_boottime_ns,
            cgroup_id: snapshot.cgroup_id,
            user,
            kernel: snapshot.kernel.clone(),
            kind: snapshot.kind,
        };
        if let Some(value) = self.counts.get_mut(&key) {
            value.count += 1;
            value.off_cpu_ns = value.off_cpu_ns.saturating_add(snapshot.off_cpu_ns);
        } else if self.counts.len() < self.capacity {
            let value = UnwoundValue {
                count: 1,
                off_cpu_ns: snapshot.off_cpu_ns,
                comm: snapshot.comm,
            };
            self.counts.insert(key, value);
        } else {
            self.dropped += 1;
        }
    }

    /// The window's samples, and how many were dropped; leaves it empty.
    pub fn take(&mut self) -> (Vec<StackSample>, u64) {
        let samples = self
            .counts
            .drain()
            .map(|(key, value)| StackSample {
                pid: key.pid,
                tid: key.tid,
                start_boottime_ns: key.start_boottime_ns,
                cgroup_id: key.cgroup_id,
                comm: abi::comm_to_string(&value.comm),
                user: key.user,
                kernel: key.kernel,
                kind: key.kind,
                count: value.count,
                off_cpu_ns: value.off_cpu_ns,
            })
            .collect();
        (samples, std::mem::take(&mut self.dropped))
    }
}

/// Splits a drained window into per-target groups (see [`group_of`]).
pub fn group_window(
    window: DrainedWindow,
    mode: FilterMode,
) -> (BTreeMap<GroupKey, Vec<StackSample>>, WindowLosses) {
    let mut groups: BTreeMap<GroupKey, Vec<StackSample>> = BTreeMap::new();
    let mut losses = WindowLosses::default();
    for (key, value) in window.counts {
        if value.samples == 0 {
            continue;
        }
        let mut resolve = |id: i32| -> Vec<u64> {
            let Ok(id) = u32::try_from(id) else {
                // Negative: the kernel could not record it (counted there).
                return Vec::new();
            };
            match window.stacks.get(&id) {
                Some(frames) => {
                    if frames.len() >= MAX_STACK_DEPTH {
                        losses.truncated_stacks += value.samples;
                    }
                    frames.clone()
                }
                None => {
                    losses.missing_stacks += value.samples;
                    Vec::new()
                }
            }
        };
        let user = resolve(key.user_stack_id);
        let kernel = resolve(key.kernel_stack_id);
        let sample = StackSample {
            pid: key.pid,
            tid: key.tid,
            start_boottime_ns: key.start_boottime_ns,
            cgroup_id: key.cgroup_id,
            comm: abi::comm_to_string(&value.comm),
            user,
            kernel,
            kind: SampleKind::Cpu,
            count: value.samples,
            off_cpu_ns: 0,
        };
        groups
            .entry(group_of(&sample, mode))
            .or_default()
            .push(sample);
    }
    (groups, losses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::PyStatus;

    fn key(pid: u32, cgroup_id: u64, user: i32, kernel: i32) -> CountKey {
        CountKey {
            pid,
            tid: 0,
            cgroup_id,
            start_boottime_ns: 1000 + u64::from(pid),
            user_stack_id: user,
            kernel_stack_id: kernel,
        }
    }

    fn value(samples: u64) -> CountValue {
        let mut comm = [0u8; 16];
        comm[..3].copy_from_slice(b"hot");
        CountValue { samples, comm }
    }

    #[test]
    fn process_mode_groups_by_pid_and_start_and_resolves_both_stacks() {
        let window = DrainedWindow {
            counts: vec![
                (key(10, 5, 1, 2), value(3)),
                (key(10, 5, 1, -14), value(1)),
                (key(11, 5, -17, 2), value(2)),
            ],
            stacks: HashMap::from([(1, vec![0x10, 0x20]), (2, vec![0xffff_0000])]),
        };
        let (groups, losses) = group_window(window, FilterMode::Pids);
        assert_eq!(losses, WindowLosses::default());
        assert_eq!(groups.len(), 2);
        let first = &groups[&GroupKey::Process {
            pid: 10,
            start_boottime_ns: 1010,
        }];
        assert_eq!(first.len(), 2);
        assert_eq!(first[0].user, vec![0x10, 0x20]);
        assert_eq!(first[0].kernel, vec![0xffff_0000]);
        assert!(first[1].kernel.is_empty());
        assert_eq!(first[0].comm, "hot");
    }

    #[test]
    fn cgroup_mode_puts_processes_of_one_cgroup_together() {
        let window = DrainedWindow {
            counts: vec![(key(10, 5, 1, -1), value(1)), (key(11, 5, 1, -1), value(1))],
            stacks: HashMap::from([(1, vec![0x10])]),
        };
        let (groups, _) = group_window(window, FilterMode::Cgroups);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[&GroupKey::Cgroup { cgroup_id: 5 }].len(), 2);
    }

    #[test]
    fn unwound_window_counts_equal_stacks_and_bounds_distinct_ones() {
        let stack = [0u8; 0];
        let snapshot = |pid: u32| StackSnapshot {
            pid,
            tid: 0,
            cgroup_id: 9,
            start_boottime_ns: 5,
            ip: 0x10,
            sp: 0,
            bp: 0,
            comm: *b"busy\0\0\0\0\0\0\0\0\0\0\0\0",
            kind: SampleKind::Cpu,
            off_cpu_ns: 0,
            kernel: vec![0xffff_1000],
            py_status: PyStatus::None,
            py_frames: Vec::new(),
            stack: &stack,
        };
        let mut window = UnwoundWindow::new(2);
        window.add(&snapshot(1), vec![0x10, 0x20]);
        window.add(&snapshot(1), vec![0x10, 0x20]);
        window.add(&snapshot(1), vec![0x10, 0x30]);
        window.add(&snapshot(2), vec![0x10]);
        let (mut samples, dropped) = window.take();
        samples.sort_by_key(|s| (s.pid, s.user.clone()));
        assert_eq!(dropped, 1, "the third distinct stack is over the capacity");
        assert_eq!(samples.len(), 2);
        assert_eq!((samples[0].count, samples[0].comm.as_str()), (2, "busy"));
        assert_eq!(samples[0].kernel, vec![0xffff_1000]);
        assert_eq!(window.take(), (Vec::new(), 0), "take empties the window");
    }

    #[test]
    fn unwound_window_keeps_off_cpu_blocks_apart_and_sums_their_time() {
        let stack = [0u8; 0];
        let snapshot = |kind: SampleKind, off_cpu_ns: u64| StackSnapshot {
            pid: 1,
            tid: 0,
            cgroup_id: 9,
            start_boottime_ns: 5,
            ip: 0x10,
            sp: 0,
            bp: 0,
            comm: *b"wait\0\0\0\0\0\0\0\0\0\0\0\0",
            kind,
            off_cpu_ns,
            kernel: vec![0xffff_1000],
            py_status: PyStatus::None,
            py_frames: Vec::new(),
            stack: &stack,
        };
        let mut window = UnwoundWindow::new(8);
        window.add(&snapshot(SampleKind::Cpu, 0), vec![0x10]);
        window.add(&snapshot(SampleKind::OffCpu, 3_000_000), vec![0x10]);
        window.add(&snapshot(SampleKind::OffCpu, 5_000_000), vec![0x10]);
        let (mut samples, dropped) = window.take();
        samples.sort_by_key(|s| s.kind);
        assert_eq!(dropped, 0);
        let summary: Vec<_> = samples
            .iter()
            .map(|s| (s.kind, s.count, s.off_cpu_ns))
            .collect();
        assert_eq!(
            summary,
            vec![(SampleKind::Cpu, 1, 0), (SampleKind::OffCpu, 2, 8_000_000)],
            "the same stack on and off the CPU goes into two profiles"
        );
    }

    #[test]
    fn full_depth_and_missing_stacks_are_counted_as_losses() {
        let window = DrainedWindow {
            counts: vec![(key(1, 1, 1, 9), value(4))],
            stacks: HashMap::from([(1, vec![1; MAX_STACK_DEPTH])]),
        };
        let (_, losses) = group_window(window, FilterMode::All);
        assert_eq!(losses.truncated_stacks, 4);
        assert_eq!(losses.missing_stacks, 4);
    }
}
