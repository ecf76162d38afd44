//! Load benchmark: concurrent gRPC WriteRaw writers against a real
//! `kiln-store` process on loopback. Reports accepted profiles per second
//! and write latency percentiles.
//!
//! `cargo bench -p kiln-store --bench write_load`
//! Knobs (environment): KILN_BENCH_WRITERS (default 32), KILN_BENCH_SECONDS
//! (default 10), KILN_BENCH_SAMPLES (samples per profile, default 200),
//! KILN_BENCH_PROTOCOL: `write_raw` (default, gRPC), `ingest` (Pyroscope's
//! `/ingest?format=pprof`) or `ingest_multipart` (`/ingest` multipart with
//! `prev_profile`), KILN_BENCH_STORE_BIN (another `kiln-store` binary to
//! load, e.g. a build of an earlier commit; default: the one cargo built).
//! Besides throughput and latency it reports the server's CPU time per
//! accepted profile, which a busy machine disturbs less.
//! KILN_BENCH_CLIENT_PROCESSES=1 (with `ingest`): each writer is a process
//! of its own (this binary again), so client-side locks and allocators are
//! not shared and the store sees independent clients, as from many agents.
//! KILN_BENCH_WORKLOADS (default 10): the workloads (namespaces) the 500
//! pods are spread over; the store's head shards by workload. The clients'
//! own CPU time is reported too: on one machine they share its cores with
//! the store.

// Printing the measured numbers is this benchmark's job.
#![allow(clippy::print_stdout)]

mod ingest_http;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ingest_http::IngestForm;
use kiln_api::parca::profilestore::v1alpha1::profile_store_service_client::ProfileStoreServiceClient;
use kiln_api::parca::profilestore::v1alpha1::{
    Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest,
};
use kiln_pprof::{FunctionSpec, ProfileBuilder, encode_gzip};
use kiln_testkit::clock::now_nanos;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An agent-like 10 s CPU profile: `samples` distinct stacks, 16 to 40
/// frames deep over a pool of 400 functions, with mappings and addresses.
fn agent_like_profile(samples: usize, seed: u64) -> Vec<u8> {
    let now = now_nanos();
    let mut builder = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 52_631_578)
        .time(now, 10_000_000_000);
    let mapping = builder.mapping(&kiln_pprof::MappingSpec {
        memory_start: 0x400000,
        memory_limit: 0x900000,
        filename: "/usr/bin/checkout-service".into(),
        build_id: "5f2b1c3d4e5f60718293a4b5c6d7e8f901234567".into(),
        has_functions: true,
        ..Default::default()
    });
    let functions: Vec<u64> = (0..400)
        .map(|i| {
            builder.function(&FunctionSpec {
                name: format!("checkout::service::module_{}::function_{i}", i % 23),
                filename: format!("src/module_{}.rs", i % 23),
                ..Default::default()
            })
        })
        .collect();
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    for _ in 0..samples {
        let depth = 16 + next() % 25;
        let stack: Vec<u64> = (0..depth)
            .map(|level| {
                let f = if level > depth - 6 {
                    level
                } else {
                    next() % 400
                };
                builder.location(
                    mapping,
                    0x400000 + (f as u64) * 0x40 + (level as u64 % 4),
                    &[(functions[f], (level + 1) as i64)],
                )
            })
            .collect();
        let count = 1 + (next() % 5) as i64;
        builder.sample(&stack, &[count, count * 52_631_578], &[]);
    }
    encode_gzip(&builder.finish())
}

/// Set in a client process: the store's address, then `writer/of/seconds/form`.
const CLIENT_ENV: &str = "KILN_BENCH_CLIENT";

/// One client process's share of the load: runs, then prints its
/// latencies (µs) and errors on one line for the parent.
fn client_process(spec: &str, samples: usize) {
    let parts: Vec<&str> = spec.split('/').collect();
    let [addr, writer, of, seconds, form] = parts[..] else {
        panic!("{CLIENT_ENV}={spec}: expected addr/writer/of/seconds/form");
    };
    let addr: std::net::SocketAddr = addr.parse().expect("client address");
    let writer: usize = writer.parse().expect("writer");
    let of: usize = of.parse().expect("writer count");
    let seconds: u64 = seconds.parse().expect("seconds");
    let form = if form == "multipart" {
        IngestForm::Multipart
    } else {
        IngestForm::Pprof
    };
    let profiles: Vec<Vec<u8>> = (0..16)
        .map(|seed| agent_like_profile(samples, seed))
        .collect();
    let end = Instant::now() + Duration::from_secs(seconds);
    let (latencies, errors) =
        ingest_http::run_writers(addr, form, writer..writer + 1, of, &profiles, end);
    let micros: Vec<String> = latencies
        .iter()
        .map(|d| d.as_micros().to_string())
        .collect();
    let cpu = process_cpu_seconds(std::process::id());
    println!(
        "CLIENT errors={errors} cpu_s={cpu:.3} latencies_us={}",
        micros.join(",")
    );
}

