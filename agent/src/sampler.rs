//! The kernel side, through aya: load the BPF object, attach one cpu-clock
//! perf event per online CPU, keep the allow-lists in sync, flip generations
//! and drain them, and read the kernel's counters and program statistics.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf, StackTraceMap};
use aya::programs::perf_event::{
    PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::{BtfTracePoint, PerfEvent, ProgramError};
use aya::{Btf, Ebpf, EbpfLoader, Endianness};

use crate::abi::{
    Config, CountKey, CountValue, KernelCounter, NewProcess, StackSnapshot, TargetValue, UnwindMode,
};
use crate::aggregate::DrainedWindow;
use crate::sample_source::{SampleSource, SamplerError, SnapshotBatch};
use crate::target_set::{AllowListChanges, SamplingRates, TargetSet};

/// The compiled BPF object (built from `bpf/profile.bpf.c` by build.rs).
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profile.bpf.o"));

const PROGRAM_NAME: &str = "kiln_profile";

/// The off-CPU programs: a block starts at `sched_switch` and ends at
/// `sched_wakeup` (see bpf/profile.bpf.c for why not at the switch-in).
const OFF_CPU_PROGRAMS: [(&str, &str); 2] = [
    ("kiln_off_cpu_switch", "sched_switch"),
    ("kiln_off_cpu_wakeup", "sched_wakeup"),
];

/// How in-flight BPF runs that read the old generation get to finish before
/// it is read. A run takes microseconds; this is orders of magnitude more.
const GENERATION_FLIP_GRACE: Duration = Duration::from_millis(10);

/// How the kernel side is set up.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// The default and highest sampling rates; the perf events run at the
    /// highest rate any target asks for (see [`SamplingRates`]).
    pub rates: SamplingRates,
    /// Entries of each stack map (two generations).
    pub stack_map_entries: u32,
    /// Entries of each count map (two generations).
    pub count_map_entries: u32,
    /// Record thread ids in keys.
    pub record_tid: bool,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// Size of the stack-snapshot ring buffer (rounded up to a power of two).
    pub snapshot_ring_bytes: u32,
    /// Kernel BTF for CO-RE relocations.
    pub btf_path: PathBuf,
    /// Off-CPU time, when on (stack snapshots only).
    pub off_cpu: Option<OffCpuConfig>,
}

/// How blocked time is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuConfig {
    /// Blocks shorter than this are dropped in the kernel.
    pub min_block: Duration,
    /// Most blocks captured per CPU per second, whatever the switch rate.
    pub captures_per_cpu_second: u32,
    /// Captured threads asleep at once; past it the longest asleep is lost.
    pub pending_entries: u32,
}

fn map_error(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> SamplerError {
    move |source| SamplerError::Map { name, source }
}

/// Applies `changes` to the allow-list BPF hash map `name`.
fn apply_allow_list<K: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
    changes: &AllowListChanges<K>,
) -> Result<(), SamplerError> {
    let mut map: BpfHashMap<_, K, TargetValue> =
        BpfHashMap::try_from(ebpf.map_mut(name).ok_or(SamplerError::Missing { name })?)
            .map_err(map_error(name))?;
    for key in &changes.removals {
        // Already absent is fine: the goal is that it is not there.
        let _ = map.remove(key);
    }
    for (key, value) in &changes.upserts {
        map.insert(key, value, 0).map_err(map_error(name))?;
    }
    Ok(())
}

/// The loaded and attached sampler.
pub struct Sampler {
    ebpf: Ebpf,
    config: SamplerConfig,
    kernel_config: Config,
    /// The perf event of each CPU it runs on.
    attached_cpus: BTreeMap<u32, PerfEventLinkId>,
    /// The rate those perf events run at, Hz.
    base_hz: u32,
    new_processes: RingBuf<MapData>,
    snapshots: RingBuf<MapData>,
    /// Keeps kernel BPF run-time statistics on while the agent runs.
    _stats: Option<OwnedFd>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("config", &self.config)
            .field("kernel_config", &self.kernel_config)
            .field("attached_cpus", &self.attached_cpus.keys())
            .field("base_hz", &self.base_hz)
            .finish_non_exhaustive()
    }
}

