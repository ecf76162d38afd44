//! Audit D5: a block deleted between a query's snapshot of the blocks and
//! its read (a compaction replaced it, or retention or another replica
//! removed it) makes the query start again on a fresh snapshot; it never
//! answers with that block's data silently missing.

#[path = "support/profiles.rs"]
mod profiles;

use kiln_storage::{ErrorClass, StorageError, Store};
use profiles::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_deleted_under_a_query_fails_it_until_the_view_catches_up() {
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
    std::fs::remove_dir_all(bucket_dir.join("blocks").join(&gone.id)).expect("delete block a");

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

    // Once the view is listed again, the query answers what the bucket holds.
    store.refresh_blocks().await.expect("relist");
    assert_eq!(store.blocks().len(), 1);
    assert_eq!(total(&store, &all_selector(), everything()).await, total_b);
}
