//! The collector thread: polls the target source and new-process events,
//! drains a window every interval, symbolizes it and queues one pprof per
//! target. It owns everything that is not `Send` (blazesym) or blocks
//! (BPF map syscalls, `/proc` reads), so async code never waits on it.
//!
//! It takes its samples through [`SampleSource`]: the aya [`Sampler`] in the
//! agent, samples recorded from a real process in `tests/collector_recorded.rs`,
//! which runs this whole path without root.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::abi::{KernelCounter, SampleKind};
use crate::aggregate::{self, GroupKey, StackSample, UnwoundWindow};
use crate::hotspot::{HotspotConfig, HotspotUnwinder};
use crate::metrics::AgentMetrics;
use crate::process_info::{ProcessSnapshot, ProcessTable};
use crate::python::PythonUnwinder;
use crate::sample_source::{SampleSource, SamplerError};
use crate::sampler::Sampler;
use crate::ship::ShipQueue;
use crate::symbolize::{StackSymbolizer, SymbolizationStats};
use crate::target_set::{SamplingRates, TargetSet, TargetSource};
use crate::unwind::StackUnwinder;

mod group_profile;
mod off_cpu_rate;
mod runtime_frames;

use off_cpu_rate::OffCpuRate;
pub use off_cpu_rate::off_cpu_keep_one_in;
pub use runtime_frames::RuntimeReaders;

/// Collector settings.
#[derive(Debug, Clone)]
pub struct CollectorConfig {
    /// The default and highest sampling rates (the sampler's own).
    pub rates: SamplingRates,
    /// Time between drains.
    pub drain_interval: Duration,
    /// How often the target source is asked for targets.
    pub target_refresh_interval: Duration,
    /// Node name label.
    pub node: String,
    /// Whether samples carry `tid`.
    pub record_tid: bool,
    /// Distinct stacks kept per window when unwinding snapshots.
    pub unwound_stacks_capacity: usize,
    /// Which runtimes' own frames are read when unwinding snapshots
    /// (CPython's is the `python` part).
    pub runtimes: RuntimeReaders,
    /// Off-CPU on: the most blocks the kernel captures per CPU per second,
    /// which the one-in-N of captured blocks is kept under.
    pub off_cpu_captures_per_cpu_second: Option<u32>,
}

/// How often new-process events are read; short, so a process that lives
/// for a moment is still read from `/proc` while it exists.
const EVENT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// New processes read from `/proc` per poll (2,560 a second): a fork storm
/// costs the collector a bounded share of each poll.
const NEW_PROCESS_READS_PER_POLL: usize = 256;

/// Everything the collector owns besides its settings.
#[derive(Debug)]
pub struct CollectorParts<S: TargetSource, K: SampleSource = Sampler> {
    /// The started sampler (or recorded samples, in tests).
    pub sampler: K,
    /// Where targets come from.
    pub source: S,
    /// The targets the sampler's allow-lists hold now.
    pub targets: TargetSet,
    /// Process snapshots.
    pub processes: ProcessTable,
    /// The symbolizer (created on the collector thread: it is not `Send`).
    pub symbolizer: StackSymbolizer,
    /// Where built profiles go.
    pub queue: ShipQueue,
    /// Shared metrics.
    pub metrics: Arc<AgentMetrics>,
    /// The `.eh_frame` unwinder, when the sampler sends stack snapshots.
    pub unwinder: Option<StackUnwinder>,
    /// CPython frames (with stack snapshots only).
    pub python: Option<PythonUnwinder>,
}

