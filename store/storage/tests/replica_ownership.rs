//! Replicas sharing a bucket must not delete or duplicate each other's
//! data: a replica cleans up only what is
//! under its own prefix, one process at a time acts for a replica name, and
//! one replica at a time runs retention.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use kiln_storage::{StorageError, Store, StoreConfig};
use kiln_testkit::profiles::*;

/// An id whose time is `age` ago: an upload cut that long ago.
fn id_aged(age: Duration) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    let ms = u64::try_from((now - age).as_millis()).expect("ms");
    ulid::Ulid::from_parts(ms, 7).to_string()
}

/// Data without meta.json, as an interrupted upload leaves it.
fn plant_upload(bucket: &Path, dir: &str) {
    let dir = bucket.join("blocks").join(dir);
    std::fs::create_dir_all(&dir).expect("block dir");
    std::fs::write(dir.join("data"), b"half an upload").expect("data");
}

fn short_lease(mut config: StoreConfig) -> StoreConfig {
    config.lease_ttl = Duration::from_secs(3);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_deletes_only_its_own_abandoned_uploads() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = root.path().join("bucket");
    let hours = |h: u64| Duration::from_secs(h * 3600);
    let own_old = id_aged(hours(2));
    let own_recent = id_aged(Duration::from_secs(60));
    let others_old = id_aged(hours(2));
    let legacy_ancient = id_aged(hours(24 * 20));
    let legacy_old = id_aged(hours(2));
    plant_upload(&bucket, &format!("r1/{own_old}"));
    plant_upload(&bucket, &format!("r1/{own_recent}"));
    // Another replica's upload, retried for hours through an outage: only
    // that replica knows it is still in flight.
    plant_upload(&bucket, &format!("r2/{others_old}"));
    // The old layout names no owner: such an upload goes only once
    // retention (14 days by default) would have deleted its block anyway.
    plant_upload(&bucket, &legacy_ancient);
    plant_upload(&bucket, &legacy_old);

    let store = Store::open(
        config(&root.path().join("data"), "r1"),
        local_bucket(&bucket),
    )
    .await
    .expect("open");
    store.refresh_blocks().await.expect("relist");
    let exists = |dir: &str| bucket.join("blocks").join(dir).join("data").exists();
    assert!(!exists(&format!("r1/{own_old}")), "own abandoned upload");
    assert!(exists(&format!("r1/{own_recent}")), "own recent upload");
    assert!(
        exists(&format!("r2/{others_old}")),
        "another replica's upload"
    );
    assert!(!exists(&legacy_ancient), "old-layout upload past retention");
    assert!(exists(&legacy_old), "old-layout upload within retention");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_written_before_per_replica_prefixes_stay_readable_and_compactable() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = root.path().join("bucket");
    // Two level-0 blocks of one hour, written by this replica...
    let store = Store::open(
        config(&root.path().join("data"), "r1"),
        local_bucket(&bucket),
    )
    .await
    .expect("open");
    let mut expected = 0;
    for seq in 0..2u64 {
        let (p, t) = cpu_profile(seq + 1, 20);
        expected += t;
        store
            .ingest(request("pod-a", BASE_MS + seq as i64 * 60_000, p))
            .await
            .expect("ingest");
        store.flush().await.expect("flush");
    }
    store.shutdown().await.expect("shutdown");
    drop(store);
    // ...moved to where an older release put them: `blocks/<id>/`.
    for entry in std::fs::read_dir(bucket.join("blocks/r1")).expect("r1") {
        let entry = entry.expect("entry");
        std::fs::rename(entry.path(), bucket.join("blocks").join(entry.file_name()))
            .expect("move to the old layout");
    }
    std::fs::remove_dir(bucket.join("blocks/r1")).expect("empty prefix");

    let store = Store::open(
        config(&root.path().join("data"), "r1"),
        local_bucket(&bucket),
    )
    .await
    .expect("reopen");
    assert_eq!(store.blocks().len(), 2);
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    let report = store
        .compact(BASE_MS + 3 * 3_600_000)
        .await
        .expect("compact");
    assert_eq!(report.written.len(), 1);
    assert_eq!(report.deleted, 2);
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    let left: Vec<String> = std::fs::read_dir(bucket.join("blocks"))
        .expect("blocks")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["r1".to_string()], "old-layout sources deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_store_with_a_live_replica_name_refuses_to_open() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = local_bucket(&root.path().join("bucket"));
    let mut first_config = short_lease(config(&root.path().join("first"), "same"));
    // The background loops renew the lease, as in a running store.
    first_config.background = true;
    let first = Store::open(first_config, bucket.clone())
        .await
        .expect("first opens");
    let err = Store::open(
        short_lease(config(&root.path().join("second"), "same")),
        bucket.clone(),
    )
    .await
    .expect_err("the name is live elsewhere");
    assert!(
        matches!(&err, StorageError::ReplicaNameInUse { replica, .. } if replica == "same"),
        "{err}"
    );
    // A distinct name is fine meanwhile.
    let other = Store::open(
        short_lease(config(&root.path().join("other"), "other")),
        bucket.clone(),
    )
    .await
    .expect("another name opens");
    other.shutdown().await.expect("shutdown other");

    // Once the first shuts down (releasing its lease), the name is free.
    first.shutdown().await.expect("shutdown first");
    let second = Store::open(
        short_lease(config(&root.path().join("second"), "same")),
        bucket.clone(),
    )
    .await
    .expect("the name was released");
    // A store killed without releasing: on the same disk, it takes its name
    // back at once (its holder id is in its data directory)...
    drop(second);
    let again = Store::open(
        short_lease(config(&root.path().join("second"), "same")),
        bucket.clone(),
    )
    .await
    .expect("same disk, same holder");
    drop(again);
    // ...on another disk, once the dead holder's lease has lapsed.
    let elsewhere = Store::open(
        short_lease(config(&root.path().join("third"), "same")),
        bucket,
    )
    .await
    .expect("the lease lapsed");
    elsewhere.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_serves_one_store_at_a_time() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = local_bucket(&root.path().join("bucket"));
    let _first = Store::open(config(&root.path().join("data"), "a"), bucket.clone())
        .await
        .expect("first");
    let err = Store::open(config(&root.path().join("data"), "b"), bucket)
        .await
        .expect_err("the WAL is in use");
    assert!(err.to_string().contains("in use"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_at_a_time_applies_its_retention_to_the_bucket() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = local_bucket(&root.path().join("bucket"));
    let mut long = short_lease(config(&root.path().join("long"), "long"));
    long.retention = Duration::from_secs(30 * 24 * 3600);
    let mut short = short_lease(config(&root.path().join("short"), "short"));
    short.retention = Duration::from_secs(24 * 3600);
    let long = Store::open(long, bucket.clone()).await.expect("long");
    let short = Store::open(short, bucket).await.expect("short");
    let (p, total_p) = cpu_profile(3, 20);
    long.ingest(request("pod-a", BASE_MS, p))
        .await
        .expect("ingest");
    long.flush().await.expect("flush");
    short.refresh_blocks().await.expect("relist");
    let now = BASE_MS + 3 * 24 * 3_600_000;
    // The first to run retention holds it; the other's shorter setting
    // deletes nothing while that lease is live.
    assert!(long.enforce_retention(now).await.expect("long").is_empty());
    assert!(
        short
            .enforce_retention(now)
            .await
            .expect("short")
            .is_empty()
    );
    short.refresh_blocks().await.expect("relist");
    assert_eq!(total(&short, &all_selector(), everything()).await, total_p);
    // Released at shutdown, retention passes to the other replica.
    long.shutdown().await.expect("shutdown");
    assert_eq!(short.enforce_retention(now).await.expect("short").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queries_on_one_replica_racing_compaction_on_another_are_exact_or_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = local_bucket(&root.path().join("bucket"));
    let writer = Store::open(config(&root.path().join("a"), "a"), bucket.clone())
        .await
        .expect("a");
    let mut reader_config = config(&root.path().join("b"), "b");
    // A cache of one block: the reader fetches blocks from the bucket as it
    // queries, so compaction deletes blocks it has listed but not read yet.
    reader_config.block_cache_bytes = 1;
    let reader = Store::open(reader_config, bucket).await.expect("b");
    let hour = 3_600_000;
    let mut expected = 0;
    for h in 0..12i64 {
        for k in 0..2i64 {
            let (p, t) = cpu_profile((h * 2 + k) as u64 + 1, 20);
            expected += t;
            writer
                .ingest(request("pod-a", BASE_MS + h * hour + k * 60_000, p))
                .await
                .expect("ingest");
            writer.flush().await.expect("flush");
        }
    }
    reader.refresh_blocks().await.expect("relist");
    assert_eq!(
        total(&reader, &all_selector(), everything()).await,
        expected
    );

    let compaction = {
        let writer = writer.clone();
        tokio::spawn(async move { writer.compact(BASE_MS + 3 * 24 * hour).await })
    };
    let (mut exact, mut refused) = (0u32, 0u32);
    while !compaction.is_finished() || exact == 0 {
        match reader.merge(&all_selector(), everything()).await {
            Ok(merged) => {
                assert_eq!(merged.total(), expected, "a partial or doubled answer");
                exact += 1;
            }
            Err(err @ StorageError::QueryRaced { .. }) => {
                assert!(err.is_retryable());
                refused += 1;
            }
            Err(err) => panic!("unexpected query error: {err}"),
        }
    }
    let report = compaction.await.expect("join").expect("compact");
    assert!(report.deleted >= 24, "{report:?}");
    let _ = writeln!(
        std::io::stderr(),
        "race: {exact} exact answers, {refused} refused, {} blocks deleted",
        report.deleted
    );
    reader.refresh_blocks().await.expect("relist");
    assert_eq!(
        total(&reader, &all_selector(), everything()).await,
        expected
    );
}

/// The block directories of replica `replica` in a local bucket.
fn block_dirs(bucket: &Path, replica: &str) -> usize {
    std::fs::read_dir(bucket.join("blocks").join(replica)).map_or(0, |dirs| dirs.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_lost_its_lease_during_a_slow_upload_deletes_nothing() {
    use kiln_testkit::buckets::faulty::FaultyBucket;

    let root = tempfile::tempdir().expect("tempdir");
    let bucket_dir = root.path().join("bucket");
    let bucket = local_bucket(&bucket_dir);
    let faulty = FaultyBucket::new(bucket.clone());
    let stale = Store::open(
        short_lease(config(&root.path().join("stale"), "r")),
        faulty.clone() as std::sync::Arc<dyn object_store::ObjectStore>,
    )
    .await
    .expect("stale opens");
    let mut expected = 0;
    for k in 0..3i64 {
        let (p, t) = cpu_profile(k as u64 + 1, 20);
        expected += t;
        stale
            .ingest(request("pod-a", BASE_MS + k * 60_000, p))
            .await
            .expect("ingest");
        stale.flush().await.expect("flush");
    }
    assert_eq!(block_dirs(&bucket_dir, "r"), 3);

    // The compacted block's meta.json lands, but its put answers only after
    // the lease has lapsed and another process (on another disk) has taken
    // the name over: a slow upload, or a process paused right after it.
    faulty.slow_puts_of("meta.json", Duration::from_secs(8));
    let compaction = {
        let stale = stale.clone();
        tokio::spawn(async move { stale.compact(BASE_MS + 3 * 24 * 3_600_000).await })
    };
    let next = Store::open(short_lease(config(&root.path().join("next"), "r")), bucket)
        .await
        .expect("the stale holder's lease lapses");
    let outcome = compaction.await.expect("join");
    assert!(
        matches!(&outcome, Err(StorageError::LeaseLost { .. })),
        "{outcome:?}"
    );
    // The stale holder deleted nothing: its sources are still there, hidden
    // by the block that supersedes them, so every answer is exact.
    assert_eq!(block_dirs(&bucket_dir, "r"), 4, "sources and their merge");
    assert_eq!(total(&next, &all_selector(), everything()).await, expected);
    // Resumed, it holds nothing and does nothing.
    let again = stale
        .compact(BASE_MS + 3 * 24 * 3_600_000)
        .await
        .expect("compact");
    assert_eq!(again.deleted, 0, "{again:?}");
    assert_eq!(block_dirs(&bucket_dir, "r"), 4);
    // The name's new holder deletes the superseded sources.
    next.refresh_blocks().await.expect("relist");
    assert_eq!(block_dirs(&bucket_dir, "r"), 1);
    assert_eq!(total(&next, &all_selector(), everything()).await, expected);
}
