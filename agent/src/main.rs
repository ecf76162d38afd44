//! `kiln-agent`: the node agent binary. Parses flags, checks privileges,
//! starts the sampler, the collector thread, the shipper and `/metrics`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgGroup, Parser};

use kiln_agent::abi::UnwindMode;
use kiln_agent::cli_targets::StaticTargets;
use kiln_agent::collector::{Collector, CollectorConfig, CollectorParts};
use kiln_agent::kallsyms::KernelSymbols;
use kiln_agent::kubernetes::{AgentTargets, KubernetesConfig, KubernetesTargets, run_discovery};
use kiln_agent::metrics::{AgentMetrics, serve_metrics};
use kiln_agent::preflight;
use kiln_agent::process_info::ProcessTable;
use kiln_agent::python::{PythonUnwinder, PythonUnwinderConfig};
use kiln_agent::sampler::{Sampler, SamplerConfig};
use kiln_agent::ship::{ShipQueue, Sink, StoreToken, run_shipper};
use kiln_agent::symbolize::StackSymbolizer;
use kiln_agent::target_set::TargetSource;
use kiln_agent::unwind::{StackUnwinder, StackUnwinderConfig};
use kiln_agent::unwind_info::UnwindInfoLimits;

/// Kiln's node agent: samples on-CPU stacks with eBPF and ships pprof.
///
/// Choose what to profile (--pid, --all, --cgroup/--cgroup-id) and where
/// profiles go (--output-dir or --store).
#[derive(Debug, Parser)]
#[command(name = "kiln-agent", version)]
#[command(group(ArgGroup::new("targets").required(true).multiple(true).args(["pid", "all", "cgroup", "cgroup_id", "cri_socket", "kubernetes"])))]
#[command(group(ArgGroup::new("sink").required(true).args(["output_dir", "store"])))]
struct Cli {
    /// Profile these processes (comma-separated PIDs).
    #[arg(long, env = "KILN_PID", value_delimiter = ',', conflicts_with_all = ["all", "cgroup", "cgroup_id"])]
    pid: Vec<u32>,
    /// Profile every process on the host.
    #[arg(long, env = "KILN_ALL", conflicts_with_all = ["cgroup", "cgroup_id"])]
    all: bool,
    /// Profile the processes in these cgroup v2 directories (absolute, or
    /// relative to the cgroup2 mount; comma-separated).
    #[arg(long, env = "KILN_CGROUP", value_delimiter = ',')]
    cgroup: Vec<PathBuf>,
    /// Profile the processes in these cgroups, by cgroup id (comma-separated).
    #[arg(long, env = "KILN_CGROUP_ID", value_delimiter = ',')]
    cgroup_id: Vec<u64>,
    /// Kubernetes mode: discover pods through the container runtime's CRI
    /// socket (default /run/containerd/containerd.sock) and profile those
    /// selected by annotation or the targets file.
    #[arg(long, env = "KILN_KUBERNETES", conflicts_with_all = ["pid", "all", "cgroup", "cgroup_id"])]
    kubernetes: bool,
    /// Kubernetes mode with this CRI runtime socket (implies --kubernetes).
    #[arg(long, env = "KILN_CRI_SOCKET", conflicts_with_all = ["pid", "all", "cgroup", "cgroup_id"])]
    cri_socket: Option<PathBuf>,
    /// Targets file written by the operator (Kubernetes mode); re-read when it changes.
    #[arg(long, env = "KILN_TARGETS_FILE")]
    targets_file: Option<PathBuf>,
    /// Pod label keys copied onto profiles as labels (Kubernetes mode; comma-separated).
    #[arg(long, env = "KILN_POD_LABELS", value_delimiter = ',')]
    pod_labels: Vec<String>,
    /// How often the runtime is listed when no container event arrives (Kubernetes mode).
    #[arg(long, env = "KILN_RESYNC_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    resync_interval: Duration,
    /// Write gzipped pprof files to this directory instead of shipping.
    #[arg(long, env = "KILN_OUTPUT_DIR")]
    output_dir: Option<PathBuf>,
    /// Ship profiles to this store with Parca's WriteRaw (e.g. http://127.0.0.1:7470).
    #[arg(long, env = "KILN_STORE")]
    store: Option<String>,
    /// A file holding the store's write token, sent as a bearer token with
    /// every upload (a file, so the token never shows in /proc/*/cmdline).
    #[arg(long, env = "KILN_STORE_TOKEN_FILE", requires = "store")]
    store_token_file: Option<PathBuf>,
    /// Samples per second per CPU. 19 is prime, so it does not alias with
    /// periodic work.
    #[arg(long, env = "KILN_FREQUENCY", default_value_t = 19, value_parser = clap::value_parser!(u32).range(1..=1000))]
    frequency: u32,
    /// How often the kernel maps are drained into profiles (e.g. 10s, 500ms).
    #[arg(long, env = "KILN_DRAIN_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    drain_interval: Duration,
    /// Stop after this long (drains a final window first); runs until
    /// SIGTERM/SIGINT when absent.
    #[arg(long, env = "KILN_DURATION", value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Value of the `node` label; the host name when absent.
    #[arg(long, env = "KILN_NODE_NAME")]
    node_name: Option<String>,
    /// Label samples with the thread id (`tid`); more keys, bigger profiles.
    #[arg(long, env = "KILN_RECORD_TID")]
    record_tid: bool,
    /// Address of the Prometheus `/metrics` endpoint; `off` disables it.
    #[arg(long, env = "KILN_METRICS_ADDR", default_value = "127.0.0.1:7471")]
    metrics_addr: String,
    /// Kernel BTF used to relocate the BPF program.
    #[arg(long, env = "KILN_BTF_PATH", default_value = "/sys/kernel/btf/vmlinux")]
    btf_path: PathBuf,
    /// Entries in each of the two stack maps (kernel memory: about 1 KiB each).
    #[arg(long, env = "KILN_STACK_MAP_ENTRIES", default_value_t = 8192)]
    stack_map_entries: u32,
    /// Entries in each of the two aggregation maps.
    #[arg(long, env = "KILN_COUNT_MAP_ENTRIES", default_value_t = 16384)]
    count_map_entries: u32,
    /// Profiles held while the store is unreachable; the oldest are dropped beyond it.
    #[arg(long, env = "KILN_QUEUE_CAPACITY", default_value_t = 256)]
    queue_capacity: usize,
    /// Process snapshots kept for symbolizing exited processes.
    #[arg(long, env = "KILN_MAX_CACHED_PROCESSES", default_value_t = 4096)]
    max_cached_processes: usize,
    /// Mapped ELF files the agent holds open at once, for unwinding and
    /// symbolization (shared by file identity); files past it stay closed
    /// and their frames unsymbolized. Needs as many descriptors.
    #[arg(long, env = "KILN_MAX_OPEN_FILES", default_value_t = 4096)]
    max_open_files: usize,
    /// ELF objects whose symbol tables (with their strings) hold more bytes
    /// than this keep their frames unsymbolized (address, mapping and build
    /// id go to the store) rather than being parsed.
    #[arg(long, env = "KILN_MAX_SYMBOL_TABLE_BYTES", default_value_t = kiln_agent::symbolize::DEFAULT_MAX_SYMBOL_TABLE_BYTES)]
    max_symbol_table_bytes: u64,
    /// Symbol names cached, keyed by (build id, file offset).
    #[arg(long, env = "KILN_MAX_CACHED_SYMBOLS", default_value_t = 200_000)]
    max_cached_symbols: usize,
    /// How user stacks are walked: `eh-frame` copies each sample's registers
    /// and top 16 KiB of stack and unwinds them with the objects' .eh_frame
    /// (frame pointers where there is none, e.g. JIT code); `frame-pointer`
    /// walks frame pointers in the kernel only (cheaper, but flat stacks for
    /// code built without frame pointers).
    #[arg(long, env = "KILN_UNWINDER", value_enum, default_value_t = UnwinderChoice::EhFrame)]
    unwinder: UnwinderChoice,
    /// Bytes of unwind sections (.eh_frame, .eh_frame_hdr, .debug_frame)
    /// cached across all binaries (eh-frame unwinder).
    #[arg(long, env = "KILN_UNWIND_CACHE_BYTES", default_value_t = 32 * 1024 * 1024)]
    unwind_cache_bytes: u64,
    /// Binaries with more unwind section bytes than this are unwound by
    /// frame pointer instead (counted in kiln_agent_unwind_objects_total).
    #[arg(long, env = "KILN_UNWIND_MAX_OBJECT_BYTES", default_value_t = 16 * 1024 * 1024)]
    unwind_max_object_bytes: u64,
    /// Size of the kernel ring buffer for stack snapshots; by default half a
    /// second of samples on every CPU (between 1 and 64 MiB).
    #[arg(long, env = "KILN_SNAPSHOT_RING_BYTES")]
    snapshot_ring_bytes: Option<u32>,
    /// Python functions in CPython 3.9-3.13 processes (eh-frame unwinder):
    /// read from the interpreter's thread state at sample time.
    #[arg(long, env = "KILN_PYTHON_FRAMES", default_value_t = true, action = clap::ArgAction::Set)]
    python_frames: bool,
    /// Bytes of CPython code objects (names, file names, line tables) cached.
    #[arg(long, env = "KILN_PYTHON_CODE_CACHE_BYTES", default_value_t = 8 * 1024 * 1024)]
    python_code_cache_bytes: usize,
}