/// Runs `writers` client processes against `addr`; collects their results
/// and the CPU seconds they used.
fn client_processes(
    addr: std::net::SocketAddr,
    form: IngestForm,
    writers: usize,
    seconds: u64,
) -> (Vec<Duration>, u64, f64) {
    let exe = std::env::current_exe().expect("this benchmark's path");
    let form = match form {
        IngestForm::Pprof => "pprof",
        IngestForm::Multipart => "multipart",
    };
    let children: Vec<_> = (0..writers)
        .map(|writer| {
            Command::new(&exe)
                .env(
                    CLIENT_ENV,
                    format!("{addr}/{writer}/{writers}/{seconds}/{form}"),
                )
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a client process")
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut cpu_seconds = 0.0;
    for child in children {
        let output = child.wait_with_output().expect("client process");
        assert!(output.status.success(), "a client process failed");
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("CLIENT "))
            .expect("a client's result line");
        for field in line.split_whitespace() {
            if let Some(n) = field.strip_prefix("errors=") {
                errors += n.parse::<u64>().expect("errors");
            } else if let Some(n) = field.strip_prefix("cpu_s=") {
                cpu_seconds += n.parse::<f64>().expect("cpu seconds");
            } else if let Some(list) = field.strip_prefix("latencies_us=") {
                latencies.extend(
                    list.split(',')
                        .filter(|v| !v.is_empty())
                        .map(|v| Duration::from_micros(v.parse().expect("latency"))),
                );
            }
        }
    }
    (latencies, errors, cpu_seconds)
}

fn main() {
    let samples_per_profile = env_number("KILN_BENCH_SAMPLES", 200);
    if let Ok(spec) = std::env::var(CLIENT_ENV) {
        client_process(&spec, samples_per_profile);
        return;
    }
    let writers = env_number("KILN_BENCH_WRITERS", 32);
    let seconds = env_number("KILN_BENCH_SECONDS", 10) as u64;
    let samples = samples_per_profile;
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let data_dir = tempfile::tempdir().expect("temp dir");
    let store_bin = std::env::var_os("KILN_BENCH_STORE_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_kiln-store").into());
    let mut child = Command::new(store_bin)
        .args(["--listen", &addr.to_string(), "--max-inflight", "1024"])
        .arg("--data-dir")
        .arg(data_dir.path())
        .env("KILN_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn kiln-store");

    let profiles: Vec<Vec<u8>> = (0..16)
        .map(|seed| agent_like_profile(samples, seed))
        .collect();
    let profile_bytes = profiles[0].len();
    let protocol = std::env::var("KILN_BENCH_PROTOCOL").unwrap_or_else(|_| "write_raw".into());
    let own_cpu_before = process_cpu_seconds(std::process::id());
    let (mut latencies, errors, elapsed, cpu_seconds, client_processes_cpu) = match protocol
        .as_str()
    {
        "write_raw" => {
            let (latencies, errors, elapsed, cpu) =
                write_raw_load(addr, child.id(), writers, seconds, profiles);
            (latencies, errors, elapsed, cpu, 0.0)
        }
        "ingest" | "ingest_multipart" => {
            let form = if protocol == "ingest" {
                IngestForm::Pprof
            } else {
                IngestForm::Multipart
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while !ingest_http::warm_up(addr, form, &profiles[0]) {
                assert!(Instant::now() < deadline, "kiln-store did not get ready");
                std::thread::sleep(Duration::from_millis(50));
            }
            let cpu_before = process_cpu_seconds(child.id());
            let start = Instant::now();
            let end = start + Duration::from_secs(seconds);
            let (latencies, errors, clients_cpu) =
                if std::env::var_os("KILN_BENCH_CLIENT_PROCESSES").is_some() {
                    client_processes(addr, form, writers, seconds)
                } else {
                    let (latencies, errors) = ingest_http::run(addr, form, writers, &profiles, end);
                    (latencies, errors, 0.0)
                };
            let cpu = process_cpu_seconds(child.id()) - cpu_before;
            (latencies, errors, start.elapsed(), cpu, clients_cpu)
        }
        other => {
            panic!("KILN_BENCH_PROTOCOL={other}: expected write_raw, ingest or ingest_multipart")
        }
    };
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
    latencies.sort_unstable();
    let percentile = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let accepted = latencies.len();
    let clients = if std::env::var_os("KILN_BENCH_CLIENT_PROCESSES").is_some() {
        "processes"
    } else {
        "threads"
    };
    println!(
        "protocol={protocol} writers={writers} clients={clients} samples/profile={samples} profile_bytes={profile_bytes} seconds={:.1}",
        elapsed.as_secs_f64()
    );
    println!(
        "accepted={accepted} errors={errors} profiles/s={:.0} p50={:.2}ms p99={:.2}ms max={:.2}ms",
        accepted as f64 / elapsed.as_secs_f64(),
        percentile(0.50),
        percentile(0.99),
        percentile(1.0),
    );
    println!(
        "server cpu={cpu_seconds:.2}s profiles per server CPU-second={:.0}",
        accepted as f64 / cpu_seconds.max(f64::MIN_POSITIVE)
    );
    // Client threads run in this process (with its setup); client
    // processes report their own.
    let client_cpu =
        process_cpu_seconds(std::process::id()) - own_cpu_before + client_processes_cpu;
    println!(
        "client cpu={client_cpu:.2}s ({:.2} cores)",
        client_cpu / elapsed.as_secs_f64()
    );
}

/// User + system CPU time of process `pid` so far, from `/proc/PID/stat`.
fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')').expect("stat has a command name") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / per_second as f64
}

