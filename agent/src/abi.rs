//! The Rust mirror of `bpf/kiln.h`, the kernel <-> user ABI of the sampler.
//!
//! Every struct is `#[repr(C)]` with the same field order and widths as its C
//! twin, and its size is asserted at compile time so a change on one side
//! without the other fails the build.

/// Deepest stack the kernel records (`KILN_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;

/// Bytes of user stack copied per snapshot (`KILN_STACK_SNAPSHOT_BYTES`).
pub const STACK_SNAPSHOT_BYTES: usize = 16384;

/// Most CPython frames recorded per sample (`KILN_PY_MAX_FRAMES`).
pub const PY_MAX_FRAMES: usize = 64;

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
    /// Stack snapshots lost because the `samples` ring buffer was full.
    SnapshotLost,
    /// Python stacks cut at [`PY_MAX_FRAMES`] frames.
    PyTruncated,
    /// Targeted threads that blocked, chosen by the one-in-N draw
    /// (off-CPU on): times N, the targeted block rate.
    OffCpuBlocks,
    /// Blocks captured, their stacks held until the wakeup.
    OffCpuCaptured,
    /// Blocks the per-CPU capture budget had no room for.
    OffCpuBudgetSpent,
    /// Captured blocks shorter than the minimum, dropped in the kernel.
    OffCpuShort,
    /// Ended blocks lost because the `samples` ring buffer was full.
    OffCpuLost,
}

impl KernelCounter {
    /// Every counter, in map-index order.
    pub const ALL: [KernelCounter; 15] = [
        KernelCounter::Samples,
        KernelCounter::UserStackCollision,
        KernelCounter::KernelStackCollision,
        KernelCounter::StackError,
        KernelCounter::CountsFull,
        KernelCounter::Subsampled,
        KernelCounter::NewProcess,
        KernelCounter::NewProcessLost,
        KernelCounter::SnapshotLost,
        KernelCounter::PyTruncated,
        KernelCounter::OffCpuBlocks,
        KernelCounter::OffCpuCaptured,
        KernelCounter::OffCpuBudgetSpent,
        KernelCounter::OffCpuShort,
        KernelCounter::OffCpuLost,
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
            KernelCounter::SnapshotLost => 8,
            KernelCounter::PyTruncated => 9,
            KernelCounter::OffCpuBlocks => 10,
            KernelCounter::OffCpuCaptured => 11,
            KernelCounter::OffCpuBudgetSpent => 12,
            KernelCounter::OffCpuShort => 13,
            KernelCounter::OffCpuLost => 14,
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

/// `enum kiln_unwind`: how user stacks are walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum UnwindMode {
    /// Frame pointers, in the kernel, aggregated in the count maps.
    FramePointer = 0,
    /// Registers and stack copied to userspace, unwound there with `.eh_frame`.
    StackSnapshot = 1,
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
    /// An [`UnwindMode`] as `u32`.
    pub unwind: u32,
    /// Off-CPU: one targeted block in this many is captured; 0 is off.
    pub off_cpu_keep_one_in: u32,
    /// Off-CPU: most blocks captured per CPU per second (bursts of half
    /// a second's worth pass).
    pub off_cpu_captures_per_second: u32,
    /// Off-CPU: blocks shorter than this (ns) are dropped in the kernel.
    pub off_cpu_min_ns: u64,
}

/// `enum kiln_sample_kind`: what a stack snapshot stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SampleKind {
    /// A cpu-clock sample of a running thread.
    Cpu,
    /// A thread that blocked, sent at its wakeup.
    OffCpu,
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

/// `struct kiln_python_process`, the value of `python_processes`: where a
/// CPython process keeps its state and the offsets of its version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PythonProcess {
    /// Address of `_PyRuntime`.
    pub runtime: u64,
    /// `_PyRuntimeState.interpreters.main`.
    pub runtime_interpreters_main: u16,
    /// `PyInterpreterState.tstate_head` / `threads.head`.
    pub interp_threads_head: u16,
    /// `PyThreadState.next`.
    pub tstate_next: u16,
    /// `PyThreadState.thread_id` (pthread_self).
    pub tstate_thread_id: u16,
    /// `PyThreadState.frame` / `cframe` / `current_frame`.
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame`, or [`PY_NO_CFRAME`].
    pub cframe_current_frame: u16,
    /// `f_back` / `previous`.
    pub frame_previous: u16,
    /// `f_code` / `f_executable`.
    pub frame_code: u16,
    /// `f_lasti` / `prev_instr` / `instr_ptr`.
    pub frame_position: u16,
    /// `is_entry` / `owner`.
    pub frame_entry: u16,
    /// `enum kiln_py_position`.
    pub position_kind: u8,
    /// `enum kiln_py_entry`.
    pub entry_kind: u8,
    /// `FRAME_OWNED_BY_CSTACK`.
    pub owned_by_cstack: u8,
    /// Low bits cleared from the code pointer: 3.14 tags `f_executable`
    /// (a `_PyStackRef`) in them.
    pub code_tag_mask: u8,
}

/// `struct kiln_ruby_process`, the value of `ruby_processes`: how to find a
/// Ruby thread's execution context and the offsets of its Ruby version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RubyProcess {
    /// libruby's TLS module id (its DTV index).
    pub tls_module: u64,
    /// Offset of `ruby_current_ec` in libruby's TLS block.
    pub tls_offset: u64,
    /// Offset of the DTV pointer from the thread pointer.
    pub tcb_dtv: u16,
    /// Bytes per DTV entry.
    pub dtv_entry_size: u16,
    /// `rb_execution_context_t.vm_stack`.
    pub ec_vm_stack: u16,
    /// `rb_execution_context_t.vm_stack_size` (in VALUEs).
    pub ec_vm_stack_size: u16,
    /// `rb_execution_context_t.cfp`.
    pub ec_cfp: u16,
    /// `sizeof(rb_control_frame_t)`.
    pub cfp_size: u16,
    /// `rb_control_frame_t.pc`.
    pub cfp_pc: u16,
    /// `rb_control_frame_t.iseq`.
    pub cfp_iseq: u16,
    /// `rb_control_frame_t.ep`.
    pub cfp_ep: u16,
    /// Bytes back from `ep` to the method entry slot.
    pub ep_method_entry: u16,
    /// `VM_FRAME_FLAG_FINISH`.
    pub frame_flag_finish: u32,
    /// `VM_FRAME_FLAG_CFRAME`.
    pub frame_flag_cframe: u32,
    /// Padding, zero.
    pub reserved: u32,
}

/// `KILN_RB_FRAME_CFUNC`: a Ruby C frame; `code` is its method entry.
pub const RB_FRAME_CFUNC: u32 = 4;

/// `KILN_PY_NO_CFRAME`: the thread state points at the frame itself.
pub const PY_NO_CFRAME: u16 = 0xffff;

/// `enum kiln_py_position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PyPositionKind {
    /// An int instruction index (3.9-3.10).
    Index = 0,
    /// A pointer into the bytecode (3.11+).
    Pointer = 1,
}

/// `enum kiln_py_entry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PyEntryKind {
    /// One eval-loop call per frame (3.9-3.10).
    EveryFrame = 0,
    /// `is_entry` (3.11).
    Flag = 1,
    /// Shim frames owned by the C stack (3.12+).
    Shim = 2,
}

