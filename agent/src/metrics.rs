//! The agent's own metrics and their Prometheus text exposition.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Samples or profiles lost, by reason.
    drops: Mutex<BTreeMap<&'static str, u64>>,
    /// Failed sends, by reason.
    ship_errors: Mutex<BTreeMap<&'static str, u64>>,
    /// User stacks unwound from snapshots, by outcome.
    unwind_outcomes: Mutex<BTreeMap<&'static str, u64>>,
    /// Objects whose unwind info was read, by result.
    unwind_objects: Mutex<BTreeMap<&'static str, u64>>,
    /// Bytes of unwind sections cached.
    pub unwind_cache_bytes: Counter,
    /// Processes checked for CPython, by result.
    python_processes: Mutex<BTreeMap<&'static str, u64>>,
    /// Samples of CPython processes, by what was read of their frames.
    python_stacks: Mutex<BTreeMap<&'static str, u64>>,
    /// Code objects read, by result.
    python_code_reads: Mutex<BTreeMap<&'static str, u64>>,
    /// Bytes of code objects cached.
    pub python_code_cache_bytes: Counter,
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

    /// Renders the Prometheus text format; `rss` is `(current, peak)` bytes.
    pub fn render(&self, rss: Option<(u64, u64)>) -> String {
        let mut out = String::with_capacity(2048);
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        counter(
            "kiln_agent_samples_total",
            "Samples of targeted processes counted in the kernel.",
            self.samples.get(),
        );
        counter(
            "kiln_agent_subsampled_total",
            "Samples skipped by per-target subsampling.",
            self.subsampled.get(),
        );
        counter(
            "kiln_agent_profiles_built_total",
            "Profiles built (one per target and window).",
            self.profiles_built.get(),
        );
        counter(
            "kiln_agent_profiles_shipped_total",
            "Profiles written or acknowledged by the store.",
            self.profiles_shipped.get(),
        );
        counter(
            "kiln_agent_windows_total",
            "Sampling windows drained.",
            self.windows.get(),
        );
        counter(
            "kiln_agent_bpf_run_time_ns_total",
            "Cumulative run time of the BPF sampler in ns (kernel bpf_stats).",
            self.bpf_run_time_ns.get(),
        );
        counter(
            "kiln_agent_bpf_runs_total",
            "Runs of the BPF sampler (kernel bpf_stats).",
            self.bpf_run_count.get(),
        );
        counter(
            "kiln_agent_frames_symbolized_total",
            "User and kernel frames given a function name.",
            self.frames_symbolized.get(),
        );
        counter(
            "kiln_agent_frames_unsymbolized_total",
            "Frames kept as mapping and address only.",
            self.frames_unsymbolized.get(),
        );
        let mut gauge = |name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        gauge(
            "kiln_agent_cpus_attached",
            "CPUs with an attached perf event.",
            self.cpus_attached.get(),
        );
        gauge(
            "kiln_agent_cpus_failed",
            "Online CPUs where attaching failed.",
            self.cpus_failed.get(),
        );
        gauge(
            "kiln_agent_targets",
            "Targets in the kernel allow-list.",
            self.targets.get(),
        );
        gauge(
            "kiln_agent_cached_processes",
            "Process snapshots held for symbolization.",
            self.cached_processes.get(),
        );
        gauge(
            "kiln_agent_queue_length",
            "Profiles waiting to be shipped.",
            self.queue_length.get(),
        );
        gauge(
            "kiln_agent_unwind_cache_bytes",
            "Bytes of .eh_frame/.debug_frame sections cached for unwinding.",
            self.unwind_cache_bytes.get(),
        );
        gauge(
            "kiln_agent_collector_stalled",
            "1 when the collector thread has made no progress for longer than its \
             stall threshold (/healthz then fails).",
            u64::from(self.collector_health(unix_ms()).is_err()),
        );
        gauge(
            "kiln_agent_python_code_cache_bytes",
            "Bytes of CPython code objects (names, files, line tables) cached.",
            self.python_code_cache_bytes.get(),
        );
        if let Some((rss, peak)) = rss {
            gauge(
                "kiln_agent_resident_memory_bytes",
                "Resident set size.",
                rss,
            );
            gauge(
                "kiln_agent_resident_memory_peak_bytes",
                "Peak resident set size.",
                peak,
            );
        }
        render_labelled(
            &mut out,
            "kiln_agent_dropped_total",
            "Samples or profiles lost, by reason.",
            "reason",
            &self.drops,
        );
        render_labelled(
            &mut out,
            "kiln_agent_unwind_total",
            "User stacks unwound from snapshots, by outcome (complete, truncated, \
             fallback_frame_pointer, no_unwind_info, no_user_stack, unwinder_fault).",
            "outcome",
            &self.unwind_outcomes,
        );
        render_labelled(
            &mut out,
            "kiln_agent_unwind_objects_total",
            "ELF objects whose unwind info was read, by result (loaded, or why it \
             falls back to frame pointers: too_large, malformed, no_unwind_info, ...).",
            "result",
            &self.unwind_objects,
        );
        render_labelled(
            &mut out,
            "kiln_agent_python_processes_total",
            "Processes mapping CPython, by result (supported, unsupported_version, \
             missing_symbol, bad_object): unsupported ones get native frames only.",
            "result",
            &self.python_processes,
        );
        render_labelled(
            &mut out,
            "kiln_agent_python_stacks_total",
            "Samples of CPython processes, by what was read of their Python frames \
             (complete, truncated, no_thread_state, not_registered_in_bpf).",
            "result",
            &self.python_stacks,
        );
        render_labelled(
            &mut out,
            "kiln_agent_python_code_reads_total",
            "CPython code objects read from process memory, by result (ok, unreadable, not_code).",
            "result",
            &self.python_code_reads,
        );
        render_labelled(
            &mut out,
            "kiln_agent_ship_errors_total",
            "Failed sends, by reason.",
            "reason",
            &self.ship_errors,
        );
        out
    }
}

