//! Listings are cut to their limit while they are collected, across the
//! head and the blocks: the first entries in sort order, whichever part
//! holds them, and a flag when some were left out.

use kiln_storage::Store;
use kiln_testkit::profiles::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_keeps_its_first_entries_across_head_and_blocks() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = Store::open(
        config(&root.path().join("data"), "r1"),
        local_bucket(&root.path().join("bucket")),
    )
    .await
    .expect("open");
    // pod-b and pod-d in a block, pod-a and pod-c in the head: the first two
    // in order come one from each.
    for pod in ["pod-b", "pod-d"] {
        let (profile, _) = cpu_profile(1, 5);
        store
            .ingest(request(pod, BASE_MS, profile))
            .await
            .expect(pod);
    }
    store.flush().await.expect("flush");
    for pod in ["pod-c", "pod-a"] {
        let (profile, _) = cpu_profile(2, 5);
        store
            .ingest(request(pod, BASE_MS, profile))
            .await
            .expect(pod);
    }
    let first_two = store
        .label_values_within("pod", &[], everything(), 2)
        .await
        .expect("listing");
    assert_eq!(first_two.entries, ["pod-a", "pod-b"]);
    assert!(first_two.truncated);
    let all = store
        .label_values_within("pod", &[], everything(), 4)
        .await
        .expect("listing");
    assert_eq!(all.entries, ["pod-a", "pod-b", "pod-c", "pod-d"]);
    assert!(!all.truncated, "exactly at the limit is whole");
    let series = store
        .series_within(&[], everything(), 1)
        .await
        .expect("listing");
    assert_eq!(series.entries.len(), 1);
    assert!(series.truncated);
}
