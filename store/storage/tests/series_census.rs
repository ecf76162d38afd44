//! The series limits count every series the store retains (issue 49): a
//! series flushed from the head to a block still counts, so a writer
//! cannot make `max_series` fresh series in every head window; a series a
//! block holds is not new when written again; and a reopened store counts
//! its blocks' series before it takes a write.

use std::path::Path;

use kiln_engine::model::{Label, LabelSet};
use kiln_engine::{IngestError, IngestLimits};
use kiln_storage::{IngestRequest, StorageError, Store};
use kiln_testkit::profiles::*;

/// Each profile writes two series, one per sample type.
const SERIES_PER_POD: usize = 2;
/// Pods a namespace may hold, and the store.
const PODS_PER_NAMESPACE: usize = 3;
const PODS_IN_STORE: usize = 5;

async fn open(root: &Path) -> Store {
    open_replica(root, "r1").await
}

/// A store named `replica` on the bucket under `root`, with its own data
/// directory.
async fn open_replica(root: &Path, replica: &str) -> Store {
    let mut config = config(&root.join(format!("data-{replica}")), replica);
    config.ingest_limits = IngestLimits {
        max_series_per_namespace: PODS_PER_NAMESPACE * SERIES_PER_POD,
        max_series: PODS_IN_STORE * SERIES_PER_POD,
        ..IngestLimits::default()
    };
    Store::open(config, local_bucket(&root.join("bucket")))
        .await
        .expect("open store")
}

/// One profile of pod `pod` in `namespace`, a minute ago (within retention).
fn series_request(namespace: &str, pod: usize) -> IngestRequest {
    let (pprof, _) = cpu_profile(pod as u64, 3);
    let mut request = request(&format!("pod-{pod}"), recent_ms(), pprof);
    let labels: Vec<Label> = request
        .labels
        .iter()
        .map(|l| match l.name.as_str() {
            "namespace" => Label::new("namespace", namespace),
            _ => l.clone(),
        })
        .collect();
    request.labels = LabelSet::new(labels);
    request
}

/// What the store answers a write of a new series: the engine's reason.
async fn refusal(store: &Store, namespace: &str, pod: usize) -> &'static str {
    match store.ingest(series_request(namespace, pod)).await {
        Ok(_) => "accepted",
        Err(StorageError::Rejected { source }) => match source {
            IngestError::TooManySeriesInNamespace { .. } => "namespace full",
            IngestError::TooManySeriesInStore { .. } => "store full",
            other => panic!("refused for another reason: {other}"),
        },
        Err(other) => panic!("failed: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_flushed_to_blocks_still_count_against_the_limits_and_after_a_restart() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path()).await;
    for pod in 0..PODS_PER_NAMESPACE {
        assert_eq!(refusal(&store, "shop", pod).await, "accepted", "pod {pod}");
    }
    assert_eq!(refusal(&store, "shop", 100).await, "namespace full");
    store.flush().await.expect("flush");
    let stats = store.stats();
    assert_eq!((stats.head_profiles, stats.blocks), (0, 1), "{stats:?}");

    // The head is empty, but the block's series still count.
    assert_eq!(
        refusal(&store, "shop", 101).await,
        "namespace full",
        "a new series once the head was flushed"
    );
    for pod in 0..PODS_PER_NAMESPACE {
        assert_eq!(
            refusal(&store, "shop", pod).await,
            "accepted",
            "pod {pod}, held by the block"
        );
    }
    // Another namespace has its own room, within the store's.
    for pod in 0..PODS_IN_STORE - PODS_PER_NAMESPACE {
        assert_eq!(refusal(&store, "bank", pod).await, "accepted", "bank {pod}");
    }
    assert_eq!(refusal(&store, "bank", 100).await, "store full");
    let census = store.series_census();
    println!("census before restart: {census:?}");
    assert_eq!(census.series, (PODS_IN_STORE * SERIES_PER_POD) as u64);

    // Shutdown flushes the head: after it, every series is in a block.
    store.shutdown().await.expect("shutdown");
    drop(store);
    let store = open(root.path()).await;
    let census = store.series_census();
    println!("census after restart: {census:?}");
    assert_eq!(
        census.series,
        (PODS_IN_STORE * SERIES_PER_POD) as u64,
        "rebuilt from the blocks"
    );
    assert_eq!(census.unreadable_blocks, 0);
    assert_eq!(refusal(&store, "shop", 102).await, "namespace full");
    assert_eq!(refusal(&store, "bank", 102).await, "store full");
    assert_eq!(refusal(&store, "shop", 0).await, "accepted");
    assert_eq!(refusal(&store, "bank", 0).await, "accepted");
    store.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_that_cannot_be_read_is_reported_and_does_not_stop_ingest() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path()).await;
    for pod in 0..3 {
        assert_eq!(refusal(&store, "shop", pod).await, "accepted");
    }
    store.shutdown().await.expect("shutdown");
    drop(store);
    // Damage the block's data object past its header.
    let data = std::fs::read_dir(root.path().join("bucket/blocks/r1"))
        .expect("replica dir")
        .map(|e| e.expect("entry").path().join("data"))
        .next()
        .expect("one block");
    let mut bytes = std::fs::read(&data).expect("read block");
    let len = bytes.len();
    for at in (len / 3..len).step_by(5) {
        bytes[at] ^= 0x5a;
    }
    std::fs::write(&data, bytes).expect("write block");
    let store = open(root.path()).await;
    let census = store.series_census();
    println!("census with a damaged block: {census:?}");
    assert_eq!(census.series, 0);
    assert_eq!(census.unreadable_blocks, 1);
    assert_eq!(refusal(&store, "shop", 50).await, "accepted");
    store.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replicas_blocks_count_once_listed() {
    let root = tempfile::tempdir().expect("tempdir");
    let first = open_replica(root.path(), "r1").await;
    let second = open_replica(root.path(), "r2").await;
    for pod in 0..PODS_PER_NAMESPACE {
        assert_eq!(refusal(&first, "shop", pod).await, "accepted", "pod {pod}");
    }
    first.flush().await.expect("flush");
    assert_eq!(second.series_census().series, 0, "not listed yet");
    second.refresh_blocks().await.expect("listing");
    let census = second.series_census();
    println!("the second replica's census once listed: {census:?}");
    assert_eq!(census.series, (PODS_PER_NAMESPACE * SERIES_PER_POD) as u64);
    assert_eq!(refusal(&second, "shop", 100).await, "namespace full");
    assert_eq!(refusal(&second, "shop", 1).await, "accepted");
    first.shutdown().await.expect("shutdown");
    second.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_whose_data_is_past_retention_are_not_counted() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open(root.path()).await;
    // Fixed 2023 times, which the test config accepts: past the default
    // 14 days of retention.
    for pod in 0..PODS_PER_NAMESPACE {
        let (pprof, _) = cpu_profile(pod as u64, 3);
        let old = request(&format!("pod-{pod}"), BASE_MS, pprof);
        store.ingest(old).await.expect("an old profile");
    }
    store.shutdown().await.expect("shutdown");
    drop(store);
    let store = open(root.path()).await;
    let census = store.series_census();
    println!("census over a block past retention: {census:?}");
    assert_eq!(census.series, 0);
    for pod in 0..PODS_PER_NAMESPACE {
        assert_eq!(refusal(&store, "shop", 10 + pod).await, "accepted");
    }
    store.shutdown().await.expect("shutdown");
}
