//! The collector without root: stacks of this test process, recorded the way
//! the BPF program records them (registers plus the top of the stack for the
//! eh-frame mode, return-address chains counted per key for the
//! frame-pointer mode), are fed to the real collector through
//! `SampleSource`. The collector reads `/proc`, unwinds, symbolizes the test
//! binary with blazesym and queues pprof; the test decodes what it queued and
//! checks frames, labels and values, and that the process labels the store
//! keeps per sample (`kiln_contract::sample_labels`) are on the samples and
//! not among the series labels.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_agent::abi::{
    CountKey, CountValue, KernelCounter, NewProcess, PyStatus, PythonProcess, SampleKind,
    StackSnapshot,
};
use kiln_agent::aggregate::DrainedWindow;
use kiln_agent::collector::{Collector, CollectorConfig, CollectorParts};
use kiln_agent::kallsyms::KernelSymbols;
use kiln_agent::metrics::AgentMetrics;
use kiln_agent::process_info::{ProcessTable, parse_stat_start_ticks};
use kiln_agent::sample_source::{SampleSource, SamplerError, SnapshotBatch};
use kiln_agent::ship::{ShipItem, ShipQueue};
use kiln_agent::symbolize::StackSymbolizer;
use kiln_agent::target_set::{
    SamplingRates, TargetEntry, TargetSet, TargetSource, TargetSourceError,
};
use kiln_agent::unwind::{StackUnwinder, StackUnwinderConfig};
use kiln_contract::sample_labels::{COMM, PER_SAMPLE_LABELS, PID, TID};
use kiln_pprof::{DecodeLimits, Profile};

use crate::capture::{CapturedStack, capture_own_stack};

const FREQUENCY_HZ: u32 = 19;
const PERIOD_NS: i64 = 1_000_000_000 / FREQUENCY_HZ as i64;
const NODE: &str = "node-recorded";

#[inline(never)]
fn kiln_recorded_inner(depth: u32) -> CapturedStack {
    let recorded = if depth == 0 {
        capture_own_stack()
    } else {
        kiln_recorded_inner(depth - 1)
    };
    std::hint::black_box(recorded)
}

#[inline(never)]
fn kiln_recorded_outer() -> CapturedStack {
    std::hint::black_box(kiln_recorded_inner(std::hint::black_box(2)))
}

#[inline(never)]
fn kiln_recorded_other() -> CapturedStack {
    std::hint::black_box(capture_own_stack())
}

/// This process's start in ns since boot, as the kernel reports it
/// (`start_boottime`), from `/proc/self/stat` in clock ticks.
fn own_start_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
    // SAFETY: sysconf only reads a constant.
    let ticks_per_second =
        u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("clock ticks per second");
    parse_stat_start_ticks(&stat).expect("start time") * (1_000_000_000 / ticks_per_second)
}

fn own_comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .expect("own comm")
        .trim_end()
        .to_owned()
}

fn comm_bytes(name: &str) -> [u8; 16] {
    let mut comm = [0u8; 16];
    let len = name.len().min(15);
    comm[..len].copy_from_slice(&name.as_bytes()[..len]);
    comm
}

/// Samples recorded beforehand, handed to the collector as the sampler
/// would hand them over: new-process events, snapshots, one drained window.
#[derive(Default)]
struct RecordedSamples {
    pid: u32,
    start_boottime_ns: u64,
    cgroup_id: u64,
    new_processes: Vec<NewProcess>,
    snapshots: Vec<CapturedStack>,
    /// Off-CPU blocks: a stack and the off-CPU ns it stands for.
    off_cpu: Vec<(CapturedStack, u64)>,
    window: DrainedWindow,
    drains: u32,
}

impl SampleSource for RecordedSamples {
    fn attached_cpu_count(&self) -> usize {
        1
    }

    fn attach_new_cpus(&mut self) -> Result<Vec<(u32, String)>, SamplerError> {
        Ok(Vec::new())
    }

    fn base_hz(&self) -> u32 {
        FREQUENCY_HZ
    }

    fn sync_targets(&mut self, _: &TargetSet, _: &TargetSet) -> Result<(), SamplerError> {
        Ok(())
    }

    fn set_python_process(&mut self, _: u32, _: &PythonProcess) -> Result<(), SamplerError> {
        Ok(())
    }

    fn remove_python_process(&mut self, _: u32) -> Result<(), SamplerError> {
        Ok(())
    }

    fn take_new_processes(&mut self) -> Vec<NewProcess> {
        std::mem::take(&mut self.new_processes)
    }