/// The collector; see the module docs.
#[derive(Debug)]
pub struct Collector<S: TargetSource, K: SampleSource = Sampler> {
    config: CollectorConfig,
    sampler: K,
    source: S,
    targets: TargetSet,
    processes: ProcessTable,
    symbolizer: StackSymbolizer,
    queue: ShipQueue,
    metrics: Arc<AgentMetrics>,
    unwinder: Option<StackUnwinder>,
    python: Option<PythonUnwinder>,
    /// Ruby frames: on with Python's (interpreter frames, one switch).
    ruby: Option<crate::ruby::RubyUnwinder>,
    /// HotSpot JVMs' frames (with stack snapshots only).
    hotspot: Option<HotspotUnwinder>,
    /// V8 processes' JavaScript frames (with stack snapshots only).
    v8: Option<crate::v8::V8Unwinder>,
    /// Stacks unwound this window.
    unwound: UnwoundWindow,
    /// Processes re-read this window because a sample hit an unknown mapping.
    reloaded: HashSet<(u32, u64)>,
    window_start: SystemTime,
    /// Off-CPU: the chosen-block total last seen, to set the one-in-N from.
    off_cpu_rate: Option<OffCpuRate>,
    /// Off-CPU: targeted blocks so far, estimated (chosen ones times N).
    off_cpu_blocks: u64,
}

impl<S: TargetSource, K: SampleSource> Collector<S, K> {
    /// A collector over a started sampler whose allow-lists hold `targets`.
    pub fn new(config: CollectorConfig, parts: CollectorParts<S, K>) -> Self {
        let CollectorParts {
            sampler,
            source,
            targets,
            processes,
            symbolizer,
            queue,
            metrics,
            unwinder,
            python,
        } = parts;
        let readers = config.runtimes;
        // The kernel starts at one in one.
        let off_cpu_rate = config.off_cpu_captures_per_cpu_second.map(|_| OffCpuRate {
            chosen: 0,
            keep_one_in: 1,
            at: Instant::now(),
        });
        Collector {
            v8: unwinder
                .as_ref()
                .filter(|_| readers.javascript)
                .map(|_| crate::v8::V8Unwinder::new(Default::default())),
            hotspot: unwinder
                .as_ref()
                .filter(|_| readers.java)
                .map(|_| HotspotUnwinder::new(HotspotConfig::default())),
            ruby: unwinder
                .as_ref()
                .filter(|_| readers.ruby)
                .map(|_| crate::ruby::RubyUnwinder::new(Default::default())),
            unwinder,
            python,
            unwound: UnwoundWindow::new(config.unwound_stacks_capacity),
            reloaded: HashSet::new(),
            config,
            sampler,
            source,
            targets,
            processes,
            symbolizer,
            queue,
            metrics,
            window_start: SystemTime::now(),
            off_cpu_rate,
            off_cpu_blocks: 0,
        }
    }

    /// Runs until `shutdown` is set, then drains a last window and returns.
    pub fn run(mut self, shutdown: &AtomicBool) {
        self.metrics
            .cpus_attached
            .set(self.sampler.attached_cpu_count() as u64);
        let mut next_drain = Instant::now() + self.config.drain_interval;
        let mut next_refresh = Instant::now() + self.config.target_refresh_interval;
        loop {
            self.metrics
                .collector_progress_unix_ms
                .set(crate::metrics::unix_ms());
            let stopping = shutdown.load(Ordering::Relaxed);
            self.read_new_processes();
            self.unwind_snapshots();
            if let Err(error) = self.look_at_off_cpu_rate() {
                tracing::warn!(%error, "setting the off-CPU one-in-N failed");
            }
            let now = Instant::now();
            if now >= next_refresh {
                next_refresh = now + self.config.target_refresh_interval;
                self.refresh_targets();
                // Kernel counters and BPF run time are cumulative; refresh
                // them between drains too, so /metrics is current.
                if let Err(error) = self.update_kernel_metrics() {
                    tracing::warn!(%error, "reading kernel counters failed");
                }
            }
            if stopping || now >= next_drain {
                next_drain = now + self.config.drain_interval;
                if let Err(error) = self.drain_window() {
                    tracing::error!(%error, "draining a window failed");
                    self.metrics.add_drop(error.reason(), 1);
                }
                self.reattach_cpus();
            }
            if stopping {
                return;
            }
            std::thread::sleep(EVENT_POLL_INTERVAL);
        }
    }

