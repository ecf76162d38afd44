//! The real `kiln-store` under a memory limit equal to its `--memory-budget`
//! (issue 13): it ingests more pprof than the budget, flushes it into blocks
//! and compacts them, and is neither OOM-killed nor past the budget in peak
//! RSS (VmHWM); every acknowledged value is still there afterwards.
//!
//! The limit lives in a cgroup this test creates inside its own memory
//! cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes` on hybrid hosts).
//! Only the store's own shell wrapper joins it, before it execs the store;
//! no process is moved out of the cgroup it started in.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kiln_testkit::clock::now_s;
use kiln_testkit::http::{enc, free_port, get, http};
use kiln_testkit::memory_cgroup::{LimitedCgroup, status_kib};
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::service_profiles::{ServiceShape, service_profile};

const BUDGET: u64 = 192 << 20;
/// Gzipped pprof sent: more than the budget.
const SEND_BYTES: u64 = BUDGET + (16 << 20);
const PODS: usize = 200;
const CLIENTS: usize = 4;

/// The profiles this test sends: larger than the crash test's.
const SHAPE: ServiceShape = ServiceShape {
    build_ids: 7,
    min_depth: 8,
    depth_spread: 24,
    functions: 2_000,
    packages: 40,
    receiver: "(*Worker).",
    file: "worker.go",
};

fn profile(seed: usize, stacks: usize) -> (Vec<u8>, i64) {
    service_profile(&SHAPE, seed, stacks)
}

/// Blocks in the bucket (under `blocks/<replica>/`) as (id, compaction level).
fn blocks(bucket: &Path) -> Vec<(String, u64)> {
    let Ok(replicas) = std::fs::read_dir(bucket.join("blocks")) else {
        return Vec::new();
    };
    replicas
        .filter_map(Result::ok)
        .filter_map(|replica| std::fs::read_dir(replica.path()).ok())
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let meta = std::fs::read(e.path().join("meta.json")).ok()?;
            let meta: serde_json::Value = serde_json::from_slice(&meta).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                meta["compaction_level"].as_u64()?,
            ))
        })
        .collect()
}

