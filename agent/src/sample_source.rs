//! The seam between the kernel side and the collector: everything the
//! collector asks of the sampler, as a trait. [`crate::sampler::Sampler`]
//! (aya, needs root) is the implementation the agent runs; tests feed the
//! same drain → unwind → symbolize → build path from samples recorded from
//! a real process, without privileges.

use std::time::Duration;

use crate::abi::{KernelCounter, NewProcess, PythonProcess, StackSnapshot};
use crate::aggregate::DrainedWindow;
use crate::sampler::{SamplerError, SnapshotBatch};
use crate::target_set::TargetSet;

/// Where the collector's samples come from, and the kernel state it keeps
/// in step with its own (allow-lists, CPython processes, attached CPUs).
pub trait SampleSource {
    /// Number of CPUs being sampled.
    fn attached_cpu_count(&self) -> usize;

    /// Starts sampling CPUs that came online (or failed) since the last
    /// call; returns the CPUs that failed this time.
    fn attach_new_cpus(&mut self) -> Result<Vec<(u32, String)>, SamplerError>;

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
}
