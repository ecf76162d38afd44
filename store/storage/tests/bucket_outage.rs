//! Object-store outages must neither take the store down (uploads piling
//! up in memory until an OOM, and an OOM again in every recovery) nor
//! duplicate data (a WAL segment replayed although its block was
//! uploaded): the store opens and serves while its
//! bucket cannot be listed, holds WAL segments whose block it cannot confirm
//! instead of guessing, bounds what waits for upload by bytes, and cuts a
//! long WAL replay into heads of a block's size.

use std::path::Path;
use std::sync::Arc;

use kiln_storage::store::record_incomplete;
use kiln_storage::{Store, StoreConfig};
use kiln_testkit::buckets::faulty::FaultyBucket;
use kiln_testkit::profiles::*;

fn reasons(store: &Store) -> Vec<&'static str> {
    store.health().problems.iter().map(|p| p.reason).collect()
}

async fn open_with(config: StoreConfig, bucket: &Arc<FaultyBucket>) -> Store {
    Store::open(
        config,
        Arc::clone(bucket) as Arc<dyn object_store::ObjectStore>,
    )
    .await
    .expect("open store")
}

fn segment(root: &Path, id: u64) -> std::path::PathBuf {
    root.join(format!("data/wal/{id:020}.wal"))
}

/// Rebuilds what a crash between "block uploaded" and "WAL segments
/// deleted" leaves: segment 1 and the flush marker naming it are back.
fn restore_pre_cleanup_state(root: &Path, saved_segment: &[u8], block_id: &str) {
    std::fs::write(segment(root, 1), saved_segment).expect("restore segment");
    std::fs::write(
        root.join(format!("data/wal/flush-{block_id}.marker")),
        "1 2\n",
    )
    .expect("restore marker");
}