/// `KILN_PY_FRAME_ENTRY`: the root-most frame of one eval-loop call.
pub const PY_FRAME_ENTRY: u32 = 1;

/// `KILN_PY_FRAME_SHIM`: a shim frame between eval-loop calls (3.12+), a
/// boundary rather than a frame.
pub const PY_FRAME_SHIM: u32 = 2;

/// `enum kiln_py_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyStatus {
    /// Not a registered Python process.
    None,
    /// Every frame of the thread was read.
    Complete,
    /// The thread has no Python thread state.
    NoThread,
    /// Cut at [`PY_MAX_FRAMES`].
    Truncated,
}

impl PyStatus {
    fn from_raw(raw: u32) -> PyStatus {
        match raw {
            1 => PyStatus::Complete,
            2 => PyStatus::NoThread,
            3 => PyStatus::Truncated,
            _ => PyStatus::None,
        }
    }
}

/// `struct kiln_py_frame`: one CPython frame as read at sample time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// The code object's address.
    pub code: u64,
    /// Instruction index or bytecode pointer, by the version's position kind.
    pub position: u64,
    /// `KILN_PY_FRAME_*` bits.
    pub flags: u32,
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

/// Byte offsets in `struct kiln_stack_snapshot` (checked against the C
/// layout by the size assertion below and the BPF object's own BTF in tests).
mod snapshot_layout {
    pub const PID: usize = 0;
    pub const TID: usize = 4;
    pub const CGROUP_ID: usize = 8;
    pub const START: usize = 16;
    pub const IP: usize = 24;
    pub const SP: usize = 32;
    pub const BP: usize = 40;
    pub const KERNEL_DEPTH: usize = 48;
    pub const STACK_LEN: usize = 52;
    pub const COMM: usize = 56;
    pub const KIND: usize = 72;
    pub const OFF_CPU_KEEP_ONE_IN: usize = 76;
    pub const OFF_CPU_NS: usize = 88;
    pub const KERNEL_IPS: usize = 96;
    pub const PY_DEPTH: usize = KERNEL_IPS + super::MAX_STACK_DEPTH * 8;
    pub const PY_STATUS: usize = PY_DEPTH + 4;
    pub const PY_FRAMES: usize = PY_STATUS + 4;
    pub const PY_FRAME_SIZE: usize = 24;
    pub const STACK: usize = PY_FRAMES + super::PY_MAX_FRAMES * PY_FRAME_SIZE;
    pub const SIZE: usize = STACK + super::STACK_SNAPSHOT_BYTES;
}

