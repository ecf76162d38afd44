//! Replicas on one bucket: what asking the peers costs a query, and what
//! ingest spread over replicas takes, for 1, 2 and 3 replicas in one run.
//!
//! Each round starts `KILN_BENCH_REPLICAS` (default `1 2 3`) release
//! `kiln-store` processes on one local bucket, each listing the others in
//! `--peers`, with the default 60 s flush, so every peer holds the whole
//! run in its head: the most a query must ask for. `KILN_BENCH_WRITERS`
//! threads (default 4, spread round-robin over the replicas) post folded
//! profiles of `KILN_BENCH_PODS` pods (default 200, 300 stacks each) for
//! `KILN_BENCH_SECONDS` (default 10). Then replica 0 answers 40 flame
//! graphs over every pod and 40 over one pod, timed; every replica's total
//! must equal every other's and the acknowledged total.
//!
//! Usage: cargo bench -p kiln-store --bench replicas

// A benchmark reports on standard output.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kiln_testkit::http::{enc, free_port, http};
use kiln_testkit::store_process::StoreProcess;

const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// Stacks in each profile, and each stack's sample count.
const STACKS: usize = 300;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A folded profile of pod `pod`: 300 stacks of depth 8 to 23, drawn from
/// 64 functions, the same for a pod on every call.
fn folded(pod: usize) -> (Vec<u8>, u64) {
    let mut out = String::new();
    let mut samples = 0u64;
    let mut state = pod as u64 * 2_654_435_761 + 1;
    let mut next = |bound: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % bound
    };
    for _ in 0..STACKS {
        let depth = 8 + next(16);
        let frames: Vec<String> = (0..depth).map(|_| format!("fn_{}", next(64))).collect();
        let count = 1 + next(9);
        samples += count;
        out.push_str(&format!("main;{} {count}\n", frames.join(";")));
    }
    (out.into_bytes(), samples)
}

fn start(replicas: usize, bucket: &std::path::Path) -> Vec<StoreProcess> {
    let addrs: Vec<SocketAddr> = (0..replicas).map(|_| free_port()).collect();
    let peers: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("r{i}=http://{a}"))
        .collect();
    let peers = peers.join(",");
    let bucket = bucket.to_str().expect("utf-8 path");
    addrs
        .iter()
        .enumerate()
        .map(|(i, &addr)| {
            let replica = format!("r{i}");
            let mut args = vec![
                "--bucket",
                bucket,
                "--replica",
                &replica,
                "--max-inflight",
                "256",
            ];
            if replicas > 1 {
                args.extend(["--peers", &peers]);
            }
            StoreProcess::start_on(
                KILN_STORE,
                addr,
                tempfile::tempdir().expect("data dir"),
                &args,
                &[],
            )
        })
        .collect()
}

fn flame_total(addr: SocketAddr, selector: &str) -> (u64, Duration, Option<String>) {
    let target = format!("/api/v1/flamegraph?query={}&from=now-1h", enc(selector));
    let began = Instant::now();
    let response = http(addr, "GET", &target, &[], b"").expect("query");
    let took = began.elapsed();
    assert_eq!(response.status, 200, "{}", response.text());
    let partial = response.header("kiln-partial").map(str::to_owned);
    (
        response.json()["total"].as_u64().unwrap_or(0),
        took,
        partial,
    )
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn round(replicas: usize, writers: usize, pods: usize, seconds: u64) {
    let bucket = tempfile::tempdir().expect("bucket");
    let stores = start(replicas, bucket.path());
    let addrs: Vec<SocketAddr> = stores.iter().map(|s| s.addr).collect();
    let profiles: Arc<Vec<(Vec<u8>, u64)>> = Arc::new((0..pods).map(folded).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let acked_samples = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let addr = addrs[w % addrs.len()];
            let (profiles, stop) = (Arc::clone(&profiles), Arc::clone(&stop));
            let (acked_samples, accepted) = (Arc::clone(&acked_samples), Arc::clone(&accepted));
            std::thread::spawn(move || {
                let mut pod = w;
                while !stop.load(Ordering::Relaxed) {
                    let (body, samples) = &profiles[pod % profiles.len()];
                    let name = enc(&format!("bench.cpu{{pod=pod-{}}}", pod % profiles.len()));
                    let target =
                        format!("/ingest?name={name}&from=now-10s&until=now&sampleRate=100");
                    if let Ok(r) = http(addr, "POST", &target, &[], body)
                        && r.status == 200
                    {
                        acked_samples.fetch_add(*samples, Ordering::Relaxed);
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    pod += writers;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("writer");
    }
    let elapsed = began.elapsed().as_secs_f64();
    let profiles_in = accepted.load(Ordering::Relaxed);
    // 100 Hz: each sample is 10 ms of CPU.
    let expected = acked_samples.load(Ordering::Relaxed) * 10_000_000;
    for &addr in &addrs {
        let (total, _, partial) = flame_total(addr, r#"process_cpu{service_name="bench"}"#);
        assert_eq!((total, partial), (expected, None), "replica at {addr}");
    }
    let mut report = Vec::new();
    for (what, selector) in [
        (
            "all pods",
            r#"process_cpu{service_name="bench"}"#.to_owned(),
        ),
        (
            "one pod",
            r#"process_cpu{service_name="bench",pod="pod-7"}"#.to_owned(),
        ),
    ] {
        let mut took: Vec<Duration> = (0..40)
            .map(|_| flame_total(addrs[0], &selector).1)
            .collect();
        took.sort_unstable();
        report.push(format!(
            "{what} p50={:.1}ms p99={:.1}ms",
            percentile(&took, 0.5),
            percentile(&took, 0.99)
        ));
    }
    println!(
        "replicas={replicas} writers={writers} pods={pods} accepted={profiles_in} profiles/s={:.0} | flame graph at r0: {}",
        profiles_in as f64 / elapsed,
        report.join(", ")
    );
    drop(stores);
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let replicas: Vec<usize> = std::env::var("KILN_BENCH_REPLICAS")
        .unwrap_or_else(|_| "1 2 3".into())
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .collect();
    let writers = env_number("KILN_BENCH_WRITERS", 4);
    let pods = env_number("KILN_BENCH_PODS", 200).max(1);
    let seconds = env_number("KILN_BENCH_SECONDS", 10) as u64;
    for n in replicas {
        round(n, writers, pods, seconds);
    }
}
