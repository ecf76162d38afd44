//! Crash recovery: a child process (this test binary, re-executed) ingests
//! profiles with a background flush running and prints each acknowledged
//! id; the parent kills it with SIGKILL mid-stream, twice, and then checks
//! that every acknowledged profile is in the reopened store exactly once.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kiln_engine::model::{Label, LabelSet, MatchOp, Matcher, Selector};
use kiln_storage::{IngestRequest, Store};
use kiln_testkit::profiles::*;

const CHILD_DIR_ENV: &str = "KILN_CRASH_CHILD_DIR";
const CHILD_START_ENV: &str = "KILN_CRASH_CHILD_START";
const CHILD_TEST: &str = "child_process_entry_point";
const WRITERS: u64 = 4;
const PROFILE_SAMPLES: usize = 20;

fn seq_request(seq: u64) -> IngestRequest {
    let (pprof, _) = cpu_profile(seq, PROFILE_SAMPLES);
    IngestRequest {
        labels: LabelSet::new(vec![
            Label::new("__name__", "process_cpu"),
            Label::new("pod", format!("pod-{}", seq % 5)),
            Label::new("seq", seq.to_string()),
        ]),
        // Recent times: the child's background retention runs on the real clock.
        time_ms: Some(recent_ms()),
        duration_nanos: Some(DURATION_NANOS),
        pprof: pprof.into(),
        writer: Default::default(),
    }
}

fn child_config(dir: &Path) -> kiln_storage::StoreConfig {
    let mut config = config(&dir.join("data"), "crash");
    config.background = true;
    // Flush often so kills also land mid-upload and mid-WAL-cleanup.
    config.flush_interval = Duration::from_millis(120);
    config
}

/// Not a test on its own: the body of the child process. Without the
/// environment variable (a normal test run) it returns at once.
#[test]
#[allow(clippy::print_stdout)]
fn child_process_entry_point() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let start: u64 = std::env::var(CHILD_START_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let dir = Path::new(&dir);
        let store = Store::open(child_config(dir), local_bucket(&dir.join("bucket")))
            .await
            .expect("child open");
        println!("READY");
        let stdout = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let store = store.clone();
            let stdout = Arc::clone(&stdout);
            writers.push(tokio::spawn(async move {
                let mut seq = start + w;
                loop {
                    store.ingest(seq_request(seq)).await?;
                    let mut out = stdout.lock().expect("stdout lock");
                    writeln!(out, "ACK {seq}").expect("print ack");
                    out.flush().expect("flush stdout");
                    seq += WRITERS;
                    if seq > u64::MAX / 2 {
                        return Ok::<(), kiln_storage::StorageError>(());
                    }
                }
            }));
        }
        for w in writers {
            w.await.expect("writer task").expect("child ingest");
        }
    });
}

/// Runs one child until it has acknowledged `acks` profiles, then SIGKILLs it.
fn run_child_and_kill(dir: &Path, start: u64, acks: usize) -> Vec<u64> {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_START_ENV, start.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut acked = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child stdout");
        if let Some(seq) = line.strip_prefix("ACK ") {
            acked.push(seq.trim().parse::<u64>().expect("seq number"));
            if acked.len() >= acks {
                break;
            }
        }
    }
    // std's kill sends SIGKILL on Unix: no destructors, no shutdown flush.
    child.kill().expect("SIGKILL child");
    let status = child.wait().expect("reap child");
    assert!(
        !status.success(),
        "child was killed, not finished: {status}"
    );
    assert_eq!(
        acked.len(),
        acks,
        "child acknowledged fewer profiles than expected"
    );
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_profile_survives_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut acked = run_child_and_kill(dir.path(), 0, 500);
    // A second life on the same directory: it must recover, then crash again.
    acked.extend(run_child_and_kill(dir.path(), 1_000_000, 500));

    let store = Store::open(
        config(&dir.path().join("data"), "crash"),
        local_bucket(&dir.path().join("bucket")),
    )
    .await
    .expect("reopen after crash");
    let mut missing = Vec::new();
    for &seq in &acked {
        let selector = Selector {
            profile_type: cpu_type(),
            matchers: vec![Matcher {
                name: "seq".into(),
                op: MatchOp::Equal,
                value: seq.to_string(),
            }],
        };
        let got = total(&store, &selector, everything()).await;
        let (_, want) = cpu_profile(seq, PROFILE_SAMPLES);
        if got != want {
            missing.push((seq, got, want));
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged profiles wrong after SIGKILL (seq, got, want): {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        !store.blocks().is_empty(),
        "the background flush wrote blocks before the kills"
    );
}