    fn read_new_processes(&mut self) {
        let events = self.sampler.take_new_processes();
        // A fork storm must not keep the collector in /proc: beyond the cap,
        // processes are read at drain time if they still live.
        let skipped = events.len().saturating_sub(NEW_PROCESS_READS_PER_POLL);
        self.metrics
            .add_drop("new_process_reads_skipped", skipped as u64);
        for event in events.into_iter().take(NEW_PROCESS_READS_PER_POLL) {
            match self.processes.refresh(event.pid, event.start_boottime_ns) {
                Ok(snapshot) => {
                    self.register_python(&snapshot);
                    crate::ruby::register(&mut self.ruby, &snapshot, &mut self.sampler);
                }
                Err(error) => {
                    tracing::debug!(pid = event.pid, %error, "new process not readable");
                }
            }
        }
    }

    /// Gives the BPF program the interpreter state of a new CPython process
    /// (or takes away that of a previous process with the same pid).
    fn register_python(&mut self, process: &ProcessSnapshot) {
        if let Some(v8) = self.v8.as_mut() {
            v8.register(process);
        }
        let Some(python) = self.python.as_mut() else {
            return;
        };
        let was_registered = python.is_registered(process.pid);
        let result = match python.register(process) {
            Some(entry) => self.sampler.set_python_process(process.pid, &entry),
            None if was_registered => self.sampler.remove_python_process(process.pid),
            None => Ok(()),
        };
        if let Err(error) = result {
            tracing::warn!(pid = process.pid, %error, "updating the Python process map failed");
        }
    }

    /// Ends the window for the Python unwinder: publishes its counts, drops
    /// the window's frame names and forgets processes that exited.
    fn end_python_window(&mut self) {
        let Some(python) = self.python.as_mut() else {
            return;
        };
        self.metrics.set_python_totals(python.stats());
        self.metrics
            .python_code_cache_bytes
            .set(python.cached_bytes());
        python.end_window();
        let processes = &self.processes;
        for pid in python.retain_alive(|pid, start| processes.is_alive(pid, start)) {
            if let Err(error) = self.sampler.remove_python_process(pid) {
                tracing::warn!(pid, %error, "removing an exited Python process failed");
            }
        }
    }

    /// Unwinds every waiting stack snapshot while its process still lives,
    /// and counts it in this window.
    fn unwind_snapshots(&mut self) {
        let Some(unwinder) = self.unwinder.as_mut() else {
            return;
        };
        let processes = &mut self.processes;
        let unwound = &mut self.unwound;
        let reloaded = &mut self.reloaded;
        let python = &mut self.python;
        let v8 = &mut self.v8;
        let hotspot = &mut self.hotspot;
        let ruby = &mut self.ruby;
        let batch = self.sampler.take_snapshots(&mut |snapshot| {
            let key = (snapshot.pid, snapshot.start_boottime_ns);
            let stale = !unwinder.knows_process(key.0, key.1)
                || (snapshot.ip != 0 && !unwinder.covers_mapping(key.0, key.1, snapshot.ip));
            // Read a process once per window, and once more if a sample
            // lands in a mapping added since (dlopen, JIT code).
            if stale
                && reloaded.insert(key)
                && let Some(process) = processes.snapshot(key.0, key.1)
            {
                unwinder.load_process(&process);
                // A process that became node by exec after its first
                // sample is found when its new mappings are read.
                if let Some(v8) = v8.as_mut() {
                    v8.register(&process);
                }
                if let Some(hotspot) = hotspot.as_mut() {
                    hotspot.observe(&process);
                }
            }
            // A JVM still starting when it was read is read again.
            if let Some(hotspot) = hotspot.as_mut()
                && hotspot.retry_due(key.0, key.1)
                && let Some(process) = processes.snapshot(key.0, key.1)
            {
                hotspot.observe(&process);
            }
            let stack = match hotspot.as_mut() {
                Some(hotspot) => hotspot.unwind(unwinder, &snapshot),
                None => unwinder.unwind(&snapshot),
            };
            let stack_frames = match v8.as_mut() {
                Some(v8) => v8.merge(&snapshot, &stack),
                None => stack.frames,
            };
            let frames = match python.as_mut() {
                Some(python) => python.merge(&snapshot, stack_frames),
                None => stack_frames,
            };
            let frames = match ruby.as_mut() {
                Some(ruby) => ruby.merge(&snapshot, frames),
                None => frames,
            };
            unwound.add(&snapshot, frames);
        });
        self.metrics.add_drop("malformed_snapshot", batch.malformed);
    }