#[test]
fn store_ingests_and_compacts_more_than_its_budget_inside_a_cgroup_of_that_size() {
    let Some(cgroup) = LimitedCgroup::create_or_skip(BUDGET) else {
        return;
    };
    let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let addr: SocketAddr = free_port();
    let mut child = cgroup
        .command(env!("CARGO_BIN_EXE_kiln-store"))
        .arg(format!("--listen={addr}"))
        .arg(format!("--data-dir={}", data_dir.path().display()))
        .arg(format!("--memory-budget={BUDGET}"))
        .arg("--flush-interval=2s")
        .arg("--relist-interval=1s")
        .arg("--compaction-interval=2s")
        // This test checks memory, not query speed: the debug build's
        // merge of every block, cold, under a 192 MiB budget on a loaded
        // CI machine has run past the 30 s default.
        .arg("--query-timeout=300s")
        .env("KILN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn kiln-store in the limited cgroup");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(addr, "GET", "/readyz", &[], b"").map_or(true, |r| r.status != 200) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("kiln-store exited during start-up: {status}");
        }
        assert!(Instant::now() < deadline, "kiln-store not ready in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let store = KillOnDrop(child);

    // Profiles 3 to 5 hours ago, so their hours are complete and compaction
    // (which waits for an hour to settle) merges their blocks.
    let variants: Vec<(Vec<u8>, i64)> = (0..24).map(|seed| profile(seed, 250)).collect();
    let mean = variants.iter().map(|(b, _)| b.len() as u64).sum::<u64>() / variants.len() as u64;
    let count = (SEND_BYTES / mean) as usize + 1;
    let start_s = now_s() - 5 * 3600;
    let step_s = (2 * 3600 / count as i64).max(1);
    let backlog_refusals = AtomicU64::new(0);
    let sent_total: i64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let variants = &variants;
                let backlog_refusals = &backlog_refusals;
                scope.spawn(move || {
                    let mut total = 0i64;
                    for i in (client..count).step_by(CLIENTS) {
                        let (body, value) = &variants[i % variants.len()];
                        let at = start_s + i as i64 * step_s;
                        let name = format!("memtest{{pod=pod-{}}}", i % PODS);
                        let target = format!(
                            "/ingest?name={}&from={at}&until={}&format=pprof",
                            enc(&name),
                            at + 10
                        );
                        // A full upload budget is the store's back-pressure:
                        // 503 `upload_backlog` is retryable, and a client that
                        // sends as fast as this one is told to wait while
                        // a cut head is written (counted and printed below).
                        let mut refusals = 0u32;
                        let response = loop {
                            let response = http(addr, "POST", &target, &[], body)
                                .unwrap_or_else(|e| panic!("ingest {i}: {e}"));
                            let backlog = response.status == 503
                                && response.text().contains("upload_backlog");
                            if !backlog || refusals >= 600 {
                                break response;
                            }
                            refusals += 1;
                            backlog_refusals.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(200));
                        };
                        assert_eq!(response.status, 200, "ingest {i}: {}", response.text());
                        total += value;
                    }
                    total
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("client thread"))
            .sum()
    });
    let sent_bytes = count as u64 * mean;
    eprintln!(
        "retried {} uploads refused with 503 upload_backlog",
        backlog_refusals.load(Ordering::Relaxed)
    );
    eprintln!(
        "sent {count} profiles, about {} MiB gzipped, to a store with a {} MiB budget",
        sent_bytes >> 20,
        BUDGET >> 20
    );

    // Wait until everything is flushed and compaction has merged blocks.
    let bucket = data_dir.path().join("bucket");
    // A bound on waiting, not a speed check: a loaded CI machine has
    // needed close to 180 s for this debug build.
    let settle_start = Instant::now();
    let deadline = settle_start + Duration::from_secs(420);
    let mut previous: Option<Vec<(String, u64)>> = None;
    let mut stable_polls = 0;
    loop {
        let mut blocks = blocks(&bucket);
        blocks.sort();
        let compacted = blocks.iter().filter(|(_, level)| *level >= 1).count();
        let metrics = get(addr, "/metrics").text();
        let head_empty = metrics.lines().any(|l| l == "kiln_head_profiles 0");
        // Settled: compacted, nothing in the head, and the same blocks for
        // three polls (compaction runs every 2 s, so it has nothing left).
        if compacted > 0 && head_empty && previous.as_ref() == Some(&blocks) {
            stable_polls += 1;
            if stable_polls >= 3 {
                eprintln!(
                    "blocks: {} ({compacted} compacted), settled in {:.0} s",
                    blocks.len(),
                    settle_start.elapsed().as_secs_f64()
                );
                break;
            }
        } else {
            stable_polls = 0;
        }
        assert!(
            Instant::now() < deadline,
            "compaction did not settle within 420 s; blocks: {blocks:?}"
        );
        previous = Some(blocks);
        std::thread::sleep(Duration::from_secs(2));
    }

    // Every acknowledged value is there once, whatever merged.
    let selector = r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{service_name="memtest"}"#;
    let query_start = Instant::now();
    let response = get(
        addr,
        &format!(
            "/api/v1/flamegraph?query={}&from={}&until={}",
            enc(selector),
            start_s - 60,
            now_s()
        ),
    );
    eprintln!(
        "flamegraph over every block: {:.1} s",
        query_start.elapsed().as_secs_f64()
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["total"].as_i64(), Some(sent_total));

    let hwm_kib = status_kib(pid, "VmHWM:").expect("the store is alive and has a VmHWM");
    let oom_kills = cgroup.oom_kills();
    let mut out = std::io::stderr().lock();
    let _ = writeln!(
        out,
        "peak RSS (VmHWM) {} MiB with a {} MiB budget and limit; OOM kills {oom_kills}",
        hwm_kib >> 10,
        BUDGET >> 20
    );
    assert_eq!(oom_kills, 0, "the store was OOM-killed inside its budget");
    assert!(
        hwm_kib * 1024 <= BUDGET,
        "peak RSS {} KiB is over the {} KiB budget",
        hwm_kib,
        BUDGET >> 10
    );
    drop(store);
}
