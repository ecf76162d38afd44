//! Stores sharing one bucket: each under its own prefix sees only its own
//! profiles and applies its retention to its own blocks only, and a store
//! never adopts a prefix another store claimed.

use std::time::Duration;

use kiln_storage::{BucketConfig, StorageError, Store, StoreConfig};
use kiln_testkit::profiles::*;

fn named(data_dir: &std::path::Path, replica: &str, store: &str) -> StoreConfig {
    let mut config = config(data_dir, replica);
    config.store_name = Some(store.to_owned());
    config.lease_ttl = Duration::from_secs(3);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_claimed_by_one_store_is_refused_to_another_and_shared_by_its_replicas() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = local_bucket(&root.path().join("bucket"));
    let first = Store::open(
        named(&root.path().join("a0"), "a-0", "profiling/a"),
        bucket.clone(),
    )
    .await
    .expect("first store claims the empty bucket");
    let err = Store::open(
        named(&root.path().join("b0"), "b-0", "profiling/b"),
        bucket.clone(),
    )
    .await
    .expect_err("another store's prefix");
    assert!(
        matches!(&err, StorageError::BucketClaimedByAnotherStore { store, owner }
            if store == "profiling/b" && owner == "profiling/a"),
        "{err}"
    );
    assert!(err.to_string().contains("--bucket-prefix"), "{err}");
    // A second replica of the same store shares it.
    let (p, total_p) = cpu_profile(1, 20);
    first
        .ingest(request("pod-a", BASE_MS, p))
        .await
        .expect("ingest");
    first.flush().await.expect("flush");
    let replica = Store::open(
        named(&root.path().join("a1"), "a-1", "profiling/a"),
        bucket.clone(),
    )
    .await
    .expect("a replica of the same store");
    assert_eq!(
        total(&replica, &all_selector(), everything()).await,
        total_p
    );
    // The claim outlives restarts: the other store is refused again.
    first.shutdown().await.expect("shutdown");
    replica.shutdown().await.expect("shutdown");
    let again = Store::open(
        named(&root.path().join("b0"), "b-0", "profiling/b"),
        bucket.clone(),
    )
    .await;
    assert!(
        matches!(again, Err(StorageError::BucketClaimedByAnotherStore { .. })),
        "{:?}",
        again.err()
    );
    // An unnamed store (a single host, or an earlier release) checks nothing.
    let unnamed = Store::open(config(&root.path().join("u"), "u"), bucket)
        .await
        .expect("unnamed");
    unnamed.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_under_their_own_prefixes_never_see_or_expire_each_others_data() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket_dir = root.path().join("bucket");
    let bucket_of = |prefix: &str| {
        BucketConfig::Local {
            dir: bucket_dir.clone(),
        }
        .open(Some(prefix))
        .expect("bucket")
    };
    let mut short = named(&root.path().join("short"), "kiln-0", "team-a/kiln");
    short.retention = Duration::from_secs(24 * 3600);
    let mut long = named(&root.path().join("long"), "kiln-0", "team-b/kiln");
    long.retention = Duration::from_secs(30 * 24 * 3600);
    // The same replica name in both, as two StatefulSets named alike have.
    let short = Store::open(short, bucket_of("team-a/kiln"))
        .await
        .expect("short");
    let long = Store::open(long, bucket_of("team-b/kiln"))
        .await
        .expect("long");
    let (pa, total_a) = cpu_profile(1, 20);
    let (pb, total_b) = cpu_profile(2, 30);
    assert_ne!(total_a, total_b);
    short
        .ingest(request("pod-a", BASE_MS, pa))
        .await
        .expect("ingest a");
    long.ingest(request("pod-b", BASE_MS, pb))
        .await
        .expect("ingest b");
    short.flush().await.expect("flush a");
    long.flush().await.expect("flush b");
    short.refresh_blocks().await.expect("relist a");
    long.refresh_blocks().await.expect("relist b");
    assert_eq!(total(&short, &all_selector(), everything()).await, total_a);
    assert_eq!(total(&long, &all_selector(), everything()).await, total_b);

    // Each store holds its own retention lease and expires only its blocks.
    let now = BASE_MS + 3 * 24 * 3_600_000;
    assert_eq!(long.enforce_retention(now).await.expect("long").len(), 0);
    assert_eq!(short.enforce_retention(now).await.expect("short").len(), 1);
    long.refresh_blocks().await.expect("relist b");
    assert_eq!(total(&long, &all_selector(), everything()).await, total_b);
    short.refresh_blocks().await.expect("relist a");
    assert_eq!(total(&short, &all_selector(), everything()).await, 0);
    for prefix in ["team-a/kiln", "team-b/kiln"] {
        assert!(
            bucket_dir.join(prefix).join("kiln-store.json").is_file(),
            "{prefix} claimed"
        );
    }
}
