//! Object storage through the server: data written to one `kiln-store`
//! survives on S3 when the next process starts with an empty local disk,
//! replicas sharing the bucket answer for each other's data after the
//! flush interval, compaction racing queries and a long-retried upload
//! neither loses nor doubles anything, and a replica name is held by one
//! live store at a time, so that replicas sharing a bucket cannot delete,
//! duplicate or hide each other's data.
//!
//! The restart and the replicas' flush run on SeaweedFS, a real
//! distributed object store, through its S3 gateway (`seaweedfs_` tests,
//! which `./kiln-dev test` runs once its background build of SeaweedFS is
//! done): real listings, real latency. The race runs on `moto_server`, a
//! mock, behind a proxy that refuses and slows chosen requests, which a
//! real server cannot be made to do; the live-name test too (see there).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use kiln_testkit::buckets::s3_proxy::S3Proxy;
use kiln_testkit::http::{enc, free_port, get, http};
use kiln_testkit::moto::{AWS_ENV, Moto, start_moto};
use kiln_testkit::seaweedfs::{SeaweedFs, start_seaweedfs};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// A fresh SeaweedFS with `bucket`, or `None` (said, and failed in CI)
/// when it is not built.
fn seaweedfs_with(bucket: &str) -> Option<SeaweedFs> {
    let server = start_seaweedfs()?;
    server.create_bucket(bucket);
    Some(server)
}

