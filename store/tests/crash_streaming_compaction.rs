//! kill -9 of the real `kiln-store` in the middle of a streaming compaction
//! (issue 13). The store is stopped cleanly after ingesting two past hours
//! into many level-0 blocks, then restarted with compaction every second
//! and SIGKILLed as soon as a merged block's spill file appears under
//! `<data dir>/compaction-spill/` (the merge is reading its sources or the
//! output is being uploaded), a few times at growing delays. After each
//! kill the restarted store must answer every pod's sum exactly as sent:
//! nothing lost, nothing counted twice, and the killed merge's spill file
//! gone; then once it has compacted undisturbed, again.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln_testkit::clock::now_s;
use kiln_testkit::http::{enc, free_port, get, http};
use kiln_testkit::service_profiles::{ServiceShape, service_profile};

const PODS: usize = 12;
const PROFILES: usize = 480;
/// Delays between seeing the spill file and the kill, one restart each.
const KILL_DELAYS_MS: &[u64] = &[0, 20, 150];

/// The profiles this test sends (a seed's build id cycles over 5).
const SHAPE: ServiceShape = ServiceShape {
    build_ids: 5,
    min_depth: 6,
    depth_spread: 20,
    functions: 1_500,
    packages: 30,
    receiver: "",
    file: "step.go",
};

fn profile(seed: usize, stacks: usize) -> (Vec<u8>, i64) {
    service_profile(&SHAPE, seed, stacks)
}

/// A store on `data_dir`, ready; killed (SIGKILL) when dropped.
struct Running {
    child: Child,
    addr: SocketAddr,
}

impl Running {
    fn start(data_dir: &Path, compaction_interval: &str) -> Running {
        let addr = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln-store"))
            .arg(format!("--listen={addr}"))
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg("--flush-interval=1s")
            .arg("--relist-interval=1s")
            .arg(format!("--compaction-interval={compaction_interval}"))
            .env("KILN_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kiln-store");
        let deadline = Instant::now() + Duration::from_secs(60);
        while http(addr, "GET", "/readyz", &[], b"").map_or(true, |r| r.status != 200) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("kiln-store exited during start-up: {status}");
            }
            assert!(Instant::now() < deadline, "kiln-store not ready in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Running { child, addr }
    }

    /// SIGTERM, and a clean exit (the head is flushed on the way out).
    fn stop(mut self) {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = self.child.wait().expect("wait for kiln-store");
        assert!(status.success(), "kiln-store exited with {status}");
    }

    /// SIGKILL (`Child::kill`), and reaped.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL kiln-store");
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spill_files(data_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(data_dir.join("compaction-spill"))
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// Compaction levels of the blocks in the bucket.
fn block_levels(data_dir: &Path) -> Vec<u64> {
    let Ok(replicas) = std::fs::read_dir(data_dir.join("bucket/blocks")) else {
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
            meta["compaction_level"].as_u64()
        })
        .collect()
}

/// Every pod's cpu total as the store answers it.
fn pod_totals(addr: SocketAddr, from_s: i64) -> BTreeMap<String, i64> {
    (0..PODS)
        .map(|pod| {
            let pod = format!("pod-{pod}");
            let selector = format!(
                r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{{service_name="crashtest",pod="{pod}"}}"#
            );
            let response = get(
                addr,
                &format!(
                    "/api/v1/flamegraph?query={}&from={}&until={}",
                    enc(&selector),
                    from_s - 60,
                    now_s()
                ),
            );
            assert_eq!(response.status, 200, "{}", response.text());
            let total = response.json()["total"].as_i64().unwrap_or(0);
            (pod, total)
        })
        .collect()
}

#[test]
fn kill_9_during_a_streaming_compaction_loses_and_doubles_nothing() {
    let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let dir = data_dir.path();

    // Two complete past hours in many level-0 blocks, no compaction yet.
    let store = Running::start(dir, "1h");
    let variants: Vec<(Vec<u8>, i64)> = (0..16).map(|seed| profile(seed, 200)).collect();
    // Aligned to an hour, so each of the two hours holds six flushes. A
    // start a few minutes before an hour put one lone level-0 block in that
    // hour, which no hour merge takes (nothing to merge it with) until its
    // day completes, and the wait for "no level 0 left" below ran out.
    let start_s = (now_s() - 5 * 3600).div_euclid(3600) * 3600;
    let step_s = 2 * 3600 / PROFILES as i64;
    let mut sent: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..PROFILES {
        let (body, value) = &variants[i % variants.len()];
        let at = start_s + i as i64 * step_s;
        let pod = format!("pod-{}", i % PODS);
        let target = format!(
            "/ingest?name={}&from={at}&until={}&format=pprof",
            enc(&format!("crashtest{{pod={pod}}}")),
            at + 10
        );
        let response = http(store.addr, "POST", &target, &[], body).expect("ingest");
        assert_eq!(response.status, 200, "ingest {i}: {}", response.text());
        *sent.entry(pod).or_default() += value;
        if i % 40 == 39 {
            // A flush every 40 profiles: many small blocks to merge.
            std::thread::sleep(Duration::from_millis(1_100));
        }
    }
    assert_eq!(pod_totals(store.addr, start_s), sent, "before any kill");
    store.stop();
    let level0 = block_levels(dir).len();
    assert!(level0 >= 4, "expected many level-0 blocks, found {level0}");

    let mut kills = 0;
    for &delay_ms in KILL_DELAYS_MS {
        let store = Running::start(dir, "1s");
        // The killed merge's spill file, if one was caught.
        let deadline = Instant::now() + Duration::from_secs(60);
        let caught = loop {
            if let Some(file) = spill_files(dir).into_iter().next() {
                break Some(file);
            }
            if Instant::now() > deadline || block_levels(dir).iter().all(|&l| l >= 2) {
                break None;
            }
            std::thread::sleep(Duration::from_micros(500));
        };
        let Some(spilled) = caught else {
            // Nothing left to merge: every hour (and the day) is compacted.
            store.stop();
            break;
        };
        std::thread::sleep(Duration::from_millis(delay_ms));
        store.kill();
        kills += 1;

        let store = Running::start(dir, "1h");
        assert!(
            !spilled.exists(),
            "the killed merge's spill file {} survived the restart",
            spilled.display()
        );
        assert_eq!(
            pod_totals(store.addr, start_s),
            sent,
            "after SIGKILL {delay_ms} ms into a compaction"
        );
        store.stop();
    }
    assert!(kills >= 1, "no compaction was caught in progress to kill");

    // Undisturbed, compaction finishes, and the sums still hold.
    let store = Running::start(dir, "1s");
    let deadline = Instant::now() + Duration::from_secs(120);
    while block_levels(dir).contains(&0) {
        assert!(
            Instant::now() < deadline,
            "compaction did not finish in 120 s: {:?}",
            block_levels(dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(pod_totals(store.addr, start_s), sent, "after compaction");
    eprintln!(
        "killed {kills} compactions in progress; {level0} level-0 blocks merged into {:?}",
        block_levels(dir)
    );
    store.stop();
}