/// Ingests one profile into segment 1, saves that segment, flushes it into
/// a block (which deletes the segment) and closes the store.
async fn flushed_block(root: &Path, bucket: &Arc<FaultyBucket>) -> (Vec<u8>, String, i64) {
    let store = open_with(config(&root.join("data"), "r1"), bucket).await;
    let (a, total_a) = cpu_profile(8, 30);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest");
    let saved = std::fs::read(segment(root, 1)).expect("segment 1 holds the record");
    store.flush().await.expect("flush");
    let block = store.blocks()[0].id.clone();
    drop(store);
    (saved, block, total_a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_cuts_a_long_wal_into_heads_of_a_blocks_size_that_upload_without_loss() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = FaultyBucket::new(local_bucket(&root.path().join("bucket")));
    let mut first = config(&root.path().join("data"), "r1");
    // One record per segment, so replay may cut between any two.
    first.wal_segment_bytes = 1;
    let store = open_with(first.clone(), &bucket).await;
    let mut expected = 0;
    for i in 0..12 {
        let (p, t) = cpu_profile(100 + i, 40);
        expected += t;
        store
            .ingest(request(&format!("pod-{i}"), BASE_MS + i as i64 * 1000, p))
            .await
            .expect("ingest");
    }
    let whole_head = store.stats().head_bytes;
    drop(store);

    // Reopened with heads a quarter of what the WAL holds.
    let mut reopened = first;
    reopened.max_head_bytes = usize::try_from(whole_head / 4).expect("fits");
    reopened.max_pending_upload_bytes = whole_head * 2;
    let store = open_with(reopened.clone(), &bucket).await;
    let stats = store.stats();
    assert_eq!(store.replay_report().records, 12);
    assert!(
        stats.pending_uploads >= 3,
        "replay cut {} heads",
        stats.pending_uploads
    );
    assert!(stats.head_bytes < whole_head, "{stats:?}");
    assert!(stats.pending_upload_bytes < whole_head, "{stats:?}");
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);

    let pending = stats.pending_uploads;
    store.flush().await.expect("upload the cut heads");
    assert_eq!(store.stats().pending_uploads, 0);
    assert_eq!(
        store.blocks().len() as u64,
        pending + 1,
        "cut heads and the live head"
    );
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    drop(store);
    // Every segment went into a block: nothing replays, nothing doubles.
    let store = open_with(reopened, &bucket).await;
    assert_eq!(store.replay_report().records, 0);
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_opens_and_serves_while_the_bucket_cannot_be_listed_then_lists_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = FaultyBucket::new(local_bucket(&root.path().join("bucket")));
    let (_, _, total_a) = flushed_block(root.path(), &bucket).await;
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    let (b, total_b) = cpu_profile(9, 30);
    store
        .ingest(request("pod-b", BASE_MS + 1000, b))
        .await
        .expect("ingest");
    drop(store);

    bucket.set_down(true);
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    let problems = reasons(&store);
    assert!(problems.contains(&"bucket_unreachable"), "{problems:?}");
    assert!(problems.contains(&"bucket_not_listed"), "{problems:?}");
    // It answers from what it has (the WAL), marked partial, and takes writes.
    assert_eq!(store.replay_report().records, 1);
    let (answer, incomplete) =
        record_incomplete(total(&store, &all_selector(), everything())).await;
    assert_eq!(answer, total_b);
    assert!(incomplete.bucket_not_listed, "{incomplete:?}");
    let (c, total_c) = cpu_profile(10, 30);
    store
        .ingest(request("pod-c", BASE_MS + 2000, c))
        .await
        .expect("ingest while the bucket is down");
    // A failed re-listing leaves it as it was.
    store.refresh_blocks().await.expect_err("still down");
    assert!(!store.health().is_ready());

    bucket.set_down(false);
    store.refresh_blocks().await.expect("lists again");
    assert!(store.health().is_ready(), "{:?}", store.health());
    let (answer, incomplete) =
        record_incomplete(total(&store, &all_selector(), everything())).await;
    assert_eq!(answer, total_a + total_b + total_c);
    assert!(incomplete.is_complete(), "{incomplete:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_skipped_an_unreadable_or_corrupt_block_says_so() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = FaultyBucket::new(local_bucket(&root.path().join("bucket")));
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    let mut ids = Vec::new();
    let mut totals = Vec::new();
    for (i, pod) in ["pod-a", "pod-b", "pod-c"].into_iter().enumerate() {
        let (p, t) = cpu_profile(20 + i as u64, 30);
        store
            .ingest(request(pod, BASE_MS + i as i64 * HOUR, p))
            .await
            .expect("ingest");
        store.flush().await.expect("flush");
        let known: Vec<String> = ids.clone();
        let id = store
            .blocks()
            .into_iter()
            .map(|b| b.id)
            .find(|id| !known.contains(id))
            .expect("a new block");
        ids.push(id);
        totals.push(t);
    }
    // Reopened, so no block is in the cache: block 0's data answers 503
    // (transient), block 1's data is damaged (corrupt).
    drop(store);
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    bucket.fail_gets_of(&format!("{}/data", ids[0]));
    std::fs::write(
        root.path()
            .join("bucket/blocks/r1")
            .join(&ids[1])
            .join("data"),
        b"not a block",
    )
    .expect("damage block");
    let (answer, incomplete) =
        record_incomplete(total(&store, &all_selector(), everything())).await;
    assert_eq!(answer, totals[2], "only the readable block is counted");
    let mut skipped: Vec<&str> = incomplete
        .skipped_blocks
        .iter()
        .map(|b| b.id.as_str())
        .collect();
    skipped.sort_unstable();
    let mut expected = vec![ids[0].as_str(), ids[1].as_str()];
    expected.sort_unstable();
    assert_eq!(skipped, expected, "{incomplete:?}");
    assert!(!incomplete.is_complete());
    // Label listings read blocks too, and say the same.
    let (_, incomplete) = record_incomplete(store.profile_types(everything())).await;
    assert!(!incomplete.skipped_blocks.is_empty(), "{incomplete:?}");

    // Once the bucket answers, only the corrupt block is still missing.
    bucket.heal_gets();
    let (answer, incomplete) =
        record_incomplete(total(&store, &all_selector(), everything())).await;
    assert_eq!(answer, totals[0] + totals[2]);
    assert_eq!(incomplete.skipped_blocks.len(), 1, "{incomplete:?}");
    assert_eq!(incomplete.skipped_blocks[0].id, ids[1]);
}

const HOUR: i64 = 3_600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_meta_error_holds_the_wal_it_covers_instead_of_replaying_it_twice() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = FaultyBucket::new(local_bucket(&root.path().join("bucket")));
    let (saved, block, total_a) = flushed_block(root.path(), &bucket).await;
    // A crash between upload and WAL cleanup, and on restart the block's
    // meta.json answers 503: a transient error read as "no block" would
    // replay the segment into a second copy of its data.
    restore_pre_cleanup_state(root.path(), &saved, &block);
    bucket.fail_gets_of(&format!("{block}/meta.json"));
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    let problems = reasons(&store);
    assert!(problems.contains(&"wal_held"), "{problems:?}");
    assert!(problems.contains(&"bucket_unreachable"), "{problems:?}");
    // Neither the block (unreadable) nor the segment (held) is counted:
    // the answer is short until the bucket says, never doubled.
    assert_eq!(total(&store, &all_selector(), everything()).await, 0);
    assert!(segment(root.path(), 1).exists(), "the held segment is kept");
    let (b, total_b) = cpu_profile(9, 30);
    store
        .ingest(request("pod-b", BASE_MS + 1000, b))
        .await
        .expect("ingest");

    bucket.heal_gets();
    store.refresh_blocks().await.expect("lists again");
    assert!(store.health().is_ready(), "{:?}", store.health());
    assert!(!segment(root.path(), 1).exists(), "the block holds it");
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_b
    );
    drop(store);
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    assert_eq!(
        store.replay_report().records,
        1,
        "only pod-b's write replays"
    );
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_b
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_segment_whose_block_never_arrived_is_replayed_and_uploaded_once_the_bucket_answers()
{
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = FaultyBucket::new(local_bucket(&root.path().join("bucket")));
    let (saved, block, total_a) = flushed_block(root.path(), &bucket).await;
    restore_pre_cleanup_state(root.path(), &saved, &block);
    // The upload never finished, and the bucket is down at restart.
    std::fs::remove_dir_all(root.path().join("bucket/blocks/r1").join(&block)).expect("drop block");
    bucket.set_down(true);
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    assert!(reasons(&store).contains(&"wal_held"));
    assert_eq!(total(&store, &all_selector(), everything()).await, 0);

    bucket.set_down(false);
    store.refresh_blocks().await.expect("lists again");
    assert!(store.health().is_ready(), "{:?}", store.health());
    assert_eq!(
        store.stats().pending_uploads,
        1,
        "replayed, waiting for upload"
    );
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
    store.flush().await.expect("upload");
    assert_eq!(store.blocks().len(), 1);
    assert!(!segment(root.path(), 1).exists());
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
    drop(store);
    let store = open_with(config(&root.path().join("data"), "r1"), &bucket).await;
    assert_eq!(store.replay_report().records, 0);
    assert_eq!(total(&store, &all_selector(), everything()).await, total_a);
}