/// `--unwinder` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum UnwinderChoice {
    /// .eh_frame/.debug_frame in userspace, frame pointers as fallback.
    EhFrame,
    /// Frame pointers only, in the kernel.
    FramePointer,
}

/// Half a second of snapshots from every CPU, so the collector's 100 ms
/// polls and a slow drain never overflow it at the configured frequency.
fn default_snapshot_ring_bytes(frequency_hz: u32) -> u32 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let per_second = cpus * u64::from(frequency_hz) * kiln_agent::abi::STACK_SNAPSHOT_SIZE as u64;
    u32::try_from((per_second / 2).clamp(1 << 20, 64 << 20)).unwrap_or(64 << 20)
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 10s or 500ms"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?} in {text:?}: use ms, s or m")),
    };
    if !(0.001..=86_400.0).contains(&seconds) {
        return Err(format!("{text:?} is out of range (1ms to 24h)"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("kiln_agent=info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kiln-agent: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let checked = preflight::run(&cli.btf_path, cli.unwinder == UnwinderChoice::EhFrame)?;
    for degradation in preflight::degradations(checked.capabilities, checked.kernel) {
        tracing::warn!(kernel = %checked.kernel, "{degradation}");
    }
    raise_resource_limits();

    let kubernetes_targets = KubernetesTargets::default();
    let mut source = if cli.kubernetes || cli.cri_socket.is_some() {
        AgentTargets::Kubernetes(kubernetes_targets.clone())
    } else if cli.all {
        AgentTargets::Static(StaticTargets::All)
    } else if !cli.pid.is_empty() {
        AgentTargets::Static(StaticTargets::Pids(cli.pid.clone()))
    } else {
        AgentTargets::Static(StaticTargets::Cgroups {
            paths: cli.cgroup.clone(),
            ids: cli.cgroup_id.clone(),
        })
    };
    let targets = source.current_targets().context("resolving the targets")?;
    let sink = match (&cli.output_dir, &cli.store) {
        (Some(dir), _) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Sink::Directory(dir.clone())
        }
        (None, Some(endpoint)) => Sink::Store {
            endpoint: endpoint.clone(),
            token: cli
                .store_token_file
                .as_deref()
                .map(StoreToken::from_file)
                .transpose()?,
        },
        (None, None) => anyhow::bail!("give --output-dir or --store"),
    };
    let node = cli.node_name.clone().unwrap_or_else(host_name);

    let unwind = match cli.unwinder {
        UnwinderChoice::EhFrame => UnwindMode::StackSnapshot,
        UnwinderChoice::FramePointer => UnwindMode::FramePointer,
    };
    // The in-kernel stack and count maps serve the frame-pointer mode only.
    let (stack_map_entries, count_map_entries) = match unwind {
        UnwindMode::FramePointer => (cli.stack_map_entries, cli.count_map_entries),
        UnwindMode::StackSnapshot => (64, 64),
    };
    // Read before sampling starts: samples taken before the collector runs
    // miss what it sets up per process (Python frames), so it starts soon.
    let kernel_symbols = std::fs::File::open("/proc/kallsyms")
        .map(std::io::BufReader::new)
        .and_then(KernelSymbols::read)
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot read /proc/kallsyms; kernel frames stay unsymbolized");
            KernelSymbols::default()
        });
    if kernel_symbols.is_empty() {
        tracing::warn!(
            "kallsyms addresses are hidden (kptr_restrict); kernel frames stay unsymbolized"
        );
    }
    let sampler = Sampler::start(
        SamplerConfig {
            frequency_hz: cli.frequency,
            stack_map_entries,
            count_map_entries,
            record_tid: cli.record_tid,
            unwind,
            snapshot_ring_bytes: cli
                .snapshot_ring_bytes
                .unwrap_or_else(|| default_snapshot_ring_bytes(cli.frequency)),
            btf_path: cli.btf_path.clone(),
        },
        &targets,
    )?;
    tracing::info!(
        cpus = sampler.attached_cpu_count(),
        frequency_hz = cli.frequency,
        mode = ?targets.filter_mode(),
        unwinder = ?cli.unwinder,
        "sampling"
    );
    let unwinder = (unwind == UnwindMode::StackSnapshot).then(|| {
        StackUnwinder::new(StackUnwinderConfig {
            limits: UnwindInfoLimits {
                max_bytes_per_object: cli.unwind_max_object_bytes,
                ..UnwindInfoLimits::default()
            },
            cache_bytes: cli.unwind_cache_bytes,
            ..StackUnwinderConfig::default()
        })
    });
    let python = (unwind == UnwindMode::StackSnapshot && cli.python_frames).then(|| {
        PythonUnwinder::new(PythonUnwinderConfig {
            code_cache_bytes: cli.python_code_cache_bytes,
            ..PythonUnwinderConfig::default()
        })
    });
    release_startup_memory();

    let metrics = Arc::new(AgentMetrics::default());
    // Stalled: no trip round the collector's 100 ms loop for three drain
    // intervals (at least a minute), which no normal drain takes.
    let stall_after = (cli.drain_interval * 3).max(Duration::from_secs(60));
    metrics
        .collector_stall_after_ms
        .set(u64::try_from(stall_after.as_millis()).unwrap_or(u64::MAX));
    let queue = ShipQueue::new(cli.queue_capacity, Arc::clone(&metrics));
    let kubernetes_config =
        matches!(source, AgentTargets::Kubernetes(_)).then(|| KubernetesConfig {
            socket: cli
                .cri_socket
                .clone()
                .unwrap_or_else(|| PathBuf::from(kiln_cri::DEFAULT_CRI_SOCKET)),
            node: node.clone(),
            targets_file: cli.targets_file.clone(),
            copied_pod_labels: cli.pod_labels.clone(),
            resync_interval: cli.resync_interval,
        });
    let collector_config = CollectorConfig {
        frequency_hz: cli.frequency,
        drain_interval: cli.drain_interval,
        target_refresh_interval: Duration::from_secs(2),
        node,
        record_tid: cli.record_tid,
        unwound_stacks_capacity: usize::try_from(cli.count_map_entries).unwrap_or(usize::MAX),
    };
    let max_cached_symbols = cli.max_cached_symbols;
    let max_symbol_table_bytes = cli.max_symbol_table_bytes;
    let processes = ProcessTable::new(
        cli.max_cached_processes,
        open_file_budget(cli.max_open_files),
    );
    let collector_queue = queue.clone();
    let collector_metrics = Arc::clone(&metrics);
    let stop = Arc::new(AtomicBool::new(false));
    let collector_stop = Arc::clone(&stop);
    // The symbolizer is not Send, so it is created on the collector thread.
    let collector = std::thread::Builder::new()
        .name("kiln-collector".to_owned())
        .spawn(move || {
            let mut symbolizer = StackSymbolizer::new(kernel_symbols, max_cached_symbols);
            symbolizer.set_max_symbol_table_bytes(max_symbol_table_bytes);
            let parts = CollectorParts {
                sampler,
                source,
                targets,
                processes,
                symbolizer,
                queue: collector_queue,
                metrics: collector_metrics,
                unwinder,
                python,
            };
            Collector::new(collector_config, parts).run(&collector_stop);
        })
        .context("starting the collector thread")?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        if cli.metrics_addr != "off" {
            let listener = tokio::net::TcpListener::bind(&cli.metrics_addr)
                .await
                .with_context(|| format!("binding /metrics to {}", cli.metrics_addr))?;
            if let Ok(address) = listener.local_addr() {
                tracing::info!(%address, "serving /metrics");
            }
            tokio::spawn(serve_metrics(
                listener,
                Arc::clone(&metrics),
                shutdown_rx.clone(),
            ));
        }
        if let Some(config) = kubernetes_config {
            tokio::spawn(run_discovery(
                config,
                kubernetes_targets,
                shutdown_rx.clone(),
            ));
        }
        let shipper = tokio::spawn(run_shipper(sink, queue, Arc::clone(&metrics), shutdown_rx));
        wait_for_stop(cli.duration).await;
        tracing::info!("stopping: draining the last window");
        stop.store(true, Ordering::Relaxed);
        let joined = tokio::task::spawn_blocking(move || collector.join()).await;
        if !matches!(joined, Ok(Ok(()))) {
            tracing::error!("the collector thread panicked");
        }
        let _ = shutdown_tx.send(true);
        if tokio::time::timeout(Duration::from_secs(15), shipper)
            .await
            .is_err()
        {
            tracing::warn!("gave up shipping the last profiles after 15 s");
        }
        Ok(())
    })
}

