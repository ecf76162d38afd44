//! The agent's own metrics, their Prometheus text exposition
//! (`exposition`, through `prometheus-client`) and the endpoint serving them
//! ([`http`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

mod exposition;
pub mod http;

pub use exposition::CONTENT_TYPE;
use exposition::Family;
pub use http::{MetricsThread, serve_metrics, spawn_metrics_thread};

/// A monotonically increasing counter (or a gauge set from elsewhere).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets the value (for values read as totals, e.g. from the kernel).
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Everything `/metrics` reports.
#[derive(Debug, Default)]
pub struct AgentMetrics {
    /// Samples of targeted processes counted in the kernel (total).
    pub samples: Counter,
    /// Samples skipped by per-target subsampling (total).
    pub subsampled: Counter,
    /// Off-CPU: targeted threads that blocked (total, kernel).
    pub off_cpu_blocks: Counter,
    /// Off-CPU: blocks captured (total, kernel).
    pub off_cpu_captured: Counter,
    /// Off-CPU: captured blocks shorter than the minimum (total, kernel).
    pub off_cpu_short: Counter,
    /// Off-CPU: one block in this many is captured now (0: off).
    pub off_cpu_keep_one_in: Counter,
    /// Samples or profiles lost, by reason.
    drops: Mutex<BTreeMap<&'static str, u64>>,
    /// Failed sends, by reason.
    ship_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// pprof scrapes that succeeded, by what was stored.
    scrapes: Mutex<BTreeMap<&'static str, u64>>,
    /// pprof scrapes that failed, by reason.
    scrape_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Bytes of previous scrapes kept for deltas.
    pub scrape_state_bytes: Counter,
    /// User stacks unwound from snapshots, by outcome.
    unwind_outcomes: Mutex<BTreeMap<&'static str, u64>>,
    /// Objects whose unwind info was read, by result.
    unwind_objects: Mutex<BTreeMap<&'static str, u64>>,
    /// Bytes of unwind sections cached.
    pub unwind_cache_bytes: Counter,
    /// ELF objects' symbol tables indexed (see `symbol_objects`).
    pub symbol_objects_loaded: Counter,
    /// Of those, dropped to stay within their byte budget.
    pub symbol_objects_evicted: Counter,
    /// Bytes of symbol indexes and the names read through them held now.
    pub symbol_object_bytes: Counter,
    /// Processes checked for CPython, by result.
    python_processes: Mutex<BTreeMap<&'static str, u64>>,
    /// Samples of CPython processes, by what was read of their frames.
    python_stacks: Mutex<BTreeMap<&'static str, u64>>,
    /// Code objects read, by result.
    python_code_reads: Mutex<BTreeMap<&'static str, u64>>,
    /// Processes mapping HotSpot, by result.
    hotspot_processes: Mutex<BTreeMap<&'static str, u64>>,
    /// Frames in JVMs' code caches, by how they were named.
    hotspot_frames: Mutex<BTreeMap<&'static str, u64>>,
    /// Bytes of code objects cached.
    pub python_code_cache_bytes: Counter,
    /// V8 processes found, by result.
    v8_processes: Mutex<BTreeMap<&'static str, u64>>,
    /// JavaScript frames found in V8 processes' stacks, by result.
    v8_frames: Mutex<BTreeMap<&'static str, u64>>,
    /// Ruby processes, samples and iseq reads, by result.
    ruby_processes: Mutex<BTreeMap<&'static str, u64>>,
    ruby_stacks: Mutex<BTreeMap<&'static str, u64>>,
    ruby_iseq_reads: Mutex<BTreeMap<&'static str, u64>>,
    /// Profiles written or acknowledged by the store.
    pub profiles_shipped: Counter,
    /// Profiles built.
    pub profiles_built: Counter,
    /// Windows drained.
    pub windows: Counter,
    /// Cumulative BPF program run time, ns (kernel statistics).
    pub bpf_run_time_ns: Counter,
    /// Cumulative BPF program runs (kernel statistics).
    pub bpf_run_count: Counter,
    /// CPUs with an attached perf event.
    pub cpus_attached: Counter,
    /// CPUs where attaching failed.
    pub cpus_failed: Counter,
    /// Current number of targets.
    pub targets: Counter,
    /// Frames given a function name.
    pub frames_symbolized: Counter,
    /// Frames left unsymbolized (mapping + address kept).
    pub frames_unsymbolized: Counter,
    /// Cached process snapshots.
    pub cached_processes: Counter,
    /// Profiles waiting to be shipped.
    pub queue_length: Counter,
    /// When the collector thread last went round its loop (unix ms).
    pub collector_progress_unix_ms: Counter,
    /// How long without progress counts as stalled (ms); 0 disables.
    pub collector_stall_after_ms: Counter,
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl AgentMetrics {
    /// Counts `n` losses for `reason`.
    pub fn add_drop(&self, reason: &'static str, n: u64) {
        if n > 0 {
            add_to(&self.drops, reason, n);
        }
    }

    /// Sets the total of a loss reason counted elsewhere (the kernel).
    pub fn set_drop_total(&self, reason: &'static str, total: u64) {
        let mut map = self.drops.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(reason, total);
    }

    /// `Err(age_ms)` when the collector thread has made no progress for
    /// longer than its stall threshold at `now_ms`: it is stuck (a blocking
    /// read, a deadlock), and the liveness probe should restart the agent.
    pub fn collector_health(&self, now_ms: u64) -> Result<(), u64> {
        let last = self.collector_progress_unix_ms.get();
        let limit = self.collector_stall_after_ms.get();
        let age = now_ms.saturating_sub(last);
        if limit == 0 || last == 0 || age <= limit {
            Ok(())
        } else {
            Err(age)
        }
    }

    /// Losses so far for `reason`.
    pub fn drops(&self, reason: &str) -> u64 {
        let map = self.drops.lock().unwrap_or_else(|p| p.into_inner());
        map.get(reason).copied().unwrap_or(0)
    }

    /// Sets the cumulative unwinding totals (outcomes per sample, results
    /// per object) counted by the unwinder.
    pub fn set_unwind_totals<'a>(
        &self,
        outcomes: impl IntoIterator<Item = (&'a &'static str, &'a u64)>,
        objects: impl IntoIterator<Item = (&'a &'static str, &'a u64)>,
    ) {
        let mut map = self
            .unwind_outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.extend(outcomes.into_iter().map(|(k, v)| (*k, *v)));
        let mut map = self
            .unwind_objects
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.extend(objects.into_iter().map(|(k, v)| (*k, *v)));
    }

    /// Sets the cumulative Ruby totals counted by the Ruby unwinder.
    pub fn set_ruby_totals(&self, stats: &crate::ruby::RubyStats) {
        for (target, source) in [
            (&self.ruby_processes, &stats.processes),
            (&self.ruby_stacks, &stats.stacks),
            (&self.ruby_iseq_reads, &stats.iseq_reads),
        ] {
            let mut map = target.lock().unwrap_or_else(|p| p.into_inner());
            map.extend(source.iter().map(|(k, v)| (*k, *v)));
        }
    }

    /// Sets the cumulative V8 totals counted by the V8 unwinder.
    pub fn set_v8_totals(&self, stats: &crate::v8::V8Stats) {
        for (target, source) in [
            (&self.v8_processes, &stats.processes),
            (&self.v8_frames, &stats.frames),
        ] {
            let mut map = target.lock().unwrap_or_else(|p| p.into_inner());
            map.extend(source.iter().map(|(k, v)| (*k, *v)));
        }
    }

    /// Sets the cumulative Python totals counted by the Python unwinder.
    pub fn set_python_totals(&self, stats: &crate::python::PythonStats) {
        for (target, source) in [
            (&self.python_processes, &stats.processes),
            (&self.python_stacks, &stats.stacks),
            (&self.python_code_reads, &stats.code_reads),
        ] {
            let mut map = target.lock().unwrap_or_else(|p| p.into_inner());
            map.extend(source.iter().map(|(k, v)| (*k, *v)));
        }
    }

    /// Sets the cumulative HotSpot totals counted by the HotSpot unwinder.
    pub fn set_hotspot_totals(&self, stats: &crate::hotspot::HotspotStats) {
        for (target, source) in [
            (&self.hotspot_processes, &stats.processes),
            (&self.hotspot_frames, &stats.frames),
        ] {
            let mut map = target.lock().unwrap_or_else(|p| p.into_inner());
            map.extend(source.iter().map(|(k, v)| (*k, *v)));
        }
    }

    /// Samples of Python processes with `result` so far.
    pub fn python_stacks(&self, result: &str) -> u64 {
        let map = self.python_stacks.lock().unwrap_or_else(|p| p.into_inner());
        map.get(result).copied().unwrap_or(0)
    }

    /// Samples unwound with `outcome` so far.
    pub fn unwind_outcome(&self, outcome: &str) -> u64 {
        let map = self
            .unwind_outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        map.get(outcome).copied().unwrap_or(0)
    }

    /// Counts one failed send for `reason`.
    pub fn add_ship_error(&self, reason: &'static str) {
        add_to(&self.ship_errors, reason, 1);
    }

    /// Counts one pprof scrape that stored `outcome`.
    pub fn add_scrape(&self, outcome: &'static str) {
        add_to(&self.scrapes, outcome, 1);
    }

    /// Counts one failed pprof scrape for `reason`.
    pub fn add_scrape_error(&self, reason: &'static str) {
        add_to(&self.scrape_errors, reason, 1);
    }

    /// Failed pprof scrapes so far for `reason`.
    pub fn scrape_errors(&self, reason: &str) -> u64 {
        let map = self.scrape_errors.lock().unwrap_or_else(|p| p.into_inner());
        map.get(reason).copied().unwrap_or(0)
    }

    /// Sets the bytes of delta state held.
    pub fn set_scrape_state_bytes(&self, bytes: u64) {
        self.scrape_state_bytes.set(bytes);
    }

    /// Renders the Prometheus text format (0.0.4, see
    /// [`CONTENT_TYPE`]); `rss` is `(current, peak)` bytes.
    pub fn render(&self, rss: Option<(u64, u64)>) -> String {
        let mut families = vec![
            Family::counter(
                "kiln_agent_samples_total",
                "Samples of targeted processes counted in the kernel.",
                self.samples.get(),
            ),
            Family::counter(
                "kiln_agent_subsampled_total",
                "Samples skipped by per-target subsampling.",
                self.subsampled.get(),
            ),
            Family::counters_by(
                "kiln_agent_off_cpu_blocks_total",
                "Blocks of targeted threads seen with off-CPU on, by what became of them.",
                "result",
                vec![
                    ("seen", self.off_cpu_blocks.get()),
                    ("captured", self.off_cpu_captured.get()),
                    ("short", self.off_cpu_short.get()),
                ],
            ),
            Family::gauge(
                "kiln_agent_off_cpu_keep_one_in",
                "Off-CPU: one targeted block in this many is captured (0: off-CPU is off).",
                self.off_cpu_keep_one_in.get(),
            ),
            Family::counter(
                "kiln_agent_profiles_built_total",
                "Profiles built (one per target and window).",
                self.profiles_built.get(),
            ),
            Family::counter(
                "kiln_agent_profiles_shipped_total",
                "Profiles written or acknowledged by the store.",
                self.profiles_shipped.get(),
            ),
            Family::counter(
                "kiln_agent_windows_total",
                "Sampling windows drained.",
                self.windows.get(),
            ),
            Family::counter(
                "kiln_agent_bpf_run_time_ns_total",
                "Cumulative run time of the BPF sampler in ns (kernel bpf_stats).",
                self.bpf_run_time_ns.get(),
            ),
            Family::counter(
                "kiln_agent_bpf_runs_total",
                "Runs of the BPF sampler (kernel bpf_stats).",
                self.bpf_run_count.get(),
            ),
            Family::counter(
                "kiln_agent_frames_symbolized_total",
                "User and kernel frames given a function name.",
                self.frames_symbolized.get(),
            ),
            Family::counter(
                "kiln_agent_frames_unsymbolized_total",
                "Frames kept as mapping and address only.",
                self.frames_unsymbolized.get(),
            ),
            Family::counter(
                "kiln_agent_symbol_objects_loaded_total",
                "ELF objects whose symbol tables were indexed for naming frames \
                 (each a full read of the tables; indexes are kept across windows).",
                self.symbol_objects_loaded.get(),
            ),
            Family::counter(
                "kiln_agent_symbol_objects_evicted_total",
                "Indexed ELF objects dropped to keep their indexes within the byte budget.",
                self.symbol_objects_evicted.get(),
            ),
            Family::gauge(
                "kiln_agent_symbol_object_bytes",
                "Bytes of ELF symbol indexes and names held for naming frames.",
                self.symbol_object_bytes.get(),
            ),
            Family::gauge(
                "kiln_agent_cpus_attached",
                "CPUs with an attached perf event.",
                self.cpus_attached.get(),
            ),
            Family::gauge(
                "kiln_agent_cpus_failed",
                "Online CPUs where attaching failed.",
                self.cpus_failed.get(),
            ),
            Family::gauge(
                "kiln_agent_targets",
                "Targets in the kernel allow-list.",
                self.targets.get(),
            ),
            Family::gauge(
                "kiln_agent_cached_processes",
                "Process snapshots held for symbolization.",
                self.cached_processes.get(),
            ),
            Family::gauge(
                "kiln_agent_queue_length",
                "Profiles waiting to be shipped.",
                self.queue_length.get(),
            ),
            Family::gauge(
                "kiln_agent_unwind_cache_bytes",
                "Bytes of .eh_frame/.debug_frame sections cached for unwinding.",
                self.unwind_cache_bytes.get(),
            ),
            Family::gauge(
                "kiln_agent_collector_stalled",
                "1 when the collector thread has made no progress for longer than its \
                 stall threshold (/healthz then fails).",
                u64::from(self.collector_health(unix_ms()).is_err()),
            ),
            Family::gauge(
                "kiln_agent_scrape_state_bytes",
                "Bytes of previous pprof scrapes kept to take deltas of cumulative profiles.",
                self.scrape_state_bytes.get(),
            ),
            Family::gauge(
                "kiln_agent_python_code_cache_bytes",
                "Bytes of CPython code objects (names, files, line tables) cached.",
                self.python_code_cache_bytes.get(),
            ),
        ];
        if let Some((rss, peak)) = rss {
            families.push(Family::gauge(
                "kiln_agent_resident_memory_bytes",
                "Resident set size.",
                rss,
            ));
            families.push(Family::gauge(
                "kiln_agent_resident_memory_peak_bytes",
                "Peak resident set size.",
                peak,
            ));
        }
        let labelled: [(&'static str, &'static str, &'static str, &Mutex<_>); 11] = [
            (
                "kiln_agent_dropped_total",
                "Samples or profiles lost, by reason.",
                "reason",
                &self.drops,
            ),
            (
                "kiln_agent_unwind_total",
                "User stacks unwound from snapshots, by outcome (complete, truncated, \
                 fallback_frame_pointer, no_unwind_info, no_user_stack, unwinder_fault).",
                "outcome",
                &self.unwind_outcomes,
            ),
            (
                "kiln_agent_unwind_objects_total",
                "ELF objects whose unwind info was read, by result (loaded, or why it \
                 falls back to frame pointers: too_large, malformed, no_unwind_info, ...).",
                "result",
                &self.unwind_objects,
            ),
            (
                "kiln_agent_python_processes_total",
                "Processes mapping CPython, by result (supported, unsupported_version, \
                 missing_symbol, bad_object, and for 3.13+ bad_debug_offsets, \
                 debug_offsets_unreadable, version_mismatch): unsupported ones get native \
                 frames only.",
                "result",
                &self.python_processes,
            ),
            (
                "kiln_agent_python_stacks_total",
                "Samples of CPython processes, by what was read of their Python frames \
                 (complete, truncated, no_thread_state, not_registered_in_bpf).",
                "result",
                &self.python_stacks,
            ),
            (
                "kiln_agent_python_code_reads_total",
                "CPython code objects read from process memory, by result (ok, unreadable, not_code).",
                "result",
                &self.python_code_reads,
            ),
            (
                "kiln_agent_hotspot_processes_total",
                "Processes mapping HotSpot's libjvm.so, by result (supported, or why their \
                 Java frames are not read: vmstructs_not_initialized while it starts, \
                 vmstructs_invalid, vmstructs_missing_entry, missing_symbol, ...).",
                "result",
                &self.hotspot_processes,
            ),
            (
                "kiln_agent_hotspot_frames_total",
                "Frames in JVMs' code caches, by how they were named (compiled, \
                 interpreted, stub, or method_unreadable, no_blob).",
                "result",
                &self.hotspot_frames,
            ),
            (
                "kiln_agent_ship_errors_total",
                "Failed sends, by reason.",
                "reason",
                &self.ship_errors,
            ),
            (
                "kiln_agent_scrapes_total",
                "pprof scrapes that succeeded, by what was stored (gauge, delta, restarted: \
                 stored whole after a process restart, baseline: the first of a cumulative \
                 profile, kept only to take deltas against).",
                "outcome",
                &self.scrapes,
            ),
            (
                "kiln_agent_scrape_errors_total",
                "pprof scrapes that failed, by reason (timeout, connect, http, redirect, \
                 status, content_type, too_large, decode, decompressed_too_large, \
                 sample_types, state_budget, port_name: the target names a port no \
                 container of the pod declares).",
                "reason",
                &self.scrape_errors,
            ),
        ];
        for (name, help, label, values) in labelled {
            let values = values.lock().unwrap_or_else(|p| p.into_inner());
            let values = values.iter().map(|(k, v)| (*k, *v)).collect();
            families.push(Family::counters_by(name, help, label, values));
        }
        let (reads_ok, reads_failed, read_bytes) = crate::python::memory::read_totals();
        families.push(Family::counters_by(
            "kiln_agent_runtime_memory_reads_total",
            "Reads of profiled processes' memory by the runtimes' readers (HotSpot, V8, \
             Ruby, CPython), by result: ok, or rejected (unmapped or unreadable memory, \
             which forged or freed runtime structures point at).",
            "result",
            vec![("ok", reads_ok), ("rejected", reads_failed)],
        ));
        families.push(Family::counter(
            "kiln_agent_runtime_memory_read_bytes_total",
            "Bytes copied from profiled processes' memory by the runtimes' readers.",
            read_bytes,
        ));
        for (name, help, values) in [
            (
                "kiln_agent_v8_processes_total",
                "Processes mapping node or libnode.so, by result (supported, or why their \
                 JavaScript frames are not named: no_postmortem_constants, missing_constant, \
                 constant_out_of_range, pointer_compression, symbols_over_cap, bad_object).",
                &self.v8_processes,
            ),
            (
                "kiln_agent_v8_frames_total",
                "JavaScript frames in V8 processes' stacks, by result (named, not_a_function).",
                &self.v8_frames,
            ),
        ] {
            let values = values.lock().unwrap_or_else(|p| p.into_inner());
            let values = values.iter().map(|(k, v)| (*k, *v)).collect();
            families.push(Family::counters_by(name, help, "result", values));
        }
        for (name, help, values) in [
            (
                "kiln_agent_ruby_processes_total",
                "Processes mapping libruby or ruby, by result (supported, or why their Ruby \
                 frames are not read: unsupported_version, missing_symbol, \
                 unsupported_tls_model, bad_tls_module, bad_object).",
                &self.ruby_processes,
            ),
            (
                "kiln_agent_ruby_stacks_total",
                "Samples of Ruby processes, by what the kernel read (complete, truncated, \
                 no_execution_context, not_registered_in_bpf).",
                &self.ruby_stacks,
            ),
            (
                "kiln_agent_ruby_iseq_reads_total",
                "Ruby instruction sequences read, by result (ok, unreadable, not_iseq).",
                &self.ruby_iseq_reads,
            ),
        ] {
            let values = values.lock().unwrap_or_else(|p| p.into_inner());
            let values = values.iter().map(|(k, v)| (*k, *v)).collect();
            families.push(Family::counters_by(name, help, "result", values));
        }
        exposition::render(families)
    }
}

fn add_to(map: &Mutex<BTreeMap<&'static str, u64>>, key: &'static str, n: u64) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry(key).or_insert(0) += n;
}

/// `(VmRSS, VmHWM)` in bytes from `/proc/self/status` text.
pub fn parse_rss(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests;
