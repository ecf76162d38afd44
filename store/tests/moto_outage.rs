//! Issue 15's outage test: under steady ingest, the bucket (`moto_server`)
//! stops answering for a while. The store, in a memory cgroup limited to its
//! `--memory-budget`, keeps taking writes until the data waiting for upload
//! reaches its budget, then refuses them with a retryable 503
//! `upload_backlog`; its peak RSS stays within the budget and nothing is
//! OOM-killed. When moto answers again the backlog drains, and a second
//! store with an empty disk finds every acknowledged sample in the bucket.
//! The numbers it prints are recorded in
//! `docs/benchmarks/log/2026-11-25-store-hostile-requests.md`.

use std::io::Write;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kiln_testkit::http::{HttpResponse, enc, free_port, get, http};
use kiln_testkit::memory_cgroup::{LimitedCgroup, status_kib};
use kiln_testkit::moto::{AWS_ENV, start_moto};
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

const BUDGET: u64 = 192 << 20;
/// Folded lines per request, each its own new stack (so the head grows),
/// each 1 sample at 100 Hz: 10 ms.
const LINES: i64 = 100;
const NANOS_PER_REQUEST: i64 = LINES * 10_000_000;
/// Refusals to see before the bucket comes back.
const REFUSALS_WANTED: u64 = 50;

fn body(request: u64) -> Vec<u8> {
    let mut text = String::new();
    for line in 0..LINES {
        text.push_str(&format!("main;handler_{request};step_{request}_{line} 1\n"));
    }
    text.into_bytes()
}

fn ingest(addr: SocketAddr, request: u64) -> HttpResponse {
    http(
        addr,
        "POST",
        "/ingest?name=outage.cpu&from=now-10s&until=now&sampleRate=100",
        &[],
        &body(request),
    )
    .expect("ingest")
}

fn metric(addr: SocketAddr, name: &str) -> Option<u64> {
    let text = get(addr, "/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn stored_total(addr: SocketAddr) -> i64 {
    let query = enc(r#"process_cpu{service_name="outage"}"#);
    let response = get(
        addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("kiln-partial"), None, "a complete answer");
    response.json()["total"].as_i64().expect("total")
}

#[test]
fn a_bucket_outage_under_load_stays_within_budget_refuses_with_503_and_loses_nothing() {
    let Some(moto) = start_moto() else {
        return;
    };
    let Some(cgroup) = LimitedCgroup::create_or_skip(BUDGET) else {
        return;
    };
    moto.create_bucket("kiln-outage");
    let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let addr = free_port();
    let child = cgroup
        .command(env!("CARGO_BIN_EXE_kiln-store"))
        .arg(format!("--listen={addr}"))
        .arg(format!("--data-dir={}", data_dir.path().display()))
        .arg(format!("--memory-budget={BUDGET}"))
        .args(moto.store_flags("kiln-outage"))
        .args(["--flush-interval=1s", "--relist-interval=1s"])
        .envs(AWS_ENV)
        .env("KILN_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn kiln-store in the limited cgroup");
    let pid = child.id();
    let mut store = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(addr, "GET", "/readyz", &[], b"").map_or(true, |r| r.status != 200) {
        assert!(Instant::now() < deadline, "kiln-store not ready in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut request = 0;
    let mut acknowledged = 0;
    // Steady load with the bucket up: blocks reach it every second.
    for _ in 0..100 {
        request += 1;
        let response = ingest(addr, request);
        assert_eq!(response.status, 200, "{}", response.text());
        acknowledged += 1;
    }
    std::thread::sleep(Duration::from_secs(2));

    // The bucket stops answering; the same load goes on.
    moto.pause();
    let outage = Instant::now();
    let mut refused = 0;
    let mut acknowledged_during = 0;
    while refused < REFUSALS_WANTED {
        request += 1;
        let response = ingest(addr, request);
        match response.status {
            200 => {
                acknowledged += 1;
                acknowledged_during += 1;
            }
            503 => {
                assert!(
                    response.text().contains("upload_backlog"),
                    "{}",
                    response.text()
                );
                assert_eq!(response.header("retry-after"), Some("1"));
                refused += 1;
                // A client backing off as told, briefly.
                std::thread::sleep(Duration::from_millis(20));
            }
            other => panic!("ingest during the outage: {other} {}", response.text()),
        }
        assert!(
            request < 200_000,
            "the upload budget never filled ({acknowledged_during} writes taken)"
        );
    }
    let filled_after = outage.elapsed();
    let readyz = get(addr, "/readyz");
    assert_eq!(readyz.status, 503, "{}", readyz.text());
    assert!(
        readyz.text().contains("upload_backlog: "),
        "{}",
        readyz.text()
    );
    let waiting = metric(addr, "kiln_pending_uploads").expect("pending uploads gauge");
    assert!(waiting >= 1, "{waiting} heads wait for upload");
    let hwm_outage_kib = status_kib(pid, "VmHWM:").expect("VmHWM");

    // The bucket answers again: the backlog drains and writes resume.
    moto.resume();
    let back = Instant::now();
    let deadline = back + Duration::from_secs(300);
    loop {
        let ready = get(addr, "/readyz");
        if ready.status == 200 && metric(addr, "kiln_pending_uploads") == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the backlog never drained: {}",
            ready.text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let drained_after = back.elapsed();
    for _ in 0..20 {
        request += 1;
        let response = ingest(addr, request);
        assert_eq!(response.status, 200, "{}", response.text());
        acknowledged += 1;
    }
    assert_eq!(stored_total(addr), acknowledged * NANOS_PER_REQUEST);
    let hwm_kib = status_kib(pid, "VmHWM:").expect("VmHWM");
    assert_eq!(cgroup.oom_kills(), 0, "the store was OOM-killed");
    assert!(
        hwm_kib << 10 <= BUDGET,
        "peak RSS {} MiB over the {} MiB budget",
        hwm_kib >> 10,
        BUDGET >> 20
    );

    // SIGTERM flushes the head; then a store with an empty disk reads
    // everything acknowledged back from the bucket alone.
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    let rc = unsafe { libc::kill(i32::try_from(pid).expect("pid"), libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = store.0.wait().expect("wait for the store");
    assert!(status.success(), "kiln-store exited with {status}");
    let mut flags = moto.store_flags("kiln-outage");
    flags.push("--replica=reader".to_owned());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let reader = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &flags,
        &AWS_ENV,
    );
    assert_eq!(
        stored_total(reader.addr),
        acknowledged * NANOS_PER_REQUEST,
        "every acknowledged write is in the bucket"
    );
    let _ = writeln!(
        std::io::stderr(),
        "outage: {acknowledged} writes acknowledged ({acknowledged_during} during the outage), \
         {refused} refused with 503 upload_backlog after {filled_after:?} of outage; \
         {waiting} heads were waiting; drained {drained_after:?} after the bucket returned; \
         VmHWM {} MiB during the outage, {} MiB at the end (budget {} MiB); 0 OOM kills",
        hwm_outage_kib >> 10,
        hwm_kib >> 10,
        BUDGET >> 20
    );
}