    fn refresh_targets(&mut self) {
        match self.source.current_targets() {
            Ok(targets) => {
                if targets != self.targets {
                    if let Err(error) = self.sampler.sync_targets(&targets, &self.targets) {
                        tracing::error!(%error, "updating the BPF allow-lists failed");
                        return;
                    }
                    self.targets = targets;
                }
                self.metrics.targets.set(target_count(&self.targets));
            }
            Err(error) => {
                tracing::warn!(%error, "target source failed; keeping the previous targets");
                self.metrics.add_drop(error.reason(), 0);
            }
        }
    }

    fn reattach_cpus(&mut self) {
        match self.sampler.attach_new_cpus() {
            Ok(failures) => {
                self.metrics
                    .cpus_attached
                    .set(self.sampler.attached_cpu_count() as u64);
                self.metrics.cpus_failed.set(failures.len() as u64);
            }
            Err(error) => tracing::warn!(%error, "checking online CPUs failed"),
        }
    }

    fn drain_window(&mut self) -> Result<(), SamplerError> {
        let window = self.sampler.drain()?;
        let end = SystemTime::now();
        let start = std::mem::replace(&mut self.window_start, end);
        self.metrics.windows.inc();
        self.update_kernel_metrics()?;

        let mode = self.targets.filter_mode();
        let (mut groups, losses) = aggregate::group_window(window, mode);
        self.unwind_snapshots();
        let (unwound, unwound_dropped) = self.unwound.take();
        self.metrics
            .add_drop("unwound_window_full", unwound_dropped);
        // Off-CPU blocks make a profile of their own per target and window.
        let mut off_cpu_groups: BTreeMap<GroupKey, Vec<StackSample>> = BTreeMap::new();
        for sample in unwound {
            let into = match sample.kind {
                SampleKind::Cpu => &mut groups,
                SampleKind::OffCpu => &mut off_cpu_groups,
            };
            into.entry(aggregate::group_of(&sample, mode))
                .or_default()
                .push(sample);
        }
        if let Some(unwinder) = self.unwinder.as_mut() {
            let stats = unwinder.stats();
            self.metrics
                .set_unwind_totals(&stats.outcomes, &stats.objects);
            self.metrics.unwind_cache_bytes.set(unwinder.cached_bytes());
            unwinder.end_window();
        }
        self.reloaded.clear();
        self.metrics
            .add_drop("truncated_stack", losses.truncated_stacks);
        self.metrics
            .add_drop("missing_stack", losses.missing_stacks);

        let start_unix_ns = unix_ns(start);
        let duration_ns = i64::try_from(end.duration_since(start).unwrap_or_default().as_nanos())
            .unwrap_or(i64::MAX);
        // First pass: read each process once and queue every user address, so
        // the symbolizer reads each ELF file once for the whole window.
        let mut snapshots: Snapshots = HashMap::new();
        for sample in groups.values().chain(off_cpu_groups.values()).flatten() {
            let key = (sample.pid, sample.start_boottime_ns);
            let snapshot = snapshots
                .entry(key)
                .or_insert_with(|| self.processes.snapshot(key.0, key.1));
            if let Some(snapshot) = snapshot {
                let native = crate::v8::frames::native_entries(&sample.user);
                self.symbolizer
                    .queue_user_lookups(snapshot, &[native.as_slice()]);
            }
        }
        self.symbolizer.run_queued_lookups();
        let mut stats = SymbolizationStats::default();
        let kinds = groups
            .into_iter()
            .map(|group| (SampleKind::Cpu, group))
            .chain(
                off_cpu_groups
                    .into_iter()
                    .map(|group| (SampleKind::OffCpu, group)),
            );
        for (kind, (group, samples)) in kinds {
            let item = self.build_group(
                (kind, group),
                &samples,
                &snapshots,
                start_unix_ns,
                duration_ns,
                &mut stats,
            );
            self.metrics.profiles_built.inc();
            self.queue.push(item);
        }
        self.end_python_window();
        crate::v8::end_window(&mut self.v8, &self.processes, &self.metrics);
        if let Some(hotspot) = self.hotspot.as_mut() {
            self.metrics.set_hotspot_totals(hotspot.stats());
            hotspot.end_window();
            let processes = &self.processes;
            hotspot.retain_alive(|pid, start| processes.is_alive(pid, start));
        }
        crate::ruby::end_window(
            &mut self.ruby,
            &self.processes,
            &mut self.sampler,
            &self.metrics,
        );
        self.metrics.frames_symbolized.add(stats.symbolized);
        self.metrics.frames_unsymbolized.add(stats.unsymbolized);
        self.metrics
            .cached_processes
            .set(self.processes.cached_processes() as u64);
        self.metrics.queue_length.set(self.queue.len() as u64);
        // Symbol indexes not looked up for a few windows are dropped, so RSS
        // does not grow with every binary ever seen.
        self.processes.take_file_evictions();
        self.metrics.add_drop(
            "open_file_budget_spent",
            self.processes.take_refused_files(),
        );
        self.symbolizer.reset_file_state();
        let (loaded, evicted, held) = self.symbolizer.object_totals();
        self.metrics.symbol_objects_loaded.set(loaded);
        self.metrics.symbol_objects_evicted.set(evicted);
        self.metrics.symbol_object_bytes.set(held);
        release_freed_memory();
        self.metrics.add_drop(
            "symbol_tables_over_cap",
            self.symbolizer.take_refused_objects(),
        );
        Ok(())
    }