fn add_to(map: &Mutex<BTreeMap<&'static str, u64>>, key: &'static str, n: u64) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry(key).or_insert(0) += n;
}

fn render_labelled(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    values: &Mutex<BTreeMap<&'static str, u64>>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    let values = values.lock().unwrap_or_else(|p| p.into_inner());
    for (key, value) in values.iter() {
        let _ = writeln!(out, "{name}{{{label}=\"{key}\"}} {value}");
    }
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

/// Connections served at once by [`serve_metrics`].
const METRICS_CONNECTIONS: usize = 32;

/// Reads into `buffer` until the request line has arrived (a client may
/// send it in several writes) or the buffer is full; returns the bytes read.
async fn read_request_line<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    buffer: &mut [u8],
) -> std::io::Result<usize> {
    use tokio::io::AsyncReadExt;
    let mut filled = 0;
    while filled < buffer.len() {
        let n = stream.read(&mut buffer[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
        if buffer[..filled].contains(&b'\n') {
            break;
        }
    }
    Ok(filled)
}

/// Serves `/metrics` and `/healthz` (the collector's liveness) until
/// `shutdown` fires. Tiny HTTP/1.1: one request per connection, other paths
/// get 404.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<AgentMetrics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::AsyncWriteExt;
    let connections = std::sync::Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        // A scraper or probe holds one connection at a time; anything past
        // the cap is closed at once, so no client can pile up tasks.
        let Ok(permit) = std::sync::Arc::clone(&connections).try_acquire_owned() else {
            continue;
        };
        let metrics = std::sync::Arc::clone(&metrics);
        tokio::spawn(async move {
            let _permit = permit;
            let mut buffer = [0u8; 2048];
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                read_request_line(&mut stream, &mut buffer),
            )
            .await;
            let Ok(Ok(n)) = read else {
                return;
            };
            let request = String::from_utf8_lossy(&buffer[..n]);
            let path = request.split_ascii_whitespace().nth(1).unwrap_or("");
            let response = if path == "/healthz" {
                match metrics.collector_health(unix_ms()) {
                    Ok(()) => {
                        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
                            .to_owned()
                    }
                    Err(age_ms) => {
                        let body =
                            format!("collector stalled: no progress for {} s\n", age_ms / 1000);
                        format!(
                            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    }
                }
            } else if path == "/metrics" {
                let rss = std::fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|s| parse_rss(&s));
                let body = metrics.render(rss);
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_owned()
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_line_sent_in_pieces_is_read_whole() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for piece in [&b"GET /hea"[..], b"lthz HTTP/1.1\r", b"\nHost: x\r\n\r\n"] {
                client.write_all(piece).await.expect("write");
                tokio::task::yield_now().await;
            }
            client
        });
        let mut buffer = [0u8; 2048];
        let n = read_request_line(&mut server, &mut buffer)
            .await
            .expect("read");
        let line = String::from_utf8_lossy(&buffer[..n]);
        assert!(line.starts_with("GET /healthz HTTP/1.1\r\n"), "{line}");
        drop(writer.await);
    }

    #[test]
    fn render_exposes_counters_drops_by_reason_and_rss() {
        let metrics = AgentMetrics::default();
        metrics.samples.add(42);
        metrics.add_drop("queue_full", 2);
        metrics.set_drop_total("stack_collision_user", 5);
        let text = metrics.render(Some((1024, 2048)));
        assert!(text.contains("kiln_agent_samples_total 42\n"));
        assert!(text.contains("kiln_agent_dropped_total{reason=\"queue_full\"} 2\n"));
        assert!(text.contains("kiln_agent_dropped_total{reason=\"stack_collision_user\"} 5\n"));
        assert!(text.contains("kiln_agent_resident_memory_bytes 1024\n"));
        assert_eq!(metrics.drops("queue_full"), 2);
    }

    #[test]
    fn a_collector_without_progress_past_its_threshold_is_unhealthy() {
        let metrics = AgentMetrics::default();
        assert_eq!(metrics.collector_health(1_000_000), Ok(()), "not started");
        metrics.collector_stall_after_ms.set(60_000);
        metrics.collector_progress_unix_ms.set(1_000_000);
        assert_eq!(metrics.collector_health(1_059_000), Ok(()));
        assert_eq!(metrics.collector_health(1_061_000), Err(61_000));
        assert!(
            metrics
                .render(None)
                .contains("kiln_agent_collector_stalled 1\n")
        );
        metrics.collector_progress_unix_ms.set(unix_ms());
        assert!(
            metrics
                .render(None)
                .contains("kiln_agent_collector_stalled 0\n")
        );
    }

    #[test]
    fn rss_is_parsed_from_proc_status() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_rss(status), Some((1024 * 1024, 2048 * 1024)));
        assert_eq!(parse_rss("Name: x\n"), None);
    }
}
