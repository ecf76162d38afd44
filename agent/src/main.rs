//! `kiln-agent`: the node agent binary. Parses flags, checks privileges,
//! starts the sampler, the collector thread, the shipper and `/metrics`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;

use kiln_agent::abi::UnwindMode;
use kiln_agent::cli_targets::StaticTargets;
use kiln_agent::collector::{Collector, CollectorConfig, CollectorParts, RuntimeReaders};
use kiln_agent::cri_discovery::{AgentTargets, KubernetesConfig, KubernetesTargets, run_discovery};
use kiln_agent::kallsyms::KernelSymbols;
use kiln_agent::metrics::{AgentMetrics, MetricsThread, spawn_metrics_thread};
use kiln_agent::preflight;
use kiln_agent::process_info::ProcessTable;
use kiln_agent::python::{PythonUnwinder, PythonUnwinderConfig};
use kiln_agent::sampler::{OffCpuConfig, Sampler, SamplerConfig};
use kiln_agent::scrape::{ScrapeConfig, ScrapeEndpoint, run_scraper};
use kiln_agent::ship::{ReplicaChoice, ShipQueue, Sink, StoreToken, run_shipper};
use kiln_agent::symbolize::StackSymbolizer;
use kiln_agent::target_set::{SamplingRates, TargetSource};
use kiln_agent::unwind::{StackUnwinder, StackUnwinderConfig};
use kiln_agent::unwind_info::UnwindInfoLimits;
use kiln_agent_settings::{AgentSettings, UnwinderChoice};

/// Half a second of snapshots from every CPU at the default rate, and a
/// fifth of one at the highest, so the collector's 100 ms polls and a slow
/// drain never overflow it.
fn default_snapshot_ring_bytes(rates: SamplingRates, off_cpu_per_second: u32) -> u32 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    // Off-CPU blocks arrive at up to their capture budget, like samples.
    let per_second = |hz: u32| {
        cpus * u64::from(hz.saturating_add(off_cpu_per_second))
            * kiln_agent::abi::STACK_SNAPSHOT_SIZE as u64
    };
    let bytes = (per_second(rates.default_hz) / 2).max(per_second(rates.max_hz) / 5);
    u32::try_from(bytes.clamp(1 << 20, 64 << 20)).unwrap_or(64 << 20)
}

/// Captured threads asleep at once (one 19 KiB snapshot each, about 10 MiB
/// of kernel memory): past it the longest asleep is evicted and its block
/// lost. Blocked threads are captured at most a few hundred per CPU per
/// second, and most wake within the second.
const OFF_CPU_PENDING_ENTRIES: u32 = 512;

/// The log filter when neither `--log`/`KILN_LOG` nor `RUST_LOG` is set.
const DEFAULT_LOG: &str = "kiln_agent=info";

/// `--log`/`KILN_LOG`, else `RUST_LOG` (what the agent read before it had
/// `--log`), else [`DEFAULT_LOG`].
fn log_filter(flag: Option<&str>) -> Result<tracing_subscriber::EnvFilter, String> {
    use tracing_subscriber::EnvFilter;
    match flag {
        Some(filter) => EnvFilter::try_new(filter)
            .map_err(|error| format!("invalid --log filter {filter:?}: {error}")),
        None => {
            Ok(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG)))
        }
    }
}

