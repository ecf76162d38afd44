//! Replicas and compaction delete blocks under running queries. A block
//! deleted between a query's snapshot of the blocks and
//! its read (a compaction replaced it, or retention or another replica
//! removed it) makes the query list the bucket again and start over on the
//! new view; it never answers with that block's data silently missing.

use kiln_storage::{ErrorClass, StorageError, Store};
use kiln_testkit::profiles::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_deleted_under_a_query_makes_it_list_the_bucket_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket_dir = root.path().join("bucket");
    let store = Store::open(
        config(&root.path().join("data"), "r1"),
        local_bucket(&bucket_dir),
    )
    .await
    .expect("open");
    let (a, _) = cpu_profile(1, 50);
    store.ingest(request("pod-a", BASE_MS, a)).await.expect("a");
    store.flush().await.expect("flush a");
    let (b, total_b) = cpu_profile(2, 50);
    store.ingest(request("pod-b", BASE_MS, b)).await.expect("b");
    store.flush().await.expect("flush b");
    let blocks = store.blocks();
    assert_eq!(blocks.len(), 2);

    // Block a disappears from the bucket behind the store's back, as when
    // another process compacted or expired it.
    let gone = blocks
        .iter()
        .min_by_key(|m| m.id.clone())
        .expect("two blocks");
    std::fs::remove_dir_all(bucket_dir.join("blocks").join("r1").join(&gone.id))
        .expect("delete block a");

    // The query finds the block gone, lists the bucket again and answers
    // for what the bucket holds now: never a silent partial answer over the
    // old view.
    assert_eq!(total(&store, &all_selector(), everything()).await, total_b);
    assert_eq!(store.blocks().len(), 1);

    // A block still listed whose data is gone (never read, so not cached)
    // cannot be caught up with by listing again: the query fails rather
    // than answer without it.
    let (c, _) = cpu_profile(3, 50);
    store.ingest(request("pod-c", BASE_MS, c)).await.expect("c");
    store.flush().await.expect("flush c");
    let newest = store
        .blocks()
        .into_iter()
        .max_by_key(|m| m.id.clone())
        .expect("block c");
    std::fs::remove_file(
        bucket_dir
            .join("blocks")
            .join("r1")
            .join(&newest.id)
            .join("data"),
    )
    .expect("delete block c's data");
    let err = store
        .merge(&all_selector(), everything())
        .await
        .expect_err("a partial answer is not an answer");
    assert!(
        matches!(err, StorageError::QueryRaced { attempts: 3 }),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Overloaded);
    assert!(err.is_retryable());
}
