//! Store behaviour on a local bucket: persistence across reopen, corrupt
//! blocks, torn WAL tails, retention and compaction.

use std::io::Write;
use std::time::Duration;

use kiln_engine::model::TimeRange;
use kiln_storage::planner::HOUR_MS;
use kiln_storage::{ErrorClass, IngestRequest, StorageError, Store};
use kiln_testkit::profiles::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_flush_and_reopen_from_blocks_and_wal() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_local(root.path()).await;
    let (a, total_a) = cpu_profile(1, 50);
    let (b, total_b) = cpu_profile(2, 60);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest a");
    store.flush().await.expect("flush");
    // This one stays in the WAL only.
    store
        .ingest(request("pod-b", BASE_MS + 10_000, b))
        .await
        .expect("ingest b");
    assert_eq!(store.blocks().len(), 1);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_b
    );
    drop(store);

    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 1);
    assert_eq!(
        total(&store, &pod_selector("pod-a"), everything()).await,
        total_a
    );
    assert_eq!(
        total(&store, &pod_selector("pod-b"), everything()).await,
        total_b
    );
    let pods = store
        .label_values("pod", &[], everything())
        .await
        .expect("label values");
    assert_eq!(pods, vec!["pod-a".to_string(), "pod-b".to_string()]);
    store.shutdown().await.expect("shutdown");

    // After a clean shutdown everything is in blocks and nothing is replayed.
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 0);
    assert_eq!(store.blocks().len(), 2);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_b
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_block_is_reported_and_skipped_while_others_stay_queryable() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_local(root.path()).await;
    let (a, total_a) = cpu_profile(1, 40);
    let (b, _) = cpu_profile(2, 40);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest");
    store.flush().await.expect("flush");
    store
        .ingest(request("pod-b", BASE_MS + 10_000, b))
        .await
        .expect("ingest");
    store.flush().await.expect("flush");
    let blocks = store.blocks();
    assert_eq!(blocks.len(), 2);
    store.shutdown().await.expect("shutdown");
    drop(store);

    // Overwrite pod-b's block data with garbage.
    let victim = &blocks
        .iter()
        .find(|b| b.min_time_ms == BASE_MS + 10_000)
        .expect("pod-b's block")
        .id;
    let data = root
        .path()
        .join("bucket/blocks/r1")
        .join(victim)
        .join("data");
    std::fs::write(&data, b"this is not a block").expect("overwrite block");

    let store = open_local(root.path()).await;
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
    let corrupt = store.corrupt_blocks();
    assert_eq!(corrupt.len(), 1);
    assert_eq!(&corrupt[0].id, victim);
    assert_eq!(store.stats().corrupt_blocks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_wal_tail_loses_only_the_unacknowledged_write() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_local(root.path()).await;
    let (a, total_a) = cpu_profile(3, 30);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest");
    drop(store);
    // A crash mid-append leaves half a frame at the end of the last segment.
    let wal = root.path().join("data/wal");
    let mut segments: Vec<_> = std::fs::read_dir(&wal)
        .expect("wal dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    segments.sort();
    let first = segments.first().expect("a segment");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(first)
        .expect("open segment");
    file.write_all(&[200, 1, 0, 0, 1, 2, 3, 4, 9, 9])
        .expect("write torn frame");
    drop(file);

    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 1);
    assert_eq!(store.replay_report().skipped_bytes, 10);
    assert_eq!(store.replay_report().quarantined_segments, 1);
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_client_errors_and_leave_nothing_behind() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_local(root.path()).await;
    let err = store
        .ingest(request("pod-a", BASE_MS, b"\x1f\x8b garbage".to_vec()))
        .await
        .expect_err("garbage must be refused");
    assert!(matches!(err, StorageError::InvalidProfile { .. }), "{err}");
    assert_eq!(err.class(), ErrorClass::Client);
    assert!(!err.is_retryable());
    let (pprof, _) = cpu_profile(1, 5);
    let err = store
        .ingest(IngestRequest {
            labels: kiln_engine::model::LabelSet::default(),
            time_ms: Some(BASE_MS),
            duration_nanos: None,
            pprof: pprof.into(),
            writer: Default::default(),
        })
        .await
        .expect_err("no __name__");
    assert!(err.is_client_error());
    drop(store);
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 0);
    assert_eq!(total(&store, &all_selector(), everything()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_hours_then_the_day_so_far_then_the_day_and_keeps_totals() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_local(root.path()).await;
    let day0 = BASE_MS - BASE_MS.rem_euclid(24 * HOUR_MS);
    let mut expected = 0;
    async fn ingest_hour(store: &Store, day0: i64, hour: i64) -> i64 {
        let mut sum = 0;
        // Two level-0 blocks per hour, three pods each.
        for part in 0..2 {
            for pod in 0..3 {
                let t = day0 + hour * HOUR_MS + part * 600_000 + pod * 10_000;
                let (p, total) = cpu_profile((hour * 10 + part * 3 + pod) as u64, 20);
                sum += total;
                store
                    .ingest(request(&format!("pod-{pod}"), t, p))
                    .await
                    .expect("ingest");
            }
            store.flush().await.expect("flush");
        }
        sum
    }
    for hour in 0..4 {
        expected += ingest_hour(&store, day0, hour).await;
    }
    assert_eq!(store.blocks().len(), 8);
    let range = TimeRange {
        start_ms: day0,
        end_ms: day0 + 24 * HOUR_MS,
    };
    let before_all = total(&store, &all_selector(), range).await;
    let before_pod = total(&store, &pod_selector("pod-1"), range).await;
    assert_eq!(before_all, expected);

    // Mid-day: four hour blocks, then (four being enough) one day-so-far block.
    let report = store.compact(day0 + 12 * HOUR_MS).await.expect("compact");
    assert_eq!(report.written.len(), 5);
    assert_eq!(report.deleted, 12);
    let blocks = store.blocks();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].compaction_level, 2);
    assert_eq!(total(&store, &all_selector(), range).await, before_all);
    assert_eq!(
        total(&store, &pod_selector("pod-1"), range).await,
        before_pod
    );

    // Later that day one more hour arrives; the next day everything of the
    // day ends in one block.
    let late = ingest_hour(&store, day0, 13).await;
    let report = store.compact(day0 + 25 * HOUR_MS).await.expect("compact");
    assert_eq!(report.written.len(), 2, "the hour, then the day");
    let blocks = store.blocks();
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        total(&store, &all_selector(), range).await,
        before_all + late
    );

    // A reopened store sees the same, and the sources are gone from the bucket.
    drop(store);
    let store = open_local(root.path()).await;
    assert_eq!(store.blocks().len(), 1);
    assert_eq!(
        total(&store, &all_selector(), range).await,
        before_all + late
    );
    let objects = std::fs::read_dir(root.path().join("bucket/blocks/r1"))
        .expect("blocks dir")
        .count();
    assert_eq!(objects, 1, "compacted sources were deleted from the bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_blocks_and_keeps_recent_ones() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = config(&root.path().join("data"), "r1");
    config.retention = Duration::from_secs(24 * 3600);
    let store = Store::open(config, local_bucket(&root.path().join("bucket")))
        .await
        .expect("open");
    let (old, _) = cpu_profile(1, 10);
    let (new, total_new) = cpu_profile(2, 10);
    store
        .ingest(request("pod-a", BASE_MS, old))
        .await
        .expect("ingest");
    store.flush().await.expect("flush");
    store
        .ingest(request("pod-a", BASE_MS + 30 * HOUR_MS, new))
        .await
        .expect("ingest");
    store.flush().await.expect("flush");
    let deleted = store
        .enforce_retention(BASE_MS + 40 * HOUR_MS)
        .await
        .expect("retention");
    assert_eq!(deleted.len(), 1);
    assert_eq!(store.blocks().len(), 1);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_new
    );
    drop(store);
    let store = open_local(root.path()).await;
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_new
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_a_bucket_see_each_others_blocks_after_flush_and_relist() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = local_bucket(&root.path().join("bucket"));
    let one = Store::open(config(&root.path().join("one"), "one"), bucket.clone())
        .await
        .expect("open one");
    let two = Store::open(config(&root.path().join("two"), "two"), bucket)
        .await
        .expect("open two");
    let (p, total_p) = cpu_profile(5, 25);
    one.ingest(request("pod-a", BASE_MS, p))
        .await
        .expect("ingest");
    assert_eq!(total(&two, &all_selector(), everything()).await, 0);
    one.flush().await.expect("flush");
    two.refresh_blocks().await.expect("relist");
    assert_eq!(total(&two, &all_selector(), everything()).await, total_p);
    // Two does not compact one's blocks.
    let report = two.compact(BASE_MS + 48 * HOUR_MS).await.expect("compact");
    assert!(report.written.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_loop_flushes_on_its_interval() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = config(&root.path().join("data"), "r1");
    config.background = true;
    config.flush_interval = Duration::from_millis(100);
    let store = Store::open(config, local_bucket(&root.path().join("bucket")))
        .await
        .expect("open");
    let (p, total_p) = cpu_profile(5, 25);
    // Recent time: background retention runs on the real clock.
    store
        .ingest(request("pod-a", recent_ms(), p))
        .await
        .expect("ingest");
    let mut waited = 0;
    while store.blocks().is_empty() && waited < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(store.blocks().len(), 1, "the flush loop wrote a block");
    assert_eq!(total(&store, &all_selector(), everything()).await, total_p);
    store.shutdown().await.expect("shutdown");
    assert!(matches!(
        store
            .ingest(request("pod-a", BASE_MS, cpu_profile(1, 1).0))
            .await,
        Err(StorageError::ShuttingDown)
    ));
}