fn main() -> ExitCode {
    let cli = AgentSettings::parse();
    let filter = match log_filter(cli.log.as_deref()) {
        Ok(filter) => filter,
        Err(message) => {
            eprintln!("kiln-agent: {message}");
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
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

fn run(cli: AgentSettings) -> anyhow::Result<()> {
    let profiles_cpu = cli.all
        || !cli.pid.is_empty()
        || !cli.cgroup.is_empty()
        || !cli.cgroup_id.is_empty()
        || cli.kubernetes
        || cli.cri_socket.is_some();
    if !profiles_cpu {
        return run_scrape_only(cli);
    }
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
    let sink = sink(&cli)?;
    let node = cli.node_name.clone().unwrap_or_else(host_name);
    // Kubernetes mode scrapes the pods discovery publishes; otherwise --scrape.
    let scrape_endpoints = if matches!(source, AgentTargets::Kubernetes(_)) {
        kubernetes_targets.scrape_endpoints()
    } else {
        tokio::sync::watch::channel(scrape_endpoints(&cli, &node)?).1
    };

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
    let rates = SamplingRates {
        default_hz: cli.frequency,
        max_hz: cli.max_frequency.max(cli.frequency),
    };
    // Off-CPU blocks are snapshots too: unwound in userspace like samples.
    let off_cpu = (cli.off_cpu && unwind == UnwindMode::StackSnapshot).then_some(OffCpuConfig {
        min_block: cli.off_cpu_min_block,
        captures_per_cpu_second: cli.off_cpu_captures_per_second,
        pending_entries: OFF_CPU_PENDING_ENTRIES,
    });
    if cli.off_cpu && off_cpu.is_none() {
        anyhow::bail!(
            "--off-cpu needs --unwinder eh-frame (blocked stacks are unwound in userspace)"
        );
    }
    let sampler = Sampler::start(
        SamplerConfig {
            rates,
            stack_map_entries,
            count_map_entries,
            record_tid: cli.record_tid,
            unwind,
            snapshot_ring_bytes: cli.snapshot_ring_bytes.unwrap_or_else(|| {
                default_snapshot_ring_bytes(
                    rates,
                    off_cpu.map_or(0, |off| off.captures_per_cpu_second),
                )
            }),
            btf_path: cli.btf_path.clone(),
            off_cpu,
        },
        &targets,
    )?;
    tracing::info!(
        cpus = sampler.attached_cpu_count(),
        frequency_hz = sampler.base_hz(),
        default_hz = rates.default_hz,
        max_hz = rates.max_hz,
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
                .unwrap_or_else(|| PathBuf::from(kiln_targets::DEFAULT_CRI_SOCKET)),
            node: node.clone(),
            targets_file: cli.targets_file.clone(),
            copied_pod_labels: cli.pod_labels.clone(),
            resync_interval: cli.resync_interval,
        });
    let collector_config = CollectorConfig {
        rates,
        drain_interval: cli.drain_interval,
        target_refresh_interval: Duration::from_secs(2),
        node,
        record_tid: cli.record_tid,
        unwound_stacks_capacity: usize::try_from(cli.count_map_entries).unwrap_or(usize::MAX),
        runtimes: RuntimeReaders {
            ruby: cli.ruby_frames,
            java: cli.java_frames,
            javascript: cli.javascript_frames,
        },
        off_cpu_captures_per_cpu_second: off_cpu.map(|off| off.captures_per_cpu_second),
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
    let metrics_server = start_metrics_server(&cli.metrics_addr, &metrics)?;
    let result = runtime.block_on(async move {
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        if let Some(config) = kubernetes_config {
            tokio::spawn(run_discovery(
                config,
                kubernetes_targets,
                shutdown_rx.clone(),
            ));
        }
        // Scrapes run on tasks of their own, never on the collector thread.
        tokio::spawn(run_scraper(
            scrape_endpoints,
            ScrapeConfig::default(),
            queue.clone(),
            Arc::clone(&metrics),
            shutdown_rx.clone(),
        ));
        let shipper = tokio::spawn(run_shipper(sink, queue, Arc::clone(&metrics), shutdown_rx));
        wait_for_stop(cli.duration).await;
        tracing::info!("stopping: draining the last window");
        stop.store(true, Ordering::Relaxed);
        let joined = tokio::task::spawn_blocking(move || collector.join()).await;
        let collector_failed = !matches!(joined, Ok(Ok(())));
        if collector_failed {
            tracing::error!("the collector thread panicked");
        }
        let _ = shutdown_tx.send(true);
        if tokio::time::timeout(Duration::from_secs(15), shipper)
            .await
            .is_err()
        {
            tracing::warn!("gave up shipping the last profiles after 15 s");
        }
        // Windows were lost: say so in the exit status, so that a
        // supervisor (the kubelet, a test) sees a failure, not a clean stop.
        if collector_failed {
            anyhow::bail!("the collector thread panicked; windows since were not profiled");
        }
        Ok(())
    });
    if let Some(server) = metrics_server {
        server.stop();
    }
    result
}

/// Where profiles go: `--output-dir` or `--store`.
fn sink(cli: &AgentSettings) -> anyhow::Result<Sink> {
    Ok(match (&cli.output_dir, &cli.store) {
        (Some(dir), _) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Sink::Directory(dir.clone())
        }
        (None, Some(endpoint)) => Sink::Store {
            endpoint: endpoint.clone(),
            replicas: ReplicaChoice::new(
                cli.store_replicas.clone(),
                &cli.node_name.clone().unwrap_or_else(host_name),
            ),
            token: cli
                .store_token_file
                .as_deref()
                .map(StoreToken::from_file)
                .transpose()?,
        },
        (None, None) => anyhow::bail!("give --output-dir or --store"),
    })
}

fn scrape_endpoints(cli: &AgentSettings, node: &str) -> anyhow::Result<Vec<ScrapeEndpoint>> {
    Ok(kiln_agent::scrape::host_endpoints(
        &cli.scrape,
        cli.scrape_service_name.as_deref(),
        node,
        cli.scrape_interval,
        cli.scrape_timeout,
    )?)
}

/// `--scrape` without CPU targets: no BPF, so no privileges; pprof
/// endpoints scraped and shipped until stopped.
fn run_scrape_only(cli: AgentSettings) -> anyhow::Result<()> {
    let sink = sink(&cli)?;
    let node = cli.node_name.clone().unwrap_or_else(host_name);
    let endpoints = scrape_endpoints(&cli, &node)?;
    // Bodies and decoded profiles are large and short-lived: mapped on
    // their own and returned on free, as in the CPU path.
    release_startup_memory();
    let metrics = Arc::new(AgentMetrics::default());
    let queue = ShipQueue::new(cli.queue_capacity, Arc::clone(&metrics));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let metrics_server = start_metrics_server(&cli.metrics_addr, &metrics)?;
    tracing::info!(endpoints = endpoints.len(), "scraping pprof endpoints only");
    runtime.block_on(async move {
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let (_endpoints, endpoints) = tokio::sync::watch::channel(endpoints);
        let scraper = tokio::spawn(run_scraper(
            endpoints,
            ScrapeConfig::default(),
            queue.clone(),
            Arc::clone(&metrics),
            shutdown_rx.clone(),
        ));
        let shipper = tokio::spawn(run_shipper(sink, queue, metrics, shutdown_rx));
        wait_for_stop(cli.duration).await;
        let _ = shutdown_tx.send(true);
        let _ = scraper.await;
        if tokio::time::timeout(Duration::from_secs(15), shipper)
            .await
            .is_err()
        {
            tracing::warn!("gave up shipping the last profiles after 15 s");
        }
    });
    if let Some(server) = metrics_server {
        server.stop();
    }
    Ok(())
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
///
/// glibc also raises its mmap threshold (up to 32 MiB) each time such a
/// large block is freed, after which the agent's large, short-lived buffers
/// (ELF copies, unwind sections, blazesym's symbol indexes of a compiler's
/// libraries) come from the heap and leave it fragmented: on a node that
/// builds, RSS then grew past 100 MiB. A fixed threshold keeps them mapped
/// and returned on free.
fn release_startup_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets a malloc parameter and malloc_trim only releases
    // free heap pages; no pointer is touched.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::malloc_trim(0);
    }
}

/// Allocations of this size or more are mapped on their own (glibc's
/// initial default, kept fixed).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: libc::c_int = 128 * 1024;

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Serves `/metrics` on `addr` from a thread of its own; `None` for `off`.
fn start_metrics_server(
    addr: &str,
    metrics: &Arc<AgentMetrics>,
) -> anyhow::Result<Option<MetricsThread>> {
    if addr == "off" {
        return Ok(None);
    }
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("binding /metrics to {addr}"))?;
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, "serving /metrics");
    }
    let server = spawn_metrics_thread(listener, Arc::clone(metrics))
        .context("starting the metrics thread")?;
    Ok(Some(server))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_filter_comes_from_the_flag_and_a_bad_one_is_refused() {
        let cli = AgentSettings::try_parse_from([
            "kiln-agent",
            "--all",
            "--output-dir",
            "/tmp",
            "--log",
            "kiln_agent=debug",
        ])
        .expect("valid");
        let filter = log_filter(cli.log.as_deref()).expect("a valid filter");
        assert_eq!(filter.to_string(), "kiln_agent=debug");
        let error = log_filter(Some("kiln_agent=loud")).expect_err("not a level");
        assert!(error.contains("invalid --log filter"), "{error}");
    }
}