/// The gRPC side: tonic clients sharing one h2c connection.
fn write_raw_load(
    addr: std::net::SocketAddr,
    pid: u32,
    writers: usize,
    seconds: u64,
    profiles: Vec<Vec<u8>>,
) -> (Vec<Duration>, u64, Duration, f64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let workloads = ingest_http::workloads();
    runtime.block_on(async move {
        let url = format!("http://{addr}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let channel = loop {
            match tonic::transport::Endpoint::from_shared(url.clone())
                .expect("url")
                .connect()
                .await
            {
                Ok(channel) => break channel,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot connect: {e}"),
            }
        };
        // Wait for readiness with a cheap request that must succeed.
        let warmup = WriteRawRequest {
            series: vec![series(0, workloads, profiles[0].clone())],
            ..Default::default()
        };
        loop {
            let mut client = ProfileStoreServiceClient::new(channel.clone());
            if client.write_raw(warmup.clone()).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cpu_before = process_cpu_seconds(pid);
        let start = Instant::now();
        let end = start + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for writer in 0..writers {
            let channel = channel.clone();
            let profiles = profiles.clone();
            tasks.push(tokio::spawn(async move {
                let mut client = ProfileStoreServiceClient::new(channel);
                let mut latencies = Vec::new();
                let mut errors = 0u64;
                let mut i = writer;
                while Instant::now() < end {
                    let request = WriteRawRequest {
                        series: vec![series(
                            i % 500,
                            workloads,
                            profiles[i % profiles.len()].clone(),
                        )],
                        ..Default::default()
                    };
                    let sent = Instant::now();
                    match client.write_raw(request).await {
                        Ok(_) => latencies.push(sent.elapsed()),
                        Err(_) => errors += 1,
                    }
                    i += writers;
                }
                (latencies, errors)
            }));
        }
        let mut latencies = Vec::new();
        let mut errors = 0;
        for task in tasks {
            let (l, e) = task.await.expect("writer task");
            latencies.extend(l);
            errors += e;
        }
        let elapsed = start.elapsed();
        (
            latencies,
            errors,
            elapsed,
            process_cpu_seconds(pid) - cpu_before,
        )
    })
}

fn series(target: usize, workloads: usize, profile: Vec<u8>) -> RawProfileSeries {
    let label = |name: &str, value: String| Label {
        name: name.into(),
        value,
    };
    RawProfileSeries {
        labels: Some(LabelSet {
            labels: vec![
                label("__name__", "parca_agent".into()),
                label("namespace", format!("team-{}", target % workloads)),
                label("pod", format!("checkout-{target}")),
                label("container", "app".into()),
                label("node", format!("node-{}", target % 7)),
            ],
        }),
        samples: vec![RawSample {
            raw_profile: profile,
            executable_info: vec![],
        }],
    }
}
