//! The decoded-block cache: its size is reported in `Store::stats()`, it is
//! counted in decoded bytes, and it stays within its budget.

use std::path::Path;

use kiln_storage::Store;
use kiln_storage::bucket::{Bucket, BucketConfig};
use kiln_testkit::profiles::*;

async fn store_with_two_blocks(root: &Path, cache_budget: u64) -> (Store, i64) {
    let bucket = local_bucket(&root.join("bucket"));
    store_with_two_blocks_in(root, cache_budget, bucket.into()).await
}

async fn store_with_two_blocks_in(root: &Path, cache_budget: u64, bucket: Bucket) -> (Store, i64) {
    let mut config = config(&root.join("data"), "r1");
    config.block_cache_bytes = cache_budget;
    let store = Store::open(config, bucket).await.expect("open store");
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
async fn a_budget_smaller_than_one_decoded_block_keeps_only_the_latest_entry_and_results_stay_exact()
 {
    let root = tempfile::tempdir().expect("tempdir");
    let (store, expected) = store_with_two_blocks(root.path(), 1).await;
    // One entry stays (a decoded block or one block's merge partials),
    // and every answer is exact.
    for _ in 0..2 {
        assert_eq!(total(&store, &all_selector(), everything()).await, expected);
        let stats = store.stats();
        assert!(
            stats.cache_blocks <= 1 && stats.cache_bytes > 0,
            "{stats:?}"
        );
    }
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

/// A local directory opened from its configuration is read by range from
/// its files (under the bucket's prefix), not through the object store:
/// with a cache too small to hold a block, every block is opened by range
/// and compaction reads its sources so. A file looked for in the wrong
/// place reads as a missing block, and the totals would fall short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_bucket_reads_its_block_files_by_range_under_its_prefix() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("bucket");
    let bucket = BucketConfig::Local { dir: dir.clone() }
        .open(Some("/tenant a/kiln/"))
        .expect("bucket");
    let (store, expected) = store_with_two_blocks_in(root.path(), 1, bucket).await;
    let data_files = walk_files(&dir.join("tenant a/kiln/blocks"))
        .into_iter()
        .filter(|path| path.ends_with("data"))
        .count();
    assert_eq!(data_files, 2, "both blocks were written under the prefix");
    for _ in 0..2 {
        assert_eq!(total(&store, &all_selector(), everything()).await, expected);
        assert_eq!(
            total(&store, &pod_selector("pod-b"), everything()).await,
            expected - cpu_profile(1, 200).1
        );
    }
    store.shutdown().await.expect("shutdown");

    // Compaction needs room for its output's tables in the cache budget.
    let mut config = config(&root.path().join("data"), "r1");
    config.block_cache_bytes = 256 << 20;
    let bucket = BucketConfig::Local { dir }
        .open(Some("tenant a/kiln"))
        .expect("bucket");
    let store = Store::open(config, bucket).await.expect("reopen");
    let report = store
        .compact(BASE_MS + 3 * kiln_storage::planner::DAY_MS)
        .await
        .expect("compact");
    assert!(!report.written.is_empty(), "the two blocks were compacted");
    assert_eq!(total(&store, &all_selector(), everything()).await, expected);
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(walk_files(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Merges keep each block's partial (its selection summed, in its own
/// symbol ids) with the cached block; later merges over the same clip of
/// a block answer from it. Every answer, cold or warm, over ranges that
/// cover blocks whole or cut into them, equals what a store holding the
/// same data in its head answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_from_cached_block_partials_answer_like_the_head() {
    let root = tempfile::tempdir().expect("tempdir");
    let in_head = open_local(&root.path().join("head")).await;
    let in_blocks = open_local(&root.path().join("blocks")).await;
    let hour = kiln_storage::planner::HOUR_MS;
    for step in 0..6i64 {
        for (i, pod) in ["pod-a", "pod-b", "pod-c"].into_iter().enumerate() {
            let (pprof, _) = cpu_profile(step as u64 * 3 + i as u64 + 1, 60);
            let time_ms = BASE_MS + step * hour / 2;
            for store in [&in_head, &in_blocks] {
                store
                    .ingest(request(pod, time_ms, pprof.clone()))
                    .await
                    .expect("ingest");
            }
        }
        if step % 2 == 1 {
            in_blocks.flush().await.expect("flush");
        }
    }
    assert_eq!(in_blocks.blocks().len(), 3);
    let ranges = [
        everything(),
        kiln_engine::model::TimeRange {
            start_ms: BASE_MS + hour / 4,
            end_ms: BASE_MS + 2 * hour,
        },
        kiln_engine::model::TimeRange {
            start_ms: BASE_MS + hour,
            end_ms: BASE_MS + 3 * hour,
        },
    ];
    let selectors = [all_selector(), pod_selector("pod-b")];
    let answers = |store: &Store| {
        let store = store.clone();
        let selectors = selectors.clone();
        async move {
            let mut out = Vec::new();
            for selector in &selectors {
                for range in ranges {
                    let merged = store.merge(selector, range).await.expect("merge");
                    out.push((merged.total(), merged.stacks()));
                }
            }
            out
        }
    };
    let expected = answers(&in_head).await;
    assert!(expected.iter().all(|(total, _)| *total > 0));
    assert_eq!(answers(&in_blocks).await, expected, "cold");
    // The partials are counted in the cache's bytes; a warm pass adds none
    // and answers the same.
    let cached = in_blocks.stats().cache_bytes;
    assert_eq!(answers(&in_blocks).await, expected, "warm");
    assert_eq!(in_blocks.stats().cache_bytes, cached);
}

/// Days before the newest day that a range covers whole are merged into
/// one span partial, cached: a warm merge takes them from it without
/// reading their blocks or their own partials, and every answer (spans
/// cold and warm, ranges that cut into the first day, a selection of one
/// pod) equals the head's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_days_a_range_covers_whole_answer_from_one_cached_span_partial() {
    let root = tempfile::tempdir().expect("tempdir");
    let in_head = open_local(&root.path().join("head")).await;
    let day = kiln_storage::planner::DAY_MS;
    let first_day = BASE_MS - BASE_MS.rem_euclid(day);
    // One block per day for five days; the fifth is the newest day, never
    // in a span.
    let mut config = config(&root.path().join("blocks/data"), "r1");
    // Room for one entry only: what the cache keeps last is the span,
    // inserted when the merge finishes.
    config.block_cache_bytes = 1;
    let in_blocks = Store::open(config, local_bucket(&root.path().join("blocks/bucket")))
        .await
        .expect("open store");
    for d in 0..5i64 {
        for (i, pod) in ["pod-a", "pod-b"].into_iter().enumerate() {
            let (pprof, _) = cpu_profile(d as u64 * 2 + i as u64 + 1, 40);
            let time_ms = first_day + d * day + 3_600_000 * (1 + i as i64);
            for store in [&in_head, &in_blocks] {
                store
                    .ingest(request(pod, time_ms, pprof.clone()))
                    .await
                    .expect("ingest");
            }
        }
        in_blocks.flush().await.expect("flush");
    }
    assert_eq!(in_blocks.blocks().len(), 5);
    let range_from = |start_ms| kiln_engine::model::TimeRange {
        start_ms,
        end_ms: first_day + 6 * day,
    };
    let ranges = [everything(), range_from(first_day + day / 2)];
    for selector in [pod_selector("pod-b"), all_selector()] {
        for range in ranges {
            let expected = in_head.merge(&selector, range).await.expect("merge");
            for pass in ["cold", "warm"] {
                let merged = in_blocks.merge(&selector, range).await.expect("merge");
                assert_eq!(merged.total(), expected.total(), "{pass}");
                assert_eq!(merged.stacks(), expected.stacks(), "{pass}");
            }
        }
    }
    // A selection not merged before: its cold merge ends by caching the
    // span of days 1 to 4, which the one-entry cache then holds alone.
    // Those days' block files go; a merge over them still answers, from
    // the span alone (the fifth day's block is read).
    let selector = pod_selector("pod-a");
    let expected = in_head.merge(&selector, everything()).await.expect("merge");
    let merged = in_blocks
        .merge(&selector, everything())
        .await
        .expect("merge");
    assert_eq!(merged.total(), expected.total());
    let newest = in_blocks
        .blocks()
        .into_iter()
        .max_by_key(|b| b.max_time_ms)
        .expect("blocks");
    let mut removed = 0;
    for block in in_blocks.blocks() {
        if block.id != newest.id {
            let dir = root.path().join("blocks/bucket/blocks/r1").join(&block.id);
            std::fs::remove_dir_all(&dir).expect("remove a block's files");
            removed += 1;
        }
    }
    assert_eq!(removed, 4);
    let from_span = in_blocks
        .merge(&selector, everything())
        .await
        .expect("merge from the span");
    assert_eq!(from_span.total(), expected.total());
    assert_eq!(from_span.stacks(), expected.stacks());
}
