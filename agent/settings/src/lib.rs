//! The flags of `kiln-agent`, each with its `KILN_*` environment variable.
//!
//! A library of its own so that the operator renders the agent's command
//! line from the same type the agent parses, without building the agent
//! (which needs clang for its BPF program). [`AgentSettings`] derives clap
//! for the agent and `Serialize` for the operator's renderer: every value
//! serializes to text its flag parses back (durations as `10s` or `500ms`,
//! the unwinder as its flag value).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser};
use serde::{Serialize, Serializer};

/// Default of `--unwind-cache-bytes`.
pub const DEFAULT_UNWIND_CACHE_BYTES: u64 = 24 * 1024 * 1024;

/// Default of `--max-symbol-table-bytes`: about two million symbols, more
/// than the largest shared libraries of common distributions (libLLVM,
/// Chromium) and small enough that parsing them cannot take the agent's
/// memory.
pub const DEFAULT_MAX_SYMBOL_TABLE_BYTES: u64 = 64 << 20;

/// Kiln's node agent: samples on-CPU stacks with eBPF and ships pprof.
///
/// Choose what to profile (--pid, --all, --cgroup/--cgroup-id, or only
/// --scrape pprof endpoints) and where profiles go (--output-dir or --store).
#[derive(Debug, Clone, PartialEq, Eq, Parser, Serialize)]
#[command(name = "kiln-agent", version)]
#[command(group(ArgGroup::new("targets").required(true).multiple(true).args(["pid", "all", "cgroup", "cgroup_id", "cri_socket", "kubernetes", "scrape"])))]
#[command(group(ArgGroup::new("sink").required(true).args(["output_dir", "store"])))]
pub struct AgentSettings {
    /// Profile these processes (comma-separated PIDs).
    #[arg(long, env = "KILN_PID", value_delimiter = ',', conflicts_with_all = ["all", "cgroup", "cgroup_id"])]
    pub pid: Vec<u32>,
    /// Profile every process on the host.
    #[arg(long, env = "KILN_ALL", conflicts_with_all = ["cgroup", "cgroup_id"])]
    pub all: bool,
    /// Profile the processes in these cgroup v2 directories (absolute, or
    /// relative to the cgroup2 mount; comma-separated).
    #[arg(long, env = "KILN_CGROUP", value_delimiter = ',')]
    pub cgroup: Vec<PathBuf>,
    /// Profile the processes in these cgroups, by cgroup id (comma-separated).
    #[arg(long, env = "KILN_CGROUP_ID", value_delimiter = ',')]
    pub cgroup_id: Vec<u64>,
    /// Kubernetes mode: discover pods through the container runtime's CRI
    /// socket (default /run/containerd/containerd.sock) and profile those
    /// selected by annotation or the targets file.
    #[arg(long, env = "KILN_KUBERNETES", conflicts_with_all = ["pid", "all", "cgroup", "cgroup_id"])]
    pub kubernetes: bool,
    /// Kubernetes mode with this CRI runtime socket (implies --kubernetes).
    #[arg(long, env = "KILN_CRI_SOCKET", conflicts_with_all = ["pid", "all", "cgroup", "cgroup_id"])]
    pub cri_socket: Option<PathBuf>,
    /// Targets file written by the operator (Kubernetes mode); re-read when it changes.
    #[arg(long, env = "KILN_TARGETS_FILE")]
    pub targets_file: Option<PathBuf>,
    /// Pod label keys copied onto profiles as labels (Kubernetes mode; comma-separated).
    #[arg(long, env = "KILN_POD_LABELS", value_delimiter = ',')]
    pub pod_labels: Vec<String>,
    /// How often the runtime is listed when no container event arrives (Kubernetes mode).
    #[arg(long, env = "KILN_RESYNC_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub resync_interval: Duration,
    /// Write gzipped pprof files to this directory instead of shipping.
    #[arg(long, env = "KILN_OUTPUT_DIR")]
    pub output_dir: Option<PathBuf>,
    /// Ship profiles to this store with Parca's WriteRaw (e.g. http://127.0.0.1:7470).
    #[arg(long, env = "KILN_STORE")]
    pub store: Option<String>,
    /// The replicas of a store of several, each by its stable name
    /// (comma-separated, e.g. `http://kiln-0.kiln-headless.ns.svc:7470,...`):
    /// every upload and its retries go to the one this node's name picks,
    /// so a retry after a rolling restart reaches the replica that knows
    /// its idempotency keys; another only after that one failed for 3
    /// minutes. Unset: `--store` (the operator sets both).
    #[arg(
        long,
        env = "KILN_STORE_REPLICAS",
        value_delimiter = ',',
        requires = "store"
    )]
    pub store_replicas: Vec<String>,
    /// A file holding the store's write token, sent as a bearer token with
    /// every upload (a file, so the token never shows in /proc/*/cmdline).
    #[arg(long, env = "KILN_STORE_TOKEN_FILE", requires = "store")]
    pub store_token_file: Option<PathBuf>,
    /// Samples per second per CPU of every target that asks for no rate of
    /// its own. 19 is prime, so it does not alias with periodic work.
    #[arg(long, env = "KILN_FREQUENCY", default_value_t = 19, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub frequency: u32,
    /// The highest rate a target may ask for (a ProfilingTarget's
    /// `samplingHz`, a pod's `profiles.kiln.dev/sampling-hz`). Every CPU is
    /// sampled at the highest rate a current target asks for, within this,
    /// and each target keeps its own share; higher asks get this rate.
    #[arg(long, env = "KILN_MAX_FREQUENCY", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_frequency: u32,
    /// How often the kernel maps are drained into profiles (e.g. 10s, 500ms).
    #[arg(long, env = "KILN_DRAIN_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub drain_interval: Duration,
    /// Stop after this long (drains a final window first); runs until
    /// SIGTERM/SIGINT when absent.
    #[arg(long, env = "KILN_DURATION", value_parser = parse_duration)]
    #[serde(serialize_with = "optional_duration_text")]
    pub duration: Option<Duration>,
    /// Value of the `node` label; the host name when absent.
    #[arg(long, env = "KILN_NODE_NAME")]
    pub node_name: Option<String>,
    /// Label samples with the thread id (`tid`); more keys, bigger profiles.
    #[arg(long, env = "KILN_RECORD_TID")]
    pub record_tid: bool,
    /// Address of the Prometheus `/metrics` endpoint; `off` disables it.
    #[arg(long, env = "KILN_METRICS_ADDR", default_value = "127.0.0.1:7471")]
    pub metrics_addr: String,
    /// Kernel BTF used to relocate the BPF program.
    #[arg(long, env = "KILN_BTF_PATH", default_value = "/sys/kernel/btf/vmlinux")]
    pub btf_path: PathBuf,
    /// Entries in each of the two stack maps (kernel memory: about 1 KiB each).
    #[arg(long, env = "KILN_STACK_MAP_ENTRIES", default_value_t = 8192)]
    pub stack_map_entries: u32,
    /// Entries in each of the two aggregation maps.
    #[arg(long, env = "KILN_COUNT_MAP_ENTRIES", default_value_t = 16384)]
    pub count_map_entries: u32,
    /// Profiles held while the store is unreachable; the oldest are dropped beyond it.
    #[arg(long, env = "KILN_QUEUE_CAPACITY", default_value_t = 256)]
    pub queue_capacity: usize,
    /// Process snapshots kept for symbolizing exited processes.
    #[arg(long, env = "KILN_MAX_CACHED_PROCESSES", default_value_t = 4096)]
    pub max_cached_processes: usize,
    /// Mapped ELF files the agent holds open at once, for unwinding and
    /// symbolization (shared by file identity); files past it stay closed
    /// and their frames unsymbolized. Needs as many descriptors.
    #[arg(long, env = "KILN_MAX_OPEN_FILES", default_value_t = 4096)]
    pub max_open_files: usize,
    /// ELF objects whose symbol tables (with their strings) hold more bytes
    /// than this keep their frames unsymbolized (address, mapping and build
    /// id go to the store) rather than being parsed.
    #[arg(long, env = "KILN_MAX_SYMBOL_TABLE_BYTES", default_value_t = DEFAULT_MAX_SYMBOL_TABLE_BYTES)]
    pub max_symbol_table_bytes: u64,
    /// Symbol names cached, keyed by (build id, file offset).
    #[arg(long, env = "KILN_MAX_CACHED_SYMBOLS", default_value_t = 200_000)]
    pub max_cached_symbols: usize,
    /// How user stacks are walked: `eh-frame` copies each sample's registers
    /// and top 16 KiB of stack and unwinds them with the objects' .eh_frame
    /// (frame pointers where there is none, e.g. JIT code); `frame-pointer`
    /// walks frame pointers in the kernel only (cheaper, but flat stacks for
    /// code built without frame pointers).
    #[arg(long, env = "KILN_UNWINDER", value_enum, default_value_t = UnwinderChoice::EhFrame)]
    pub unwinder: UnwinderChoice,
    /// Bytes of unwind sections (.eh_frame, .eh_frame_hdr, .debug_frame)
    /// and Go function tables cached across all binaries (eh-frame
    /// unwinder). 24 MiB holds rustc's and LLVM's (16 MiB) beside a few
    /// services' and keeps the agent within 64 MiB.
    #[arg(long, env = "KILN_UNWIND_CACHE_BYTES", default_value_t = DEFAULT_UNWIND_CACHE_BYTES)]
    pub unwind_cache_bytes: u64,
    /// Binaries with more unwind section bytes than this are unwound by
    /// frame pointer instead (counted in kiln_agent_unwind_objects_total).
    #[arg(long, env = "KILN_UNWIND_MAX_OBJECT_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub unwind_max_object_bytes: u64,
    /// Size of the kernel ring buffer for stack snapshots; by default half a
    /// second of samples on every CPU (between 1 and 64 MiB).
    #[arg(long, env = "KILN_SNAPSHOT_RING_BYTES")]
    pub snapshot_ring_bytes: Option<u32>,
    /// Python functions in CPython 3.9 and later (eh-frame unwinder): read
    /// from the interpreter's thread state at sample time.
    #[arg(long, env = "KILN_PYTHON_FRAMES", default_value_t = true, action = clap::ArgAction::Set)]
    pub python_frames: bool,
    /// Ruby methods in CRuby (eh-frame unwinder): read from the VM's control
    /// frames at sample time.
    #[arg(long, env = "KILN_RUBY_FRAMES", default_value_t = true, action = clap::ArgAction::Set)]
    pub ruby_frames: bool,
    /// Java methods in HotSpot JVMs started without flags (eh-frame
    /// unwinder): from the tables `libjvm.so` exports.
    #[arg(long, env = "KILN_JAVA_FRAMES", default_value_t = true, action = clap::ArgAction::Set)]
    pub java_frames: bool,
    /// JavaScript functions in Node without flags (eh-frame unwinder): from
    /// V8's `v8dbg_*` constants and the live heap.
    #[arg(long, env = "KILN_JAVASCRIPT_FRAMES", default_value_t = true, action = clap::ArgAction::Set)]
    pub javascript_frames: bool,
    /// Record off-CPU time (eh-frame unwinder): where targeted threads
    /// blocked (sleeps, locks, IO) and for how long, as a profile type of
    /// its own (`off_cpu`). Off by default: it hooks every context switch
    /// and wakeup on the node (a few tens of ns each, for every process)
    /// and holds about 10 MiB of kernel memory.
    #[arg(long, env = "KILN_OFF_CPU")]
    pub off_cpu: bool,
    /// Off-CPU blocks shorter than this are not recorded.
    #[arg(long, env = "KILN_OFF_CPU_MIN_BLOCK", default_value = "1ms", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub off_cpu_min_block: Duration,
    /// Most off-CPU blocks captured per CPU per second, whatever the
    /// context-switch rate; past half of it one block in N is captured and
    /// weighed N times.
    #[arg(long, env = "KILN_OFF_CPU_CAPTURES_PER_SECOND", default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=10_000))]
    pub off_cpu_captures_per_second: u32,
    /// Bytes of CPython code objects (names, file names, line tables) cached.
    #[arg(long, env = "KILN_PYTHON_CODE_CACHE_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub python_code_cache_bytes: usize,
    /// Scrape the pprof endpoints under these base URLs (comma-separated,
    /// e.g. http://127.0.0.1:6060/debug/pprof): heap, allocs, goroutine,
    /// mutex and block, each on the scrape interval. Plain http:// only;
    /// redirects are never followed. Alone (no --pid/--all/--cgroup), the
    /// agent only scrapes, and needs no privileges.
    #[arg(long, env = "KILN_SCRAPE", value_delimiter = ',')]
    pub scrape: Vec<String>,
    /// Between two scrapes of one profile of a --scrape endpoint.
    #[arg(long, env = "KILN_SCRAPE_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub scrape_interval: Duration,
    /// Longest one scrape may take, connection to last byte.
    #[arg(long, env = "KILN_SCRAPE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "duration_text")]
    pub scrape_timeout: Duration,
    /// `service_name` of --scrape profiles; by default `host:port` of each URL.
    #[arg(long, env = "KILN_SCRAPE_SERVICE_NAME")]
    pub scrape_service_name: Option<String>,
    /// Log filter, e.g. `info` or `kiln_agent=debug` (as for every Kiln
    /// binary). Without it, `RUST_LOG` is read, else `kiln_agent=info`.
    #[arg(long, env = "KILN_LOG")]
    pub log: Option<String>,
}

