//! `/readyz` tells the truth: 503 while the store recovers and while its
//! bucket does not answer, with the reason; 200 again once a bucket that
//! came back answers. `/healthz` (liveness) stays 200 throughout, so
//! Kubernetes does not restart a store that waits for its bucket. (A
//! write-ahead log that cannot write is `wal_disk_full.rs`.)

use std::net::TcpListener;
use std::time::{Duration, Instant};

use kiln_testkit::http::{HttpResponse, enc, get, http, post_folded};
use kiln_testkit::moto::{AWS_ENV, start_moto};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

fn post(store: &StoreProcess, app: &str) -> HttpResponse {
    post_folded(store.addr, app, b"main;work 7")
}

fn total_for(store: &StoreProcess, app: &str) -> i64 {
    let query = enc(&format!(r#"process_cpu{{service_name="{app}"}}"#));
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()["total"].as_i64().unwrap_or(0)
}

/// Polls `/readyz` until `done` holds for its (status, text), for at most
/// `limit`; returns the last answer.
#[track_caller]
fn wait_readyz(
    store: &StoreProcess,
    limit: Duration,
    done: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    let deadline = Instant::now() + limit;
    loop {
        let response = get(store.addr, "/readyz");
        let (status, text) = (response.status, response.text());
        if done(status, &text) {
            return (status, text);
        }
        assert!(
            Instant::now() < deadline,
            "readyz never changed as expected: {status} {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_store_that_cannot_list_its_bucket_is_live_and_not_ready_and_serves_from_its_wal() {
    // A bucket endpoint that accepts connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().expect("addr"));
    let store = StoreProcess::start_live(
        KILN_STORE,
        &[
            "--object-store",
            "s3",
            "--bucket",
            "never",
            "--bucket-endpoint",
            &endpoint,
            "--bucket-allow-http",
            "true",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ],
    );
    // While the first listing is awaited (at most 10 s), the store is
    // recovering: nothing is served yet.
    let ready = get(store.addr, "/readyz");
    assert_eq!(ready.status, 503, "{}", ready.text());
    if ready.text().contains("recovering") {
        let ingest = http(store.addr, "POST", "/ingest?name=app", &[], b"main 1").expect("ingest");
        assert_eq!(ingest.status, 503, "{}", ingest.text());
        assert!(ingest.text().contains("not ready"), "{}", ingest.text());
    }
    // Then it opens without the bucket's blocks: still not ready, saying
    // why, but live and serving what it has.
    let (status, text) = wait_readyz(&store, Duration::from_secs(60), |_, text| {
        !text.contains("recovering")
    });
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("bucket_not_listed: "), "{text}");
    assert!(text.contains("bucket_unreachable: "), "{text}");
    assert_eq!(get(store.addr, "/healthz").status, 200);
    let ingest = post(&store, "waiting");
    assert_eq!(ingest.status, 200, "{}", ingest.text());
    assert_eq!(total_for(&store, "waiting"), 70_000_000);
    assert!(
        get(store.addr, "/metrics")
            .text()
            .contains("kiln_ready 0\n")
    );
}

#[test]
fn an_unreachable_bucket_makes_readyz_fail_with_the_reason_until_it_answers_again() {
    let Some(moto) = start_moto() else {
        return;
    };
    moto.create_bucket("kiln-readiness");
    let mut flags = moto.store_flags("kiln-readiness");
    flags.extend(["--flush-interval", "1s", "--relist-interval", "1s"].map(str::to_owned));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &flags,
        &AWS_ENV,
    );
    assert_eq!(post(&store, "before").status, 200);

    moto.pause();
    let (_, text) = wait_readyz(&store, Duration::from_secs(120), |status, _| status == 503);
    assert!(text.starts_with("not ready\n"), "{text}");
    assert!(text.contains("bucket_unreachable: "), "{text}");
    // Live, taking writes into the WAL, answering from what it holds.
    assert_eq!(get(store.addr, "/healthz").status, 200);
    let during = post(&store, "during");
    assert_eq!(during.status, 200, "{}", during.text());
    assert_eq!(total_for(&store, "before"), 70_000_000);
    assert_eq!(total_for(&store, "during"), 70_000_000);

    moto.resume();
    let (_, text) = wait_readyz(&store, Duration::from_secs(120), |status, _| status == 200);
    assert!(text.starts_with("ready\n"), "{text}");
    assert_eq!(total_for(&store, "during"), 70_000_000);
}