    fn update_kernel_metrics(&mut self) -> Result<(), SamplerError> {
        for (counter, total) in self.sampler.kernel_counters()? {
            match counter {
                KernelCounter::Samples => self.metrics.samples.set(total),
                KernelCounter::Subsampled => self.metrics.subsampled.set(total),
                KernelCounter::NewProcess => {}
                KernelCounter::UserStackCollision => {
                    self.metrics.set_drop_total("user_stack_collision", total)
                }
                KernelCounter::KernelStackCollision => {
                    self.metrics.set_drop_total("kernel_stack_collision", total)
                }
                KernelCounter::StackError => self.metrics.set_drop_total("stack_error", total),
                KernelCounter::CountsFull => self.metrics.set_drop_total("count_map_full", total),
                KernelCounter::NewProcessLost => {
                    self.metrics.set_drop_total("new_process_event_lost", total)
                }
                KernelCounter::SnapshotLost => {
                    self.metrics.set_drop_total("stack_snapshot_lost", total)
                }
                KernelCounter::PyTruncated => self
                    .metrics
                    .set_drop_total("python_frames_truncated", total),
                // Estimated from the chosen blocks in look_at_off_cpu_rate.
                KernelCounter::OffCpuBlocks => {}
                KernelCounter::OffCpuCaptured => self.metrics.off_cpu_captured.set(total),
                KernelCounter::OffCpuBudgetSpent => {
                    self.metrics.set_drop_total("off_cpu_budget_spent", total)
                }
                KernelCounter::OffCpuShort => self.metrics.off_cpu_short.set(total),
                KernelCounter::OffCpuLost => self.metrics.set_drop_total("off_cpu_lost", total),
            }
        }
        if let Some((run_time, runs)) = self.sampler.program_stats() {
            self.metrics
                .bpf_run_time_ns
                .set(u64::try_from(run_time.as_nanos()).unwrap_or(u64::MAX));
            self.metrics.bpf_run_count.set(runs);
        }
        Ok(())
    }
}

/// Hands the heap pages freed in this window (its stacks, snapshots of
/// exited processes, symbolization buffers) back to the kernel, so RSS
/// follows what the agent holds rather than its busiest window.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Process snapshots of one window by (pid, start); `None` when never seen alive.
type Snapshots = HashMap<(u32, u64), Option<Arc<ProcessSnapshot>>>;

fn target_count(targets: &TargetSet) -> u64 {
    match targets {
        TargetSet::All => 0,
        TargetSet::Pids(pids) => pids.len() as u64,
        TargetSet::Cgroups(cgroups) => cgroups.len() as u64,
    }
}

fn unix_ns(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
