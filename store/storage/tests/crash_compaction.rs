//! SIGKILL during a streaming compaction (issue 13): a child process (this
//! test binary, re-executed) writes level-0 blocks for two past hours, says
//! so, and compacts them while the parent kills it after a varying delay.
//! Whatever the kill interrupted (reading sources, merging, uploading the
//! merged block, deleting sources), the reopened store must hold every
//! value exactly once.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kiln_engine::model::{Label, LabelSet, Selector};
use kiln_storage::{IngestRequest, Store};
use kiln_testkit::profiles::*;

const CHILD_DIR_ENV: &str = "KILN_CRASH_COMPACTION_DIR";
const CHILD_TEST: &str = "child_process_entry_point";
const FLUSHES: u64 = 12;
const PROFILES_PER_FLUSH: u64 = 30;

fn request(seq: u64) -> IngestRequest {
    let (pprof, _) = cpu_profile(seq, 40);
    IngestRequest {
        labels: LabelSet::new(vec![
            Label::new("__name__", "process_cpu"),
            Label::new("pod", format!("pod-{}", seq % 7)),
        ]),
        // Two complete hours, so compaction merges each hour's blocks.
        time_ms: Some(BASE_MS + (seq as i64 % 2) * 3_600_000 + seq as i64 * 1_000),
        duration_nanos: Some(DURATION_NANOS),
        pprof: pprof.into(),
        writer: Default::default(),
    }
}

fn expected_total() -> i64 {
    (0..FLUSHES * PROFILES_PER_FLUSH)
        .map(|seq| cpu_profile(seq, 40).1)
        .sum()
}

/// Not a test on its own: the body of the child process. Without the
/// environment variable (a normal test run) it returns at once.
#[test]
#[allow(clippy::print_stdout)]
fn child_process_entry_point() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let dir = Path::new(&dir);
        let store = Store::open(
            config(&dir.join("data"), "r1"),
            local_bucket(&dir.join("bucket")),
        )
        .await
        .expect("child open");
        if store.blocks().is_empty() {
            for flush in 0..FLUSHES {
                for i in 0..PROFILES_PER_FLUSH {
                    store
                        .ingest(request(flush * PROFILES_PER_FLUSH + i))
                        .await
                        .expect("child ingest");
                }
                store.flush().await.expect("child flush");
            }
        }
        let mut out = std::io::stdout();
        writeln!(out, "COMPACTING").expect("print");
        out.flush().expect("flush stdout");
        store
            .compact(BASE_MS + 10 * 3_600_000)
            .await
            .expect("child compaction");
        writeln!(out, "COMPACTED").expect("print");
        out.flush().expect("flush stdout");
        // Stay alive until killed, so every kill is a SIGKILL.
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

/// Runs the child until it starts compacting, waits `delay`, SIGKILLs it;
/// returns whether the compaction had finished by then.
fn run_child_and_kill(dir: &Path, delay: Duration) -> bool {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    // NB: contains, not equality: with --nocapture the harness prints
    // "test <name> ... " on the same line as the first output.
    let started = lines.any(|l| l.is_ok_and(|l| l.contains("COMPACTING")));
    assert!(started, "child never reached compaction");
    std::thread::sleep(delay);
    // std's kill sends SIGKILL on Unix: no destructors, no shutdown flush.
    child.kill().expect("SIGKILL child");
    let status = child.wait().expect("reap child");
    assert!(
        !status.success(),
        "child was killed, not finished: {status}"
    );
    lines.any(|l| l.is_ok_and(|l| l.contains("COMPACTED")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_streaming_compaction_loses_and_doubles_nothing() {
    let want = expected_total();
    let selector = Selector {
        profile_type: cpu_type(),
        matchers: vec![],
    };
    let mut interrupted = 0;
    for delay_ms in [0u64, 10, 40] {
        let dir = tempfile::tempdir().expect("tempdir");
        let finished = run_child_and_kill(dir.path(), Duration::from_millis(delay_ms));
        if !finished {
            interrupted += 1;
        }
        let store = Store::open(
            config(&dir.path().join("data"), "r1"),
            local_bucket(&dir.path().join("bucket")),
        )
        .await
        .expect("reopen after the kill");
        assert_eq!(
            total(&store, &selector, everything()).await,
            want,
            "after a kill {delay_ms} ms into compaction (finished: {finished})"
        );
        // The next compaction completes what the kill interrupted, still exactly once.
        store.refresh_blocks().await.expect("re-list");
        store
            .compact(BASE_MS + 10 * 3_600_000)
            .await
            .expect("compaction after restart");
        assert_eq!(total(&store, &selector, everything()).await, want);
        assert!(
            store.blocks().iter().all(|b| b.compaction_level >= 1),
            "every hour compacted after the restart: {:?}",
            store.blocks()
        );
    }
    assert!(
        interrupted > 0,
        "no kill landed before compaction finished; the test checked nothing"
    );
}