    fn take_snapshots(&mut self, each: &mut dyn FnMut(StackSnapshot<'_>)) -> SnapshotBatch {
        let recorded = std::mem::take(&mut self.snapshots);
        let off_cpu = std::mem::take(&mut self.off_cpu);
        let cpu = recorded.iter().map(|sample| (sample, SampleKind::Cpu, 0));
        let blocks = off_cpu
            .iter()
            .map(|(sample, ns)| (sample, SampleKind::OffCpu, *ns));
        for (sample, kind, off_cpu_ns) in cpu.chain(blocks) {
            each(StackSnapshot {
                pid: self.pid,
                tid: sample.tid,
                cgroup_id: self.cgroup_id,
                start_boottime_ns: self.start_boottime_ns,
                ip: sample.ip,
                sp: sample.sp,
                bp: sample.bp,
                comm: comm_bytes("recorded-thread"),
                kind,
                off_cpu_ns,
                kernel: Vec::new(),
                py_status: PyStatus::None,
                py_frames: Vec::new(),
                stack: &sample.stack,
            });
        }
        SnapshotBatch {
            read: (recorded.len() + off_cpu.len()) as u64,
            malformed: 0,
        }
    }

    fn drain(&mut self) -> Result<DrainedWindow, SamplerError> {
        self.drains += 1;
        Ok(std::mem::take(&mut self.window))
    }

    fn kernel_counters(&self) -> Result<Vec<(KernelCounter, u64)>, SamplerError> {
        Ok(KernelCounter::ALL.iter().map(|&c| (c, 0)).collect())
    }

    fn program_stats(&self) -> Option<(Duration, u64)> {
        None
    }
}

struct FixedTargets(TargetSet);

impl TargetSource for FixedTargets {
    fn current_targets(&mut self) -> Result<TargetSet, TargetSourceError> {
        Ok(self.0.clone())
    }
}

/// This process as the only target, labelled like a discovered workload.
fn own_targets(pid: u32) -> TargetSet {
    let labels = BTreeMap::from([("service_name".to_owned(), "recorded-service".to_owned())]);
    TargetSet::Pids(BTreeMap::from([(pid, TargetEntry::with_labels(labels))]))
}

/// Runs the collector over `samples` for one window (a collector asked to
/// stop drains once and returns) and returns what it queued.
fn collect_once(samples: RecordedSamples, unwinder: Option<StackUnwinder>) -> Vec<ShipItem> {
    let metrics = Arc::new(AgentMetrics::default());
    let queue = ShipQueue::new(16, Arc::clone(&metrics));
    let targets = own_targets(samples.pid);
    let parts = CollectorParts {
        sampler: samples,
        source: FixedTargets(targets.clone()),
        targets,
        processes: ProcessTable::new(64, 256),
        symbolizer: StackSymbolizer::new(KernelSymbols::default(), 10_000),
        queue: queue.clone(),
        metrics: Arc::clone(&metrics),
        unwinder,
        python: None,
    };
    let config = CollectorConfig {
        rates: SamplingRates {
            default_hz: FREQUENCY_HZ,
            max_hz: FREQUENCY_HZ,
        },
        drain_interval: Duration::from_secs(3600),
        target_refresh_interval: Duration::from_secs(3600),
        node: NODE.to_owned(),
        record_tid: true,
        unwound_stacks_capacity: 1024,
        runtimes: Default::default(),
        off_cpu_captures_per_cpu_second: None,
    };
    Collector::new(config, parts).run(&AtomicBool::new(true));
    assert_eq!(metrics.windows.get(), 1, "one window drained");
    queue.pop_batch(usize::MAX)
}

/// A sample of a decoded profile: function names leaf first, values, and
/// string labels.
#[derive(Debug)]
struct FlatSample {
    functions: Vec<String>,
    values: Vec<i64>,
    labels: HashMap<String, String>,
}

fn flatten(profile: &Profile) -> Vec<FlatSample> {
    profile
        .samples()
        .iter()
        .map(|sample| {
            let functions = sample
                .location_id
                .iter()
                .filter_map(|&id| profile.location(id))
                .flat_map(|location| {
                    location.line.iter().map(|line| {
                        profile
                            .function(line.function_id)
                            .map(|f| profile.string(f.name).to_owned())
                            .unwrap_or_default()
                    })
                })
                .collect();
            let labels = sample
                .label
                .iter()
                .map(|label| {
                    let value = if label.str != 0 {
                        profile.string(label.str).to_owned()
                    } else {
                        label.num.to_string()
                    };
                    (profile.string(label.key).to_owned(), value)
                })
                .collect();
            FlatSample {
                functions,
                values: sample.value.clone(),
                labels,
            }
        })
        .collect()
}

fn decode(item: &ShipItem) -> Profile {
    kiln_pprof::decode(&item.pprof_gzip, &DecodeLimits::default())
        .expect("the collector's pprof decodes and validates")
}

/// Position of the first function whose name contains `part`.
fn position(functions: &[String], part: &str) -> Option<usize> {
    functions.iter().position(|f| f.contains(part))
}

fn series_labels(item: &ShipItem) -> BTreeMap<&str, &str> {
    item.labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[test]
fn recorded_snapshots_become_one_pprof_with_named_callers_labels_and_values() {
    let deep = kiln_recorded_outer();
    let other = kiln_recorded_other();
    let pid = std::process::id();
    let start = own_start_ns();
    let samples = RecordedSamples {
        pid,
        start_boottime_ns: start,
        cgroup_id: 1,
        new_processes: vec![NewProcess {
            pid,
            reserved: 0,
            start_boottime_ns: start,
        }],
        // The same stack sampled three times, another once.
        snapshots: vec![deep.clone(), deep.clone(), deep.clone(), other.clone()],
        ..RecordedSamples::default()
    };
    let unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    let items = collect_once(samples, Some(unwinder));
    assert_eq!(items.len(), 1, "one target, one window: one profile");
    let item = &items[0];

    let labels = series_labels(item);
    assert_eq!(labels.get("__name__"), Some(&"process_cpu"));
    assert_eq!(labels.get("node"), Some(&NODE));
    assert_eq!(labels.get("language"), Some(&"native"));
    assert_eq!(
        labels.get("service_name"),
        Some(&"recorded-service"),
        "the target's labels are series labels"
    );
    for name in PER_SAMPLE_LABELS {
        assert!(
            !labels.contains_key(name),
            "{name} stays on the samples, never on the series, or a fork-heavy pod exhausts the store's series budget: {labels:?}"
        );
    }

    let profile = decode(item);
    assert_eq!(profile.period(), PERIOD_NS);
    let flat = flatten(&profile);
    assert_eq!(flat.len(), 2, "two distinct stacks: {flat:#?}");

    let deep_sample = flat
        .iter()
        .find(|s| position(&s.functions, "kiln_recorded_outer").is_some())
        .unwrap_or_else(|| panic!("the deep stack unwound to its outer caller: {flat:#?}"));
    assert_eq!(deep_sample.values, vec![3, 3 * PERIOD_NS]);
    let functions = &deep_sample.functions;
    let leaf = position(functions, "capture_own_stack").expect("the leaf is named");
    let inner = position(functions, "kiln_recorded_inner").expect("the recursion is named");
    let outer = position(functions, "kiln_recorded_outer").expect("the caller is named");
    assert_eq!(leaf, 0, "leaf first: {functions:?}");
    assert!(leaf < inner && inner < outer, "leaf first: {functions:?}");
    assert_eq!(
        functions
            .iter()
            .filter(|f| f.contains("kiln_recorded_inner"))
            .count(),
        3,
        "one frame per recursion level: {functions:?}"
    );
    assert!(
        position(functions, "recorded_snapshots_become_one_pprof").is_some(),
        "the test function itself is a caller: {functions:?}"
    );

    let other_sample = flat
        .iter()
        .find(|s| position(&s.functions, "kiln_recorded_other").is_some())
        .unwrap_or_else(|| panic!("the other stack is kept apart: {flat:#?}"));
    assert_eq!(other_sample.values, vec![1, PERIOD_NS]);
    assert!(position(&other_sample.functions, "kiln_recorded_inner").is_none());

    let comm = own_comm();
    for sample in [deep_sample, other_sample] {
        assert_eq!(sample.labels.get(PID), Some(&pid.to_string()));
        assert_eq!(sample.labels.get(TID), Some(&deep.tid.to_string()));
        assert_eq!(
            sample.labels.get(COMM),
            Some(&comm),
            "the process's comm from /proc, not the sampled thread's"
        );
        assert_eq!(sample.labels.get("node").map(String::as_str), Some(NODE));
    }

    let exe = std::env::current_exe().expect("own path");
    let exe = exe.to_str().expect("a UTF-8 path");
    assert!(
        profile
            .mappings()
            .iter()
            .any(|m| profile.string(m.filename) == exe && m.has_functions),
        "the test binary's mapping is named and has functions: {:?}",
        profile
            .mappings()
            .iter()
            .map(|m| profile.string(m.filename))
            .collect::<Vec<_>>()
    );
}

#[test]
fn recorded_frame_pointer_counts_are_symbolized_with_their_counts() {
    let recorded = kiln_recorded_outer();
    let pid = std::process::id();
    let start = own_start_ns();
    // The chain of return addresses the kernel's frame-pointer walk would
    // store for this sample, from the real stack.
    let mut table = ProcessTable::new(4, 64);
    let process = table.refresh(pid, start).expect("own process is readable");
    let mut unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    unwinder.load_process(&process);
    let chain = unwinder
        .unwind(&StackSnapshot {
            pid,
            tid: recorded.tid,
            cgroup_id: 1,
            start_boottime_ns: start,
            ip: recorded.ip,
            sp: recorded.sp,
            bp: recorded.bp,
            comm: [0; 16],
            kind: SampleKind::Cpu,
            off_cpu_ns: 0,
            kernel: Vec::new(),
            py_status: PyStatus::None,
            py_frames: Vec::new(),
            stack: &recorded.stack,
        })
        .frames;
    assert!(chain.len() >= 5, "a real chain: {chain:x?}");

    let key = |user_stack_id| CountKey {
        pid,
        tid: recorded.tid,
        cgroup_id: 1,
        start_boottime_ns: start,
        user_stack_id,
        // -EFAULT: the kernel had no kernel stack for it.
        kernel_stack_id: -14,
    };
    let value = |samples| CountValue {
        samples,
        comm: comm_bytes("recorded-thread"),
    };
    let samples = RecordedSamples {
        pid,
        start_boottime_ns: start,
        cgroup_id: 1,
        window: DrainedWindow {
            // Stack 2 was overwritten before the drain: its samples are
            // counted as lost, and kept with no user frames.
            counts: vec![(key(1), value(5)), (key(2), value(2))],
            stacks: HashMap::from([(1, chain)]),
        },
        ..RecordedSamples::default()
    };
    let items = collect_once(samples, None);
    assert_eq!(items.len(), 1);
    let profile = decode(&items[0]);
    let flat = flatten(&profile);
    assert_eq!(flat.len(), 2, "{flat:#?}");
    let named = flat
        .iter()
        .find(|s| position(&s.functions, "kiln_recorded_outer").is_some())
        .unwrap_or_else(|| panic!("the chain is symbolized: {flat:#?}"));
    assert_eq!(named.values, vec![5, 5 * PERIOD_NS]);
    assert_eq!(position(&named.functions, "capture_own_stack"), Some(0));
    let lost = flat
        .iter()
        .find(|s| s.functions == ["[lost stack]"])
        .unwrap_or_else(|| panic!("the missing stack is kept as lost: {flat:#?}"));
    assert_eq!(lost.values, vec![2, 2 * PERIOD_NS]);
    assert_eq!(lost.labels.get("pid"), Some(&pid.to_string()));
}

/// Off-CPU blocks (issue 52) go through the same unwinder and symbolizer
/// as CPU samples, into a profile of their own beside the CPU one: name
/// `off_cpu`, the target's labels, blocks and their summed time as values.
#[test]
fn recorded_off_cpu_blocks_become_an_off_cpu_pprof_beside_the_cpu_one() {
    let deep = kiln_recorded_outer();
    let pid = std::process::id();
    let start = own_start_ns();
    let samples = RecordedSamples {
        pid,
        start_boottime_ns: start,
        cgroup_id: 1,
        new_processes: vec![NewProcess {
            pid,
            reserved: 0,
            start_boottime_ns: start,
        }],
        snapshots: vec![deep.clone()],
        off_cpu: vec![(deep.clone(), 3_000_000), (deep.clone(), 5_000_000)],
        ..RecordedSamples::default()
    };
    let unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    let items = collect_once(samples, Some(unwinder));
    assert_eq!(items.len(), 2, "one CPU and one off-CPU profile");
    let off_cpu = items
        .iter()
        .find(|item| series_labels(item).get("__name__") == Some(&"off_cpu"))
        .expect("an off-CPU profile");
    let cpu = items
        .iter()
        .find(|item| series_labels(item).get("__name__") == Some(&"process_cpu"))
        .expect("a CPU profile");
    assert_ne!(
        off_cpu.file_stem, cpu.file_stem,
        "their idempotency keys differ"
    );
    let mut off_labels = series_labels(off_cpu);
    let mut cpu_labels = series_labels(cpu);
    off_labels.remove("__name__");
    cpu_labels.remove("__name__");
    assert_eq!(off_labels, cpu_labels, "the same series labels otherwise");

    let profile = decode(off_cpu);
    let types: Vec<(&str, &str)> = profile
        .sample_types()
        .iter()
        .map(|t| (profile.string(t.r#type), profile.string(t.unit)))
        .collect();
    assert_eq!(types, [("blocks", "count"), ("off_cpu", "nanoseconds")]);
    let flat = flatten(&profile);
    assert_eq!(flat.len(), 1, "one stack: {flat:#?}");
    assert_eq!(flat[0].values, vec![2, 8_000_000]);
    assert!(
        position(&flat[0].functions, "kiln_recorded_outer").is_some(),
        "the blocked stack is unwound and named: {:?}",
        flat[0].functions
    );
}
