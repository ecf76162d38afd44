//! The seam between the kernel side and the collector: everything the
//! collector asks of the sampler, as a trait, with the error and the counts
//! it answers in. [`crate::sampler::Sampler`] (aya, needs root) is the
//! implementation the agent runs; tests feed the same drain → unwind →
//! symbolize → build path from samples recorded from a real process,
//! without privileges.

use std::path::PathBuf;
use std::time::Duration;

use crate::abi::{KernelCounter, NewProcess, PythonProcess, StackSnapshot};
use crate::aggregate::DrainedWindow;
use crate::target_set::TargetSet;

/// Where the collector's samples come from, and the kernel state it keeps
/// in step with its own (allow-lists, CPython processes, attached CPUs).
pub trait SampleSource {
    /// Number of CPUs being sampled.
    fn attached_cpu_count(&self) -> usize;

    /// Starts sampling CPUs that came online (or failed) since the last
    /// call; returns the CPUs that failed this time.
    fn attach_new_cpus(&mut self) -> Result<Vec<(u32, String)>, SamplerError>;

    /// The rate every CPU is sampled at now, Hz: the base each target's
    /// share of samples is kept from.
    fn base_hz(&self) -> u32;

    /// Applies the difference between `previous` and `targets` to what is sampled.
    fn sync_targets(
        &mut self,
        targets: &TargetSet,
        previous: &TargetSet,
    ) -> Result<(), SamplerError>;

    /// Starts reading `pid`'s CPython frames with each sample.
    fn set_python_process(&mut self, pid: u32, process: &PythonProcess)
    -> Result<(), SamplerError>;

    /// Stops reading `pid`'s CPython frames (it exited, or the pid was reused).
    fn remove_python_process(&mut self, pid: u32) -> Result<(), SamplerError>;

    /// Starts reading `pid`'s Ruby frames with each sample; sources that
    /// carry no Ruby frames ignore it.
    fn set_ruby_process(
        &mut self,
        _pid: u32,
        _process: &crate::abi::RubyProcess,
    ) -> Result<(), SamplerError> {
        Ok(())
    }

    /// Stops reading `pid`'s Ruby frames (it exited, or the pid was reused).
    fn remove_ruby_process(&mut self, _pid: u32) -> Result<(), SamplerError> {
        Ok(())
    }

    /// Processes sampled for the first time since the last call.
    fn take_new_processes(&mut self) -> Vec<NewProcess>;

    /// Hands every waiting stack snapshot to `each`, in order.
    fn take_snapshots(&mut self, each: &mut dyn FnMut(StackSnapshot<'_>)) -> SnapshotBatch;

    /// Ends the current window: the stacks counted in it (frame-pointer
    /// mode; empty when every sample came as a snapshot).
    fn drain(&mut self) -> Result<DrainedWindow, SamplerError>;

    /// Totals of the kernel's counters, in [`KernelCounter::ALL`] order.
    fn kernel_counters(&self) -> Result<Vec<(KernelCounter, u64)>, SamplerError>;

    /// Cumulative `(run time, runs)` of the sampling program, when known.
    fn program_stats(&self) -> Option<(Duration, u64)>;

    /// Off-CPU: captures one targeted block in `keep_one_in` from now on;
    /// sources without off-CPU ignore it.
    fn set_off_cpu_keep_one_in(&mut self, _keep_one_in: u32) -> Result<(), SamplerError> {
        Ok(())
    }
}

/// Why the kernel side failed.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The kernel BTF file could not be read or parsed.
    #[error(
        "cannot use kernel BTF at {path}: the agent needs a kernel built with CONFIG_DEBUG_INFO_BTF=y \
         (5.4+; /sys/kernel/btf/vmlinux) or a BTF file for this kernel passed with --btf-path"
    )]
    Btf {
        /// The BTF file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: aya::BtfError,
    },
    /// The BPF object could not be prepared or its maps created.
    #[error("cannot load the BPF object into the kernel")]
    Load {
        /// aya's error.
        #[source]
        source: aya::EbpfError,
    },
    /// The kernel refused the program.
    #[error(
        "the kernel refused the BPF sampler ({io_error}); it needs Linux 5.8+ with BTF, and CAP_BPF + \
         CAP_PERFMON (or CAP_SYS_ADMIN); the verifier log is printed with --log kiln_agent=debug"
    )]
    ProgramRejected {
        /// The syscall error.
        io_error: std::io::Error,
    },
    /// Another program operation failed.
    #[error("BPF program operation failed")]
    Program {
        /// aya's error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The object lacks a map or program it must have (a build problem).
    #[error("the BPF object has no {name}")]
    Missing {
        /// The map or program.
        name: &'static str,
    },
    /// A map operation failed.
    #[error("BPF map {name} operation failed")]
    Map {
        /// The map.
        name: &'static str,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
    /// No CPU could be attached.
    #[error("could not attach a cpu-clock perf event on any online CPU: {failures}")]
    NoCpuAttached {
        /// Per-CPU failures.
        failures: String,
    },
    /// The online CPU list could not be read.
    #[error("cannot read {path}")]
    OnlineCpus {
        /// The sysfs file.
        path: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl SamplerError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SamplerError::Btf { .. } => "btf",
            SamplerError::Load { .. } => "load",
            SamplerError::ProgramRejected { .. } => "program_rejected",
            SamplerError::Program { .. } => "program",
            SamplerError::Missing { .. } => "missing",
            SamplerError::Map { .. } => "map",
            SamplerError::NoCpuAttached { .. } => "no_cpu_attached",
            SamplerError::OnlineCpus { .. } => "online_cpus",
        }
    }
}

/// What one [`SampleSource::take_snapshots`] call read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotBatch {
    /// Records handed on.
    pub read: u64,
    /// Records too short to be a snapshot.
    pub malformed: u64,
}