/// Rebuilds the state a crash between "block uploaded" and "WAL segments
/// deleted" leaves behind: the old segment and the flush marker are back.
fn restore_pre_cleanup_state(root: &std::path::Path, saved_segment: &[u8], block_id: &str) {
    let wal = root.join("data/wal");
    std::fs::write(wal.join(format!("{:020}.wal", 1)), saved_segment).expect("restore segment");
    std::fs::write(wal.join(format!("flush-{block_id}.marker")), "1 2\n").expect("restore marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_upload_and_wal_cleanup_neither_loses_nor_doubles_data() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_local(root.path()).await;
    let (a, total_a) = cpu_profile(8, 30);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest");
    let segment_path = root.path().join(format!("data/wal/{:020}.wal", 1));
    let saved = std::fs::read(&segment_path).expect("first segment holds the record");
    store.flush().await.expect("flush");
    assert!(!segment_path.exists(), "flush deleted the replaced segment");
    let block = store.blocks()[0].id.clone();
    drop(store);

    // Block present: the marker says the segment is already in it.
    restore_pre_cleanup_state(root.path(), &saved, &block);
    let store = open_local(root.path()).await;
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
    assert!(
        !segment_path.exists(),
        "recovery removed the covered segment"
    );
    drop(store);

    // Block missing (upload never finished): the segment is replayed.
    restore_pre_cleanup_state(root.path(), &saved, &block);
    std::fs::remove_dir_all(root.path().join("bucket/blocks/r1").join(&block)).expect("drop block");
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 1);
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_uploads_keep_data_queryable_then_refuse_writes_once_the_upload_budget_is_full() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket_dir = root.path().join("bucket");
    let mut config = config(&root.path().join("data"), "r1");
    // Every flush cuts (any head is "full"), and the heads waiting for
    // upload may hold 256 KiB on top of that.
    config.max_head_bytes = 1;
    config.max_pending_upload_bytes = 256 << 10;
    let budget = 1 + (256 << 10);
    let store = Store::open(config, local_bucket(&bucket_dir))
        .await
        .expect("open");
    // Make the bucket unwritable: its directory becomes a plain file.
    let parked = root.path().join("bucket-parked");
    std::fs::rename(&bucket_dir, &parked).expect("park bucket");
    std::fs::write(&bucket_dir, b"not a directory").expect("block bucket path");

    let mut expected = 0;
    let mut acknowledged = 0;
    let refusal = loop {
        let (p, t) = cpu_profile(30 + acknowledged, 20);
        match store
            .ingest(request("pod-a", BASE_MS + acknowledged as i64 * 10_000, p))
            .await
        {
            Ok(_) => {
                expected += t;
                acknowledged += 1;
                let err = store.flush().await.expect_err("upload must fail");
                assert!(err.is_retryable(), "{err}");
            }
            Err(err) => break err,
        }
        assert!(acknowledged < 10_000, "the upload budget never filled");
    };
    // ...refused (retryably) instead of growing memory, and only once the
    // bytes waiting for upload reached the budget.
    match &refusal {
        StorageError::UploadBacklog {
            pending,
            unuploaded_bytes,
            budget_bytes,
        } => {
            assert_eq!(*pending as u64, acknowledged);
            assert_eq!(*budget_bytes, budget);
            assert!(*unuploaded_bytes >= budget, "{refusal}");
        }
        other => panic!("expected UploadBacklog, got {other}"),
    }
    assert_eq!(refusal.class(), ErrorClass::Overloaded);
    assert!(refusal.is_retryable());
    assert!(acknowledged >= 2, "{acknowledged} heads fit the budget");
    let stats = store.stats();
    assert_eq!(stats.pending_uploads, acknowledged);
    assert_eq!(stats.flush_failures, acknowledged);
    // One profile's head is all the budget is overshot by.
    assert!(
        stats.pending_upload_bytes < budget + stats.pending_upload_bytes / acknowledged * 2,
        "{} bytes pending",
        stats.pending_upload_bytes
    );
    // Nothing acknowledged is lost from queries while the bucket is down.
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    let health = store.health();
    assert!(
        health
            .problems
            .iter()
            .any(|p| p.reason == "bucket_unreachable"),
        "{health:?}"
    );
    assert!(
        health.problems.iter().any(|p| p.reason == "upload_backlog"),
        "{health:?}"
    );

    // The bucket comes back: the backlog uploads in order and writes resume.
    std::fs::remove_file(&bucket_dir).expect("unblock");
    std::fs::rename(&parked, &bucket_dir).expect("restore bucket");
    store.flush().await.expect("flush after recovery");
    assert!(store.health().is_ready(), "{:?}", store.health());
    assert_eq!(store.stats().pending_uploads, 0);
    assert_eq!(store.blocks().len() as u64, acknowledged);
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    store
        .ingest(request("pod-a", BASE_MS, cpu_profile(41, 5).0))
        .await
        .expect("ingest after recovery");
    drop(store);
    // The WAL segments the blocks replaced are gone: only the last write replays.
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 1);
}