/// `--unwinder` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnwinderChoice {
    /// .eh_frame/.debug_frame in userspace, frame pointers as fallback.
    EhFrame,
    /// Frame pointers only, in the kernel.
    FramePointer,
}

/// A duration in Kiln's one grammar (docs/durations.md), within the 1 ms to
/// 24 h every interval of the agent must lie in.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = kiln_contract::duration::parse_duration(text).map_err(|err| err.to_string())?;
    if !(Duration::from_millis(1)..=Duration::from_secs(86_400)).contains(&duration) {
        return Err(format!("{text:?} is out of range (1ms to 24h)"));
    }
    Ok(duration)
}

/// A duration as its flag takes it, exactly, in the largest unit that keeps
/// it whole: `10s`, `500ms`, `1500us`, `7ns`.
pub fn duration_flag_text(duration: &Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else if duration.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", duration.as_millis())
    } else if duration.subsec_nanos().is_multiple_of(1_000) {
        format!("{}us", duration.as_micros())
    } else {
        format!("{}ns", duration.as_nanos())
    }
}

fn duration_text<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&duration_flag_text(duration))
}

fn optional_duration_text<S: Serializer>(
    duration: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => serializer.serialize_str(&duration_flag_text(duration)),
        None => serializer.serialize_none(),
    }
}