/// Size of `struct kiln_stack_snapshot`, the ring-buffer record.
pub const STACK_SNAPSHOT_SIZE: usize = snapshot_layout::SIZE;

/// A `struct kiln_stack_snapshot` read from the `samples` ring buffer; the
/// stack bytes are borrowed from the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSnapshot<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id (0 unless recorded).
    pub tid: u32,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Process start, ns since boot.
    pub start_boottime_ns: u64,
    /// User instruction pointer; 0 when the thread had no user context.
    pub ip: u64,
    /// User stack pointer.
    pub sp: u64,
    /// User frame pointer (rbp).
    pub bp: u64,
    /// comm of the sampled thread.
    pub comm: [u8; 16],
    /// A CPU sample or an off-CPU block.
    pub kind: SampleKind,
    /// Off-CPU time this record stands for, ns: the block's length times
    /// the one-in-N it was chosen by (0 for CPU samples).
    pub off_cpu_ns: u64,
    /// Kernel stack, leaf first.
    pub kernel: Vec<u64>,
    /// Whether and how CPython frames were read.
    pub py_status: PyStatus,
    /// CPython frames, leaf first.
    pub py_frames: Vec<PyFrame>,
    /// User stack memory starting at `sp`.
    pub stack: &'a [u8],
}

impl<'a> StackSnapshot<'a> {
    /// Reads a record; `None` when it is shorter than the C struct or its
    /// lengths are out of range (never trusted blindly, even from the kernel).
    pub fn from_bytes(bytes: &'a [u8]) -> Option<StackSnapshot<'a>> {
        use snapshot_layout as at;
        if bytes.len() < at::SIZE {
            return None;
        }
        let u32_at = |offset: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(
                bytes.get(offset..offset + 4)?.try_into().ok()?,
            ))
        };
        let u64_at = |offset: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(
                bytes.get(offset..offset + 8)?.try_into().ok()?,
            ))
        };
        let kernel_depth = usize::try_from(u32_at(at::KERNEL_DEPTH)?)
            .ok()?
            .min(MAX_STACK_DEPTH);
        let stack_len = usize::try_from(u32_at(at::STACK_LEN)?)
            .ok()?
            .min(STACK_SNAPSHOT_BYTES);
        let kernel = (0..kernel_depth)
            .map(|i| u64_at(at::KERNEL_IPS + i * 8))
            .collect::<Option<Vec<u64>>>()?;
        let py_depth = usize::try_from(u32_at(at::PY_DEPTH)?)
            .ok()?
            .min(PY_MAX_FRAMES);
        let py_frames = (0..py_depth)
            .map(|i| {
                let at = at::PY_FRAMES + i * at::PY_FRAME_SIZE;
                Some(PyFrame {
                    code: u64_at(at)?,
                    position: u64_at(at + 8)?,
                    flags: u32_at(at + 16)?,
                })
            })
            .collect::<Option<Vec<PyFrame>>>()?;
        // Any kind but off-CPU reads as a CPU sample: the older meaning.
        let (kind, off_cpu_ns) = match u32_at(at::KIND)? {
            1 => (
                SampleKind::OffCpu,
                u64_at(at::OFF_CPU_NS)?
                    .saturating_mul(u64::from(u32_at(at::OFF_CPU_KEEP_ONE_IN)?.max(1))),
            ),
            _ => (SampleKind::Cpu, 0),
        };
        Some(StackSnapshot {
            pid: u32_at(at::PID)?,
            tid: u32_at(at::TID)?,
            cgroup_id: u64_at(at::CGROUP_ID)?,
            start_boottime_ns: u64_at(at::START)?,
            ip: u64_at(at::IP)?,
            sp: u64_at(at::SP)?,
            bp: u64_at(at::BP)?,
            comm: bytes.get(at::COMM..at::COMM + 16)?.try_into().ok()?,
            kind,
            off_cpu_ns,
            kernel,
            py_status: PyStatus::from_raw(u32_at(at::PY_STATUS)?),
            py_frames,
            stack: bytes.get(at::STACK..at::STACK + stack_len)?,
        })
    }
}

const _: () = assert!(STACK_SNAPSHOT_SIZE == 19_040);
const _: () = assert!(size_of::<PythonProcess>() == 32);
const _: () = assert!(size_of::<RubyProcess>() == 48);
const _: () = assert!(size_of::<Config>() == 32);
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
unsafe impl aya::Pod for PythonProcess {}
// SAFETY: as above.
unsafe impl aya::Pod for RubyProcess {}
// SAFETY: as above.
unsafe impl aya::Pod for CountValue {}

/// The comm bytes up to the first NUL, lossily decoded.
pub fn comm_to_string(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests;