/// The flags of a store on the S3 endpoint at `port`.
fn s3_args(port: u16, bucket: &str, replica: &str, extra: &[&str]) -> Vec<String> {
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut args = kiln_testkit::moto::s3_store_flags(&endpoint, bucket);
    args.extend(
        [
            "--bucket-prefix",
            "cluster-a",
            "--replica",
            replica,
            "--flush-interval",
            "1s",
            "--relist-interval",
            "1s",
        ]
        .map(str::to_owned),
    );
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn s3_store_at(port: u16, bucket: &str, replica: &str, extra: &[&str]) -> StoreProcess {
    let args = s3_args(port, bucket, replica, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &args,
        &AWS_ENV,
    )
}

fn s3_store(moto: &Moto, bucket: &str, replica: &str) -> StoreProcess {
    s3_store_at(moto.port, bucket, replica, &[])
}

fn seaweedfs_store(server: &SeaweedFs, bucket: &str, replica: &str) -> StoreProcess {
    s3_store_at(server.s3_port, bucket, replica, &[])
}

fn ingest_folded(store: &StoreProcess, app: &str) {
    let response = http(
        store.addr,
        "POST",
        &format!("/ingest?name={app}.cpu&from=now-10s&until=now&sampleRate=100"),
        &[],
        b"main;replicated_work 7",
    )
    .expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
}

fn total_for(store: &StoreProcess, app: &str) -> i64 {
    let query = enc(&format!(r#"process_cpu{{service_name="{app}"}}"#));
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    if response.status != 200 {
        return 0;
    }
    response.json()["total"].as_i64().unwrap_or(0)
}

#[test]
fn seaweedfs_data_on_s3_survives_a_restart_with_an_empty_local_disk() {
    let Some(server) = seaweedfs_with("kiln-server-restart") else {
        return;
    };
    let first = seaweedfs_store(&server, "kiln-server-restart", "r0");
    ingest_folded(&first, "persisted");
    assert_eq!(total_for(&first, "persisted"), 70_000_000);
    // SIGTERM flushes the head to the bucket; the local disk is thrown away.
    drop(first.stop());
    let second = seaweedfs_store(&server, "kiln-server-restart", "r0");
    assert_eq!(total_for(&second, "persisted"), 70_000_000);
}

#[test]
fn seaweedfs_a_replica_answers_for_data_written_to_another_after_the_flush_interval() {
    let Some(server) = seaweedfs_with("kiln-server-replicas") else {
        return;
    };
    let writer = seaweedfs_store(&server, "kiln-server-replicas", "writer");
    let reader = seaweedfs_store(&server, "kiln-server-replicas", "reader");
    ingest_folded(&writer, "shared");
    // Flush every 1 s and re-list every 1 s: poll until the block shows up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let total = total_for(&reader, "shared");
        if total == 70_000_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reader never saw the writer's block (total {total})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // And the other way round: both replicas answer for everything.
    ingest_folded(&reader, "from-reader");
    let deadline = Instant::now() + Duration::from_secs(30);
    while total_for(&writer, "from-reader") != 70_000_000 {
        assert!(
            Instant::now() < deadline,
            "the writer never saw the reader's block"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What one profile of the race test adds: 7 samples at 100 Hz, in ns.
const PROFILE_TOTAL: i64 = 70_000_000;

/// Acknowledged and sent profiles of one app, by one writer.
#[derive(Default)]
struct Sent {
    sent: AtomicI64,
    acked: AtomicI64,
}

/// Sends `rounds` profiles of `app`, all in one past hour (so every
/// replica's compaction merges them while they arrive), counting what the
/// store acknowledged.
fn write_past_hour(store: SocketAddr, app: &str, time_s: i64, rounds: usize, sent: &Sent) {
    for _ in 0..rounds {
        sent.sent.fetch_add(PROFILE_TOTAL, Ordering::SeqCst);
        let target = format!(
            "/ingest?name={app}.cpu&from={time_s}&until={}&sampleRate=100",
            time_s + 10
        );
        match http(store, "POST", &target, &[], b"main;replicated_work 7") {
            Ok(response) if response.status == 200 => {
                sent.acked.fetch_add(PROFILE_TOTAL, Ordering::SeqCst);
            }
            // Refused (upload backlog, overload): not acknowledged, so it
            // must not be counted, and is not.
            Ok(_) | Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(120));
    }
}

/// The total a replica answers for `app` over the past six hours, or the
/// error it answers instead (never a partial 200).
fn past_total(store: SocketAddr, app: &str) -> Result<i64, String> {
    let query = enc(&format!(r#"process_cpu{{service_name="{app}"}}"#));
    let response = http(
        store,
        "GET",
        &format!("/api/v1/flamegraph?query={query}&from=now-6h"),
        &[],
        b"",
    )
    .map_err(|e| e.to_string())?;
    if response.status != 200 {
        return Err(format!("{} {}", response.status, response.json()["reason"]));
    }
    Ok(response.json()["total"].as_i64().unwrap_or(0))
}

/// Every object key in `bucket` under `prefix` (moto does not check
/// signatures, so a plain ListObjectsV2 request does).
fn list_keys(moto: &Moto, bucket: &str, prefix: &str) -> Vec<String> {
    let response = http(
        SocketAddr::from(([127, 0, 0, 1], moto.port)),
        "GET",
        &format!("/{bucket}?list-type=2&max-keys=1000&prefix={}", enc(prefix)),
        &[],
        b"",
    )
    .expect("list bucket");
    assert_eq!(response.status, 200, "{}", response.text());
    let text = response.text();
    assert!(
        !text.contains("<IsTruncated>true"),
        "more than 1000 objects"
    );
    text.split("<Key>")
        .skip(1)
        .filter_map(|rest| rest.split("</Key>").next())
        .map(str::to_string)
        .collect()
}

fn get_object(moto: &Moto, bucket: &str, key: &str) -> serde_json::Value {
    // Anonymous object reads are refused; moto checks only that a request
    // is signed, not the signature.
    let signed = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";
    let response = http(
        SocketAddr::from(([127, 0, 0, 1], moto.port)),
        "GET",
        &format!("/{bucket}/{key}"),
        &[("Authorization", signed)],
        b"",
    )
    .expect("get object");
    assert_eq!(response.status, 200, "{key}: {}", response.text());
    response.json()
}

#[test]
fn compaction_racing_queries_and_a_long_retried_upload_loses_and_doubles_nothing() {
    let Some(moto) = start_moto() else { return };
    moto.create_bucket("kiln-server-race");
    // Replica a reaches the bucket through a proxy that, for a while,
    // refuses every meta.json: its blocks' data lands, their meta.json does
    // not, and its uploads (and compactions) are retried until it heals.
    // Both read blocks' data slowly, so a query is still reading the blocks
    // it listed when a compaction (its own replica's, or the other's)
    // deletes some of them.
    let proxy = S3Proxy::start(moto.port);
    proxy.data_get_delay_ms.store(150, Ordering::SeqCst);
    let slow = S3Proxy::start(moto.port);
    slow.data_get_delay_ms.store(150, Ordering::SeqCst);
    let fast = ["--compaction-interval", "1s"];
    let a = s3_store_at(proxy.port, "kiln-server-race", "a", &fast);
    let b = s3_store_at(slow.port, "kiln-server-race", "b", &fast);
    let now_s = kiln_testkit::clock::now_s();
    // Three hours ago: a complete, settled hour that compaction merges.
    let time_s = now_s - 3 * 3600;
    let (from_a, from_b) = (Sent::default(), Sent::default());
    let writing = AtomicBool::new(true);
    let mut answered = 0u64;
    let mut last_answer: std::collections::BTreeMap<(SocketAddr, &str), i64> = Default::default();
    let mut refused: std::collections::BTreeMap<String, u64> = Default::default();
    proxy.refuse_meta_puts.store(true, Ordering::SeqCst);
    std::thread::scope(|scope| {
        let writers = [
            scope.spawn(|| write_past_hour(a.addr, "from-a", time_s, 60, &from_a)),
            scope.spawn(|| write_past_hour(b.addr, "from-b", time_s, 60, &from_b)),
        ];
        scope.spawn(|| {
            std::thread::sleep(Duration::from_secs(8));
            proxy.refuse_meta_puts.store(false, Ordering::SeqCst);
        });
        // Queries on both replicas while blocks are written, compacted and
        // their sources deleted. A replica always answers for everything
        // it acknowledged itself (head, pending uploads, blocks); nobody
        // ever answers more than was sent (nothing doubled).
        while writing.load(Ordering::SeqCst) {
            for (replica, own, other) in [
                (a.addr, ("from-a", &from_a), ("from-b", &from_b)),
                (b.addr, ("from-b", &from_b), ("from-a", &from_a)),
            ] {
                let own_floor = own.1.acked.load(Ordering::SeqCst);
                let own_total = past_total(replica, own.0);
                let other_total = past_total(replica, other.0);
                for (total, app, floor, sent) in [
                    (own_total, own.0, own_floor, own.1),
                    (other_total, other.0, 0, other.1),
                ] {
                    let total = match total {
                        Ok(total) => total,
                        // Before anything of `app` is acknowledged (or, on
                        // the other replica, visible), its type is unknown.
                        Err(reason) if reason.contains("selector_unknown_profile_type") => {
                            assert_eq!(floor, 0, "{replica} lost {app}'s type");
                            *refused.entry(reason).or_insert(0u64) += 1;
                            continue;
                        }
                        // Anything else must be a refusal, never a 200.
                        Err(reason) => {
                            *refused.entry(reason).or_insert(0u64) += 1;
                            continue;
                        }
                    };
                    answered += 1;
                    let ceiling = sent.sent.load(Ordering::SeqCst);
                    assert!(
                        floor <= total && total <= ceiling,
                        "{replica} answered {total} for {app}: acknowledged {floor} before the query, sent {ceiling}"
                    );
                    // Nothing is deleted here (no retention), so what a
                    // replica once answered for, it answers for again: a
                    // smaller total is a block skipped.
                    let seen = last_answer.entry((replica, app)).or_insert(0);
                    assert!(
                        total >= *seen,
                        "{replica} answered {total} for {app} after answering {seen}"
                    );
                    *seen = total;
                }
            }
            if writers.iter().all(|w| w.is_finished()) {
                writing.store(false, Ordering::SeqCst);
            }
        }
    });
    assert!(
        proxy.refused.load(Ordering::SeqCst) > 0,
        "replica a's uploads were refused for a while"
    );
    let expected_a = from_a.acked.load(Ordering::SeqCst);
    let expected_b = from_b.acked.load(Ordering::SeqCst);
    assert!(expected_a > 0 && expected_b > 0);
    // Once every upload is through, both replicas answer exactly what was
    // acknowledged, for both writers, while compaction goes on.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let totals = [
            past_total(a.addr, "from-a"),
            past_total(a.addr, "from-b"),
            past_total(b.addr, "from-a"),
            past_total(b.addr, "from-b"),
        ];
        let want = [expected_a, expected_b, expected_a, expected_b].map(Ok);
        if totals == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas never converged: {totals:?}, acknowledged a={expected_a} b={expected_b}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = writeln!(
        std::io::stderr(),
        "race: {answered} query answers checked, refused as errors: {refused:?}; {} meta.json puts refused",
        proxy.refused.load(Ordering::SeqCst)
    );
    // Stopped first (a clean shutdown flushes and releases their names):
    // a replica still compacting deletes the sources it merged between the
    // listing below and the reads of their meta.json (CI once read a 404).
    drop(a.stop());
    drop(b.stop());
    // Both replicas compacted while this ran (the race happened), each only
    // its own blocks, and every upload was completed: no block directory
    // without its meta.json is left, none at the old layout.
    let keys = list_keys(&moto, "kiln-server-race", "cluster-a/blocks/");
    let mut dirs: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for key in &keys {
        let (dir, file) = key.rsplit_once('/').expect("block file");
        dirs.entry(dir.to_string())
            .or_default()
            .push(file.to_string());
    }
    for replica in ["a", "b"] {
        let compacted = dirs
            .keys()
            .filter(|dir| dir.starts_with(&format!("cluster-a/blocks/{replica}/")))
            .map(|dir| get_object(&moto, "kiln-server-race", &format!("{dir}/meta.json")))
            .filter(|meta| meta["compaction_level"].as_u64() >= Some(1))
            .inspect(|meta| assert_eq!(meta["replica"], replica))
            .count();
        assert!(compacted >= 1, "replica {replica} compacted: {keys:?}");
    }
    for (dir, files) in &dirs {
        assert_eq!(dir.split('/').count(), 4, "per-replica layout: {dir}");
        assert!(files.contains(&"meta.json".to_string()), "{dir}: {files:?}");
    }
    // Restarted with empty disks, the bucket alone still holds each value
    // once.
    let fresh = s3_store(&moto, "kiln-server-race", "c");
    assert_eq!(past_total(fresh.addr, "from-a"), Ok(expected_a));
    assert_eq!(past_total(fresh.addr, "from-b"), Ok(expected_b));
}

/// On moto: on a freshly started SeaweedFS the first store's lease PUTs
/// failed for their first seconds ("error sending request" after 3 s, in
/// both of two runs here), so it opened without its lease, as it should,
/// and the second store then took the name, rightly; this test needs the
/// first store to hold its name, which nothing outside it shows.
#[test]
fn a_second_store_with_a_live_replica_name_exits_instead_of_starting() {
    let Some(moto) = start_moto() else { return };
    moto.create_bucket("kiln-server-names");
    let first = s3_store(&moto, "kiln-server-names", "shared-name");
    let data_dir = tempfile::tempdir().expect("temp dir");
    let listen = free_port();
    let mut second = Command::new(env!("CARGO_BIN_EXE_kiln-store"))
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--data-dir")
        .arg(data_dir.path())
        .args(s3_args(moto.port, "kiln-server-names", "shared-name", &[]))
        .env("KILN_LOG", "warn")
        .envs(AWS_ENV)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the second kiln-store");
    // The first renews its lease every 10 s; the second sees that and exits.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = second.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("the second store with a live name kept running");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stderr = String::new();
    second
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(!status.success(), "{status}");
    assert!(
        stderr.contains(r#"replica name "shared-name" is held by another live store"#),
        "{stderr}"
    );
    // The first is unaffected; once it stops (releasing the name), a store
    // with that name starts at once.
    ingest_folded(&first, "still-here");
    assert_eq!(total_for(&first, "still-here"), 70_000_000);
    drop(first.stop());
    let successor = s3_store(&moto, "kiln-server-names", "shared-name");
    assert_eq!(total_for(&successor, "still-here"), 70_000_000);
}