impl Default for AgentSettings {
    /// Every flag at the default its `#[arg]` declares (checked by a test),
    /// with no target and no sink chosen: the agent refuses to start from
    /// this alone, the operator fills both in.
    fn default() -> Self {
        Self {
            pid: Vec::new(),
            all: false,
            cgroup: Vec::new(),
            cgroup_id: Vec::new(),
            kubernetes: false,
            cri_socket: None,
            targets_file: None,
            pod_labels: Vec::new(),
            resync_interval: Duration::from_secs(2),
            output_dir: None,
            store: None,
            store_replicas: Vec::new(),
            store_token_file: None,
            frequency: 19,
            max_frequency: 100,
            drain_interval: Duration::from_secs(10),
            duration: None,
            node_name: None,
            record_tid: false,
            metrics_addr: "127.0.0.1:7471".to_owned(),
            btf_path: PathBuf::from("/sys/kernel/btf/vmlinux"),
            stack_map_entries: 8192,
            count_map_entries: 16384,
            queue_capacity: 256,
            max_cached_processes: 4096,
            max_open_files: 4096,
            max_symbol_table_bytes: DEFAULT_MAX_SYMBOL_TABLE_BYTES,
            max_cached_symbols: 200_000,
            unwinder: UnwinderChoice::EhFrame,
            unwind_cache_bytes: DEFAULT_UNWIND_CACHE_BYTES,
            unwind_max_object_bytes: 16 * 1024 * 1024,
            snapshot_ring_bytes: None,
            python_frames: true,
            ruby_frames: true,
            java_frames: true,
            javascript_frames: true,
            off_cpu: false,
            off_cpu_min_block: Duration::from_millis(1),
            off_cpu_captures_per_second: 200,
            python_code_cache_bytes: 8 * 1024 * 1024,
            scrape: Vec::new(),
            scrape_interval: Duration::from_secs(15),
            scrape_timeout: Duration::from_secs(10),
            scrape_service_name: None,
            log: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        AgentSettings::command().debug_assert();
    }

    #[test]
    fn every_flag_reads_a_kiln_environment_variable() {
        for arg in AgentSettings::command().get_arguments() {
            if matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert!(
                env.as_deref().is_some_and(|e| e.starts_with("KILN_")),
                "--{} has no KILN_ environment variable",
                arg.get_id()
            );
        }
    }

    #[test]
    fn durations_accept_common_units_and_reject_garbage() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("25h").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("999us").is_err());
    }

    #[test]
    fn duration_text_parses_back() {
        for text in ["10s", "500ms", "1500ms", "86400s", "1500us", "1000001ns"] {
            let duration = parse_duration(text).unwrap();
            assert_eq!(duration_flag_text(&duration), text);
            assert_eq!(parse_duration(&duration_flag_text(&duration)), Ok(duration));
        }
    }

    #[test]
    fn a_target_and_a_sink_are_required() {
        assert!(AgentSettings::try_parse_from(["kiln-agent", "--all"]).is_err());
        assert!(AgentSettings::try_parse_from(["kiln-agent", "--output-dir", "/tmp"]).is_err());
        assert!(
            AgentSettings::try_parse_from([
                "kiln-agent",
                "--all",
                "--pid",
                "1",
                "--output-dir",
                "/tmp"
            ])
            .is_err()
        );
        let cli =
            AgentSettings::try_parse_from(["kiln-agent", "--pid", "1,2", "--output-dir", "/tmp"])
                .expect("valid");
        assert_eq!(cli.pid, vec![1, 2]);
        assert_eq!(cli.frequency, 19);
        let scrape_only = AgentSettings::try_parse_from([
            "kiln-agent",
            "--scrape",
            "http://127.0.0.1:6060/debug/pprof,http://127.0.0.1:6061/debug/pprof",
            "--store",
            "http://127.0.0.1:7470",
        ])
        .expect("scraping alone is a target");
        assert_eq!(scrape_only.scrape.len(), 2);
    }

    #[test]
    fn default_matches_the_declared_flag_defaults() {
        let parsed = AgentSettings::try_parse_from(["kiln-agent", "--all", "--output-dir", "/out"])
            .expect("valid");
        let expected = AgentSettings {
            all: true,
            output_dir: Some(PathBuf::from("/out")),
            ..AgentSettings::default()
        };
        assert_eq!(parsed, expected);
    }
}
