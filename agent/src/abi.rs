//! The Rust mirror of `bpf/kiln.h`, the kernel <-> user ABI of the sampler.
//!
//! Every struct is `#[repr(C)]` with the same field order and widths as its C
//! twin, and its size is asserted at compile time so a change on one side
//! without the other fails the build.

/// Deepest stack the kernel records (`KILN_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;

/// Per-CPU counters in the `counters` map (`enum kiln_counter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelCounter {
    /// Samples of targeted processes that reached aggregation.
    Samples,
    /// User stacks lost to a stack-map bucket holding another stack.
    UserStackCollision,
    /// Kernel stacks lost to a stack-map bucket holding another stack.
    KernelStackCollision,
    /// Stacks lost for another reason (map full, fault).
    StackError,
    /// Samples lost because the generation's count map was full.
    CountsFull,
    /// Samples skipped by per-target subsampling.
    Subsampled,
    /// First samples of a process announced to userspace.
    NewProcess,
    /// Announcements lost because the ring buffer was full.
    NewProcessLost,
}

impl KernelCounter {
    /// Every counter, in map-index order.
    pub const ALL: [KernelCounter; 8] = [
        KernelCounter::Samples,
        KernelCounter::UserStackCollision,
        KernelCounter::KernelStackCollision,
        KernelCounter::StackError,
        KernelCounter::CountsFull,
        KernelCounter::Subsampled,
        KernelCounter::NewProcess,
        KernelCounter::NewProcessLost,
    ];

    /// Index of the counter in the `counters` map.
    pub fn index(self) -> u32 {
        match self {
            KernelCounter::Samples => 0,
            KernelCounter::UserStackCollision => 1,
            KernelCounter::KernelStackCollision => 2,
            KernelCounter::StackError => 3,
            KernelCounter::CountsFull => 4,
            KernelCounter::Subsampled => 5,
            KernelCounter::NewProcess => 6,
            KernelCounter::NewProcessLost => 7,
        }
    }
}

/// `enum kiln_filter`: which processes the program samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum FilterMode {
    /// Every process on the host.
    All = 0,
    /// Processes whose cgroup id is in `allowed_cgroups`.
    Cgroups = 1,
    /// Processes whose tgid is in `allowed_pids`.
    Pids = 2,
}

/// `struct kiln_config`, the single entry of the `config` map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Config {
    /// Generation (0 or 1) samples are written to.
    pub generation: u32,
    /// A [`FilterMode`] as `u32`.
    pub filter: u32,
    /// Non-zero to record thread ids.
    pub record_tid: u32,
    /// Padding, zero.
    pub reserved: u32,
}

/// `struct kiln_target`, the value of `allowed_cgroups` and `allowed_pids`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct TargetValue {
    /// Keep one sample in this many.
    pub keep_one_in: u32,
    /// Padding, zero.
    pub reserved: u32,
}

/// `struct kiln_count_key`: one aggregated stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C)]
pub struct CountKey {
    /// Process id (tgid) in the root PID namespace.
    pub pid: u32,
    /// Thread id, or 0 when thread ids are not recorded.
    pub tid: u32,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Start of the process (group leader's `start_boottime`), ns.
    pub start_boottime_ns: u64,
    /// Stack id of the user stack, negative errno when missing.
    pub user_stack_id: i32,
    /// Stack id of the kernel stack, negative errno when missing.
    pub kernel_stack_id: i32,
}

/// `struct kiln_count_value`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct CountValue {
    /// Number of samples.
    pub samples: u64,
    /// NUL-padded comm of the thread that created the entry.
    pub comm: [u8; 16],
}

/// `struct kiln_new_process`: the first sample of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct NewProcess {
    /// Process id.
    pub pid: u32,
    /// Padding, zero.
    pub reserved: u32,
    /// Start of the process, ns since boot.
    pub start_boottime_ns: u64,
}

impl NewProcess {
    /// Reads an event from ring-buffer bytes; `None` when too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<NewProcess> {
        let pid = u32::from_ne_bytes(bytes.get(0..4)?.try_into().ok()?);
        let start_boottime_ns = u64::from_ne_bytes(bytes.get(8..16)?.try_into().ok()?);
        Some(NewProcess {
            pid,
            reserved: 0,
            start_boottime_ns,
        })
    }
}

const _: () = assert!(size_of::<Config>() == 16);
const _: () = assert!(size_of::<TargetValue>() == 8);
const _: () = assert!(size_of::<CountKey>() == 32);
const _: () = assert!(align_of::<CountKey>() == 8);
const _: () = assert!(size_of::<CountValue>() == 24);
const _: () = assert!(size_of::<NewProcess>() == 16);

// SAFETY: each type is #[repr(C)], Copy, made only of integers, and has no
// padding (the sizes asserted above equal the sums of the field sizes), so
// every bit pattern is a valid value and the kernel may write any bytes.
unsafe impl aya::Pod for Config {}
// SAFETY: as above.
unsafe impl aya::Pod for TargetValue {}
// SAFETY: as above.
unsafe impl aya::Pod for CountKey {}
// SAFETY: as above.
unsafe impl aya::Pod for CountValue {}

/// The comm bytes up to the first NUL, lossily decoded.
pub fn comm_to_string(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_process_parses_native_endian_bytes_and_rejects_short_input() {
        let mut bytes = [0u8; 16];
        bytes[0..4].copy_from_slice(&42u32.to_ne_bytes());
        bytes[8..16].copy_from_slice(&7_000u64.to_ne_bytes());
        let event = NewProcess::from_bytes(&bytes).expect("16 bytes suffice");
        assert_eq!((event.pid, event.start_boottime_ns), (42, 7_000));
        assert_eq!(NewProcess::from_bytes(&bytes[..12]), None);
    }

    #[test]
    fn comm_stops_at_the_first_nul() {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"busy");
        assert_eq!(comm_to_string(&comm), "busy");
        assert_eq!(comm_to_string(&[b'x'; 16]), "x".repeat(16));
    }

    #[test]
    fn counter_indices_are_dense_and_ordered() {
        for (i, counter) in KernelCounter::ALL.iter().enumerate() {
            assert_eq!(counter.index() as usize, i);
        }
    }
}