/// Loads and attaches the off-CPU programs (block start at the switch,
/// block end at the wakeup).
fn attach_off_cpu(ebpf: &mut aya::Ebpf, btf: &Btf) -> Result<(), SamplerError> {
    for (name, tracepoint) in OFF_CPU_PROGRAMS {
        let program: &mut BtfTracePoint = ebpf
            .program_mut(name)
            .ok_or(SamplerError::Missing { name })?
            .try_into()
            .map_err(|source| SamplerError::Program { source })?;
        program
            .load(tracepoint, btf)
            .map_err(|source| match source {
                ProgramError::LoadError {
                    io_error,
                    verifier_log,
                } => {
                    tracing::debug!(%verifier_log, "BPF verifier log ({name})");
                    SamplerError::ProgramRejected { io_error }
                }
                source => SamplerError::Program { source },
            })?;
        program
            .attach()
            .map_err(|source| SamplerError::Program { source })?;
    }
    Ok(())
}

impl Sampler {
    /// Loads the program, sets the filter mode of `targets`, and attaches
    /// to every online CPU (failures on some CPUs are logged and retried by
    /// [`Sampler::attach_new_cpus`]).
    pub fn start(config: SamplerConfig, targets: &TargetSet) -> Result<Sampler, SamplerError> {
        let btf = Btf::parse_file(&config.btf_path, Endianness::default()).map_err(|source| {
            SamplerError::Btf {
                path: config.btf_path.clone(),
                source,
            }
        })?;
        let mut loader = EbpfLoader::new();
        loader.btf(Some(&btf));
        for name in ["stacks0", "stacks1"] {
            loader.map_max_entries(name, config.stack_map_entries.max(64));
        }
        for name in ["counts0", "counts1"] {
            loader.map_max_entries(name, config.count_map_entries.max(64));
        }
        // Ring buffers must be a power-of-two number of pages; the frame
        // pointer mode never writes to it, so it stays at one page there.
        let ring_bytes = match config.unwind {
            UnwindMode::FramePointer => 4096,
            UnwindMode::StackSnapshot => config
                .snapshot_ring_bytes
                .clamp(256 * 1024, 1 << 30)
                .next_power_of_two(),
        };
        loader.map_max_entries("samples", ring_bytes);
        // Off: the pending map (a snapshot per entry, kernel memory) stays
        // at one entry, as its programs are never loaded.
        let pending = config.off_cpu.map_or(1, |off| off.pending_entries.max(1));
        loader.map_max_entries("off_cpu_pending", pending);
        let mut ebpf = loader
            .load(BPF_OBJECT)
            .map_err(|source| SamplerError::Load { source })?;
        let program: &mut PerfEvent = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(SamplerError::Missing { name: PROGRAM_NAME })?
            .try_into()
            .map_err(|source| SamplerError::Program { source })?;
        program.load().map_err(|source| match source {
            ProgramError::LoadError {
                io_error,
                verifier_log,
            } => {
                tracing::debug!(%verifier_log, "BPF verifier log");
                SamplerError::ProgramRejected { io_error }
            }
            source => SamplerError::Program { source },
        })?;
        let mut config = config;
        if config.off_cpu.is_some()
            && let Err(error) = attach_off_cpu(&mut ebpf, &btf)
        {
            // CPU profiles matter more than off-CPU ones: a kernel or a
            // security mode that refuses the scheduler programs leaves the
            // sampler running without them.
            tracing::warn!(%error, "off-CPU profiling is off: its scheduler programs could not be attached");
            config.off_cpu = None;
        }
        // Statistics cost two clock reads per run; they are how /metrics
        // reports the sampler's own cost. Older kernels lack the syscall.
        let stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Some(fd),
            Err(error) => {
                tracing::warn!(%error, "cannot enable BPF run-time statistics");
                None
            }
        };
        let new_processes = RingBuf::try_from(ebpf.take_map("new_processes").ok_or(
            SamplerError::Missing {
                name: "new_processes",
            },
        )?)
        .map_err(map_error("new_processes"))?;
        let snapshots = RingBuf::try_from(
            ebpf.take_map("samples")
                .ok_or(SamplerError::Missing { name: "samples" })?,
        )
        .map_err(map_error("samples"))?;
        let kernel_config = Config {
            generation: 0,
            filter: targets.filter_mode() as u32,
            record_tid: u32::from(config.record_tid),
            unwind: config.unwind as u32,
            off_cpu_keep_one_in: u32::from(config.off_cpu.is_some()),
            off_cpu_captures_per_second: config
                .off_cpu
                .map_or(0, |off| off.captures_per_cpu_second),
            off_cpu_min_ns: config.off_cpu.map_or(0, |off| {
                u64::try_from(off.min_block.as_nanos()).unwrap_or(u64::MAX)
            }),
        };
        let base_hz = config.rates.base_hz(targets);
        let mut sampler = Sampler {
            ebpf,
            config,
            kernel_config,
            attached_cpus: BTreeMap::new(),
            base_hz,
            new_processes,
            snapshots,
            _stats: stats,
        };
        sampler.write_kernel_config()?;
        sampler.write_allow_lists(targets, &TargetSet::All)?;
        let failures = sampler.attach_new_cpus()?;
        if sampler.attached_cpus.is_empty() {
            let failures = failures
                .iter()
                .map(|(cpu, error)| format!("cpu {cpu}: {error}"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(SamplerError::NoCpuAttached { failures });
        }
        Ok(sampler)
    }

    /// Attaches to CPUs that came online since the last call (CPU hotplug)
    /// or failed before; returns the CPUs that failed this time.
    pub fn attach_new_cpus(&mut self) -> Result<Vec<(u32, String)>, SamplerError> {
        let online = aya::util::online_cpus()
            .map_err(|(path, source)| SamplerError::OnlineCpus { path, source })?;
        let frequency = u64::from(self.base_hz.max(1));
        let program: &mut PerfEvent = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(SamplerError::Missing { name: PROGRAM_NAME })?
            .try_into()
            .map_err(|source| SamplerError::Program { source })?;
        let mut failures = Vec::new();
        for cpu in online {
            if self.attached_cpus.contains_key(&cpu) {
                continue;
            }
            match program.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency),
                false,
            ) {
                Ok(link) => {
                    self.attached_cpus.insert(cpu, link);
                }
                Err(error) => {
                    tracing::warn!(cpu, %error, "cannot attach the sampler to a CPU");
                    failures.push((cpu, error.to_string()));
                }
            }
        }
        Ok(failures)
    }

    /// Number of CPUs with an attached perf event.
    pub fn attached_cpu_count(&self) -> usize {
        self.attached_cpus.len()
    }

    /// Applies the difference between `previous` and `targets` to the
    /// kernel allow-lists (and the filter mode if it changed), and moves
    /// the perf events to the base rate `targets` need.
    pub fn sync_targets(
        &mut self,
        targets: &TargetSet,
        previous: &TargetSet,
    ) -> Result<(), SamplerError> {
        let base_hz = self.config.rates.base_hz(targets);
        if base_hz == self.base_hz {
            return self.write_allow_lists(targets, previous);
        }
        // Every CPU's event is replaced: a perf event's frequency is fixed
        // when it is opened. Samples stop for the moment this takes, and
        // the shares are written while none run, so no target is sampled
        // at the old base with its new share or the other way round.
        tracing::info!(
            from = self.base_hz,
            to = base_hz,
            "sampling rate of the perf events changes"
        );
        self.detach_all()?;
        self.base_hz = base_hz;
        self.write_allow_lists(targets, previous)?;
        let failures = self.attach_new_cpus()?;
        if self.attached_cpus.is_empty() {
            let failures = failures
                .iter()
                .map(|(cpu, error)| format!("cpu {cpu}: {error}"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(SamplerError::NoCpuAttached { failures });
        }
        Ok(())
    }

    /// The rate the perf events run at now, Hz.
    pub fn base_hz(&self) -> u32 {
        self.base_hz
    }

    fn detach_all(&mut self) -> Result<(), SamplerError> {
        let program: &mut PerfEvent = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(SamplerError::Missing { name: PROGRAM_NAME })?
            .try_into()
            .map_err(|source| SamplerError::Program { source })?;
        for (cpu, link) in std::mem::take(&mut self.attached_cpus) {
            if let Err(error) = program.detach(link) {
                tracing::warn!(cpu, %error, "cannot detach the sampler from a CPU");
            }
        }
        Ok(())
    }

    /// Writes the allow-lists' difference between `previous` and `targets`
    /// at the current base rate.
    fn write_allow_lists(
        &mut self,
        targets: &TargetSet,
        previous: &TargetSet,
    ) -> Result<(), SamplerError> {
        let rates = self.config.rates;
        let pid_changes = targets.pid_changes(previous, rates);
        apply_allow_list(&mut self.ebpf, "allowed_pids", &pid_changes)?;
        let cgroup_changes = targets.cgroup_changes(previous, rates);
        apply_allow_list(&mut self.ebpf, "allowed_cgroups", &cgroup_changes)?;
        let filter = targets.filter_mode() as u32;
        if filter != self.kernel_config.filter {
            self.kernel_config.filter = filter;
            self.write_kernel_config()?;
        }
        Ok(())
    }

    /// Tells the BPF program where `pid`'s CPython keeps its state, so its
    /// samples carry Python frames.
    pub fn set_python_process(
        &mut self,
        pid: u32,
        process: &crate::abi::PythonProcess,
    ) -> Result<(), SamplerError> {
        self.python_processes()?
            .insert(pid, process, 0)
            .map_err(map_error("python_processes"))
    }

    /// Forgets `pid`'s CPython entry (it exited, or the pid was reused).
    pub fn remove_python_process(&mut self, pid: u32) -> Result<(), SamplerError> {
        // Already absent is fine: the goal is that it is not there.
        let _ = self.python_processes()?.remove(&pid);
        Ok(())
    }

    /// Tells the BPF program where `pid`'s Ruby keeps its thread's execution
    /// context, so its samples carry Ruby frames.
    pub fn set_ruby_process(
        &mut self,
        pid: u32,
        process: &crate::abi::RubyProcess,
    ) -> Result<(), SamplerError> {
        let map = self
            .ebpf
            .map_mut("ruby_processes")
            .ok_or(SamplerError::Missing {
                name: "ruby_processes",
            })?;
        BpfHashMap::<_, u32, crate::abi::RubyProcess>::try_from(map)
            .map_err(map_error("ruby_processes"))?
            .insert(pid, process, 0)
            .map_err(map_error("ruby_processes"))
    }

    /// Forgets `pid`'s Ruby entry (it exited, or the pid was reused).
    pub fn remove_ruby_process(&mut self, pid: u32) -> Result<(), SamplerError> {
        if let Some(map) = self.ebpf.map_mut("ruby_processes") {
            let mut map = BpfHashMap::<_, u32, crate::abi::RubyProcess>::try_from(map)
                .map_err(map_error("ruby_processes"))?;
            // Already absent is fine: the goal is that it is not there.
            let _ = map.remove(&pid);
        }
        Ok(())
    }

    fn python_processes(
        &mut self,
    ) -> Result<BpfHashMap<&mut aya::maps::MapData, u32, crate::abi::PythonProcess>, SamplerError>
    {
        BpfHashMap::try_from(self.ebpf.map_mut("python_processes").ok_or(
            SamplerError::Missing {
                name: "python_processes",
            },
        )?)
        .map_err(map_error("python_processes"))
    }

    fn write_kernel_config(&mut self) -> Result<(), SamplerError> {
        let mut config: Array<_, Config> = Array::try_from(
            self.ebpf
                .map_mut("config")
                .ok_or(SamplerError::Missing { name: "config" })?,
        )
        .map_err(map_error("config"))?;
        config
            .set(0, self.kernel_config, 0)
            .map_err(map_error("config"))
    }

    /// Switches the kernel to the other generation, then reads and clears
    /// the one it wrote until now. The kernel never writes what is read.
    pub fn drain(&mut self) -> Result<DrainedWindow, SamplerError> {
        let old = self.kernel_config.generation;
        self.kernel_config.generation = 1 - old;
        self.write_kernel_config()?;
        std::thread::sleep(GENERATION_FLIP_GRACE);
        let (counts_name, stacks_name) = if old == 0 {
            ("counts0", "stacks0")
        } else {
            ("counts1", "stacks1")
        };
        let mut counts_map: BpfHashMap<_, CountKey, CountValue> = BpfHashMap::try_from(
            self.ebpf
                .map_mut(counts_name)
                .ok_or(SamplerError::Missing { name: "counts" })?,
        )
        .map_err(map_error("counts"))?;
        let counts: Vec<(CountKey, CountValue)> =
            counts_map.iter().filter_map(Result::ok).collect();
        for (key, _) in &counts {
            let _ = counts_map.remove(key);
        }
        let mut stack_map = StackTraceMap::try_from(
            self.ebpf
                .map_mut(stacks_name)
                .ok_or(SamplerError::Missing { name: "stacks" })?,
        )
        .map_err(map_error("stacks"))?;
        let ids: Vec<u32> = stack_map.stack_ids().filter_map(Result::ok).collect();
        let mut stacks = HashMap::with_capacity(ids.len());
        for id in ids {
            if let Ok(trace) = stack_map.get(&id, 0) {
                stacks.insert(id, trace.frames().iter().map(|f| f.ip).collect());
            }
            let _ = stack_map.remove(&id);
        }
        Ok(DrainedWindow { counts, stacks })
    }

    /// Totals of the kernel's per-CPU counters, in [`KernelCounter::ALL`] order.
    pub fn kernel_counters(&self) -> Result<Vec<(KernelCounter, u64)>, SamplerError> {
        let counters: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.ebpf
                .map("counters")
                .ok_or(SamplerError::Missing { name: "counters" })?,
        )
        .map_err(map_error("counters"))?;
        KernelCounter::ALL
            .iter()
            .map(|&counter| {
                let values = counters
                    .get(&counter.index(), 0)
                    .map_err(map_error("counters"))?;
                Ok((counter, values.iter().sum()))
            })
            .collect()
    }

    /// Cumulative `(run time, runs)` of the programs from kernel
    /// statistics: the sampler's, and the off-CPU programs' when loaded.
    pub fn program_stats(&self) -> Option<(Duration, u64)> {
        let info = self.ebpf.program(PROGRAM_NAME)?.info().ok()?;
        let (mut run_time, mut runs) = (info.run_time(), info.run_count());
        if self.config.off_cpu.is_some() {
            for (name, _) in OFF_CPU_PROGRAMS {
                if let Some(info) = self.ebpf.program(name).and_then(|p| p.info().ok()) {
                    run_time += info.run_time();
                    runs += info.run_count();
                }
            }
        }
        Some((run_time, runs))
    }

    /// Captures one targeted block in `keep_one_in` from now on (off-CPU
    /// on only; each capture records the value it was taken under).
    pub fn set_off_cpu_keep_one_in(&mut self, keep_one_in: u32) -> Result<(), SamplerError> {
        if self.config.off_cpu.is_none() || self.kernel_config.off_cpu_keep_one_in == keep_one_in {
            return Ok(());
        }
        self.kernel_config.off_cpu_keep_one_in = keep_one_in.max(1);
        self.write_kernel_config()
    }

    /// Hands every stack snapshot waiting in the ring buffer to `each`, in
    /// order, and returns how many there were. Records that do not parse
    /// (never expected) are counted as `malformed`.
    pub fn take_snapshots(&mut self, mut each: impl FnMut(StackSnapshot<'_>)) -> SnapshotBatch {
        let mut batch = SnapshotBatch::default();
        while let Some(item) = self.snapshots.next() {
            match StackSnapshot::from_bytes(&item) {
                Some(snapshot) => {
                    batch.read += 1;
                    each(snapshot);
                }
                None => batch.malformed += 1,
            }
        }
        batch
    }

    /// Processes the kernel saw for the first time since the last call.
    pub fn take_new_processes(&mut self) -> Vec<NewProcess> {
        let mut events = Vec::new();
        while let Some(item) = self.new_processes.next() {
            if let Some(event) = NewProcess::from_bytes(&item) {
                events.push(event);
            }
        }
        events
    }
}

impl SampleSource for Sampler {
    fn attached_cpu_count(&self) -> usize {
        Sampler::attached_cpu_count(self)
    }

    fn attach_new_cpus(&mut self) -> Result<Vec<(u32, String)>, SamplerError> {
        Sampler::attach_new_cpus(self)
    }

    fn base_hz(&self) -> u32 {
        Sampler::base_hz(self)
    }

    fn sync_targets(
        &mut self,
        targets: &TargetSet,
        previous: &TargetSet,
    ) -> Result<(), SamplerError> {
        Sampler::sync_targets(self, targets, previous)
    }

    fn set_python_process(
        &mut self,
        pid: u32,
        process: &crate::abi::PythonProcess,
    ) -> Result<(), SamplerError> {
        Sampler::set_python_process(self, pid, process)
    }

    fn remove_python_process(&mut self, pid: u32) -> Result<(), SamplerError> {
        Sampler::remove_python_process(self, pid)
    }

    fn set_ruby_process(
        &mut self,
        pid: u32,
        process: &crate::abi::RubyProcess,
    ) -> Result<(), SamplerError> {
        Sampler::set_ruby_process(self, pid, process)
    }

    fn remove_ruby_process(&mut self, pid: u32) -> Result<(), SamplerError> {
        Sampler::remove_ruby_process(self, pid)
    }

    fn take_new_processes(&mut self) -> Vec<NewProcess> {
        Sampler::take_new_processes(self)
    }

    fn take_snapshots(&mut self, each: &mut dyn FnMut(StackSnapshot<'_>)) -> SnapshotBatch {
        Sampler::take_snapshots(self, each)
    }

    fn drain(&mut self) -> Result<DrainedWindow, SamplerError> {
        Sampler::drain(self)
    }

    fn kernel_counters(&self) -> Result<Vec<(KernelCounter, u64)>, SamplerError> {
        Sampler::kernel_counters(self)
    }

    fn set_off_cpu_keep_one_in(&mut self, keep_one_in: u32) -> Result<(), SamplerError> {
        Sampler::set_off_cpu_keep_one_in(self, keep_one_in)
    }

    fn program_stats(&self) -> Option<(Duration, u64)> {
        Sampler::program_stats(self)
    }
}

/// Whether a kernel BTF file exists at `path`.
pub fn btf_available(path: &Path) -> bool {
    path.is_file()
}