async fn wait_for_stop(duration: Option<Duration>) {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let sigterm = async {
        match terminate.as_mut() {
            Some(signal) => {
                signal.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    let deadline = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = sigterm => {}
        () = deadline => {}
    }
}

/// Open ELF files are kept for symbolization, and kernels before 5.11
/// charge BPF maps to RLIMIT_MEMLOCK: raise both soft limits to the hard ones.
fn raise_resource_limits() {
    for resource in [libc::RLIMIT_NOFILE, libc::RLIMIT_MEMLOCK] {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the rlimit we own.
        if unsafe { libc::getrlimit(resource, &mut limit) } == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            // SAFETY: setrlimit only reads the rlimit we pass.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                tracing::debug!(resource, "cannot raise resource limit");
            }
        }
    }
}

/// `--max-open-files`, lowered to leave 256 descriptors of the (raised)
/// RLIMIT_NOFILE for everything else (BPF objects, sockets, /proc reads).
fn open_file_budget(wanted: usize) -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return wanted;
    }
    let available = usize::try_from(limit.rlim_cur)
        .unwrap_or(usize::MAX)
        .saturating_sub(256)
        .max(16);
    if available < wanted {
        tracing::warn!(
            wanted,
            available,
            "RLIMIT_NOFILE is low: holding fewer mapped files open"
        );
    }
    wanted.min(available)
}

/// Parsing the kernel's BTF for CO-RE and reading kallsyms allocate tens of
/// MB that are freed right after; hand those pages back so the steady-state
/// RSS reflects what the agent keeps.
fn release_startup_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_accept_common_units_and_reject_garbage() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn a_target_and_a_sink_are_required() {
        assert!(Cli::try_parse_from(["kiln-agent", "--all"]).is_err());
        assert!(Cli::try_parse_from(["kiln-agent", "--output-dir", "/tmp"]).is_err());
        assert!(
            Cli::try_parse_from(["kiln-agent", "--all", "--pid", "1", "--output-dir", "/tmp"])
                .is_err()
        );
        let cli = Cli::try_parse_from(["kiln-agent", "--pid", "1,2", "--output-dir", "/tmp"])
            .expect("valid");
        assert_eq!(cli.pid, vec![1, 2]);
        assert_eq!(cli.frequency, 19);
    }
}
