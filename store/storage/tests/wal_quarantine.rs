//! A record in the write-ahead log that the engine cannot apply (written
//! by a bug, a disk error or a hostile upload) used to fail, or crash,
//! every recovery: a crash loop that kept the store down for good. Now replay sets it aside in
//! `<data dir>/wal-quarantine/`, counts it, and goes on with the records
//! after it.

use kiln_engine::model::{Label, LabelSet};
use kiln_storage::wal::record::decode_payload;
use kiln_storage::wal::{Wal, WalRecord};
use kiln_testkit::profiles::*;

/// Appends `records` to the store's WAL with the real writer, as a store
/// that logged them would have.
async fn log_with_the_real_writer(data_dir: &std::path::Path, records: &[WalRecord]) {
    let (wal, _) = Wal::open(&data_dir.join("wal"), 64 << 20, |_| {}).expect("open WAL");
    for record in records {
        wal.append(record).await.expect("append");
    }
}

fn quarantined_payloads(data_dir: &std::path::Path) -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(data_dir.join("wal-quarantine"))
        .expect("quarantine directory exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "payload"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("read payload"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_fails_replay_is_quarantined_and_recovery_goes_on() {
    let root = tempfile::tempdir().expect("tempdir");
    let data_dir = root.path().join("data");
    let store = open_local(root.path()).await;
    let (a, total_a) = cpu_profile(1, 50);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest a");
    drop(store);

    // A record the engine refuses (no `__name__`; a store never logs one
    // now), followed by a good one in the same segment.
    let (c, total_c) = cpu_profile(3, 40);
    let poison = WalRecord {
        labels: LabelSet::new(vec![Label::new("pod", "poison")]),
        time_ms: BASE_MS,
        duration_nanos: DURATION_NANOS,
        pprof: cpu_profile(2, 10).0,
        idempotency_key: None,
    };
    let good = WalRecord {
        labels: labels("pod-c"),
        time_ms: BASE_MS + 1_000,
        duration_nanos: DURATION_NANOS,
        pprof: c,
        idempotency_key: None,
    };
    log_with_the_real_writer(&data_dir, &[poison.clone(), good]).await;

    let store = open_local(root.path()).await;
    let report = store.replay_report().clone();
    assert_eq!(report.quarantined_records, 1, "{report:?}");
    assert_eq!(report.records, 3, "{report:?}");
    assert_eq!(
        total(&store, &pod_selector("pod-a"), everything()).await,
        total_a
    );
    assert_eq!(
        total(&store, &pod_selector("pod-c"), everything()).await,
        total_c
    );
    let payloads = quarantined_payloads(&data_dir);
    assert_eq!(payloads.len(), 1);
    assert_eq!(
        decode_payload(&payloads[0]).expect("intact payload"),
        poison
    );

    // It serves: a new write lands and is queryable.
    let (d, total_d) = cpu_profile(4, 30);
    store
        .ingest(request("pod-d", BASE_MS + 2_000, d))
        .await
        .expect("ingest after recovery");
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_c + total_d
    );
    // Once flushed, the segment holding the poison record is gone; the
    // quarantined copy stays for the operator.
    store.flush().await.expect("flush");
    drop(store);
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().quarantined_records, 0);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_c + total_d
    );
    assert_eq!(quarantined_payloads(&data_dir).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_does_not_parse_is_quarantined_too() {
    let root = tempfile::tempdir().expect("tempdir");
    let data_dir = root.path().join("data");
    let store = open_local(root.path()).await;
    let (a, total_a) = cpu_profile(1, 50);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest a");
    drop(store);
    // Garbage pprof bytes behind a valid frame: decode fails on replay.
    let garbage = WalRecord {
        labels: labels("pod-b"),
        time_ms: BASE_MS,
        duration_nanos: DURATION_NANOS,
        pprof: b"\x1f\x8bnot gzip at all".to_vec(),
        idempotency_key: None,
    };
    log_with_the_real_writer(&data_dir, &[garbage]).await;
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().quarantined_records, 1);
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
    let reason = std::fs::read_dir(data_dir.join("wal-quarantine"))
        .expect("quarantine directory")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "reason"))
        .map(|p| std::fs::read_to_string(p).expect("reason"))
        .expect("a reason file");
    assert!(reason.contains("invalid profile"), "{reason}");
}
