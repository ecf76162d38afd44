//! The decoded-block cache: its size is reported in `Store::stats()`, it is
//! counted in decoded bytes, and it stays within its budget.

#[path = "support/profiles.rs"]
mod profiles;

use std::path::Path;

use kiln_storage::Store;
use profiles::*;

async fn store_with_two_blocks(root: &Path, cache_budget: u64) -> (Store, i64) {
    let mut config = config(&root.join("data"), "r1");
    config.block_cache_bytes = cache_budget;
    let store = Store::open(config, local_bucket(&root.join("bucket")))
        .await
        .expect("open store");
    let mut expected = 0;
    for (i, pod) in ["pod-a", "pod-b"].into_iter().enumerate() {
        let (pprof, total) = cpu_profile(i as u64 + 1, 200);
        expected += total;
        store
            .ingest(request(pod, BASE_MS + i as i64 * 10_000, pprof))
            .await
            .expect("ingest");
        store.flush().await.expect("flush");
    }
    assert_eq!(store.blocks().len(), 2);
    (store, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_the_decoded_blocks_a_query_leaves_in_the_cache() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, expected) = store_with_two_blocks(root.path(), 256 << 20).await;
    let before = store.stats();
    assert_eq!((before.cache_blocks, before.cache_bytes), (0, 0));

    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    let after = store.stats();
    assert_eq!(after.cache_blocks, 2);
    // Decoded blocks hold at least their data section, so they are never
    // accounted as nothing; and a repeat query reuses them unchanged.
    assert!(after.cache_bytes > 0);
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    assert_eq!(store.stats().cache_bytes, after.cache_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_smaller_than_one_decoded_block_keeps_only_the_latest_and_results_stay_exact() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, expected) = store_with_two_blocks(root.path(), 1).await;
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    assert_eq!(store.stats().cache_blocks, 1);
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    assert_eq!(store.stats().cache_blocks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_leaves_no_source_block_in_the_cache_and_the_result_answers_exactly() {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, expected) = store_with_two_blocks(root.path(), 256 << 20).await;
    let report = store
        .compact(BASE_MS + 3 * kiln_storage::planner::DAY_MS)
        .await
        .expect("compact");
    assert!(!report.written.is_empty(), "the two blocks were compacted");
    assert_eq!(store.stats().cache_blocks, 0);
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
    assert_eq!(store.stats().cache_blocks, 1);
}
