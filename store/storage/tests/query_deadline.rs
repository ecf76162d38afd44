//! One query must not hold the store's query slots and CPU without bound:
//! a query that runs past its deadline stops between blocks, or inside a
//! head's or block's scan between series, with an error saying how far it
//! got; it never answers a partial result. A request that makes several
//! visits gives them all its one deadline.

use std::time::{Duration, Instant};

use kiln_storage::store::with_request_deadline;
use kiln_storage::{ErrorClass, StorageError, Store};
use kiln_testkit::profiles::*;

async fn store_with_a_block_and_a_head(root: &std::path::Path, timeout: Duration) -> Store {
    let mut config = config(&root.join("data"), "r1");
    config.query_timeout = timeout;
    let store = Store::open(config, local_bucket(&root.join("bucket")))
        .await
        .expect("open");
    let (a, _) = cpu_profile(1, 50);
    store.ingest(request("pod-a", BASE_MS, a)).await.expect("a");
    store.flush().await.expect("flush");
    let (b, _) = cpu_profile(2, 50);
    store.ingest(request("pod-b", BASE_MS, b)).await.expect("b");
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_its_deadline_is_an_error_not_a_partial_answer() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = store_with_a_block_and_a_head(root.path(), Duration::from_nanos(1)).await;
    let err = store
        .merge(&all_selector(), everything())
        .await
        .expect_err("past the deadline");
    assert!(
        matches!(
            err,
            StorageError::QueryTimeout {
                visited: 0,
                total: 2,
                ..
            }
        ),
        "the head's scan stopped at its first series: {err}"
    );
    assert_eq!(err.class(), ErrorClass::Client);
    assert!(err.to_string().contains("narrow the time range"), "{err}");

    let root = tempfile::tempdir().expect("tempdir");
    let store = store_with_a_block_and_a_head(root.path(), Duration::from_secs(30)).await;
    let (_, total_a) = cpu_profile(1, 50);
    let (_, total_b) = cpu_profile(2, 50);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_b
    );
}

/// The store's own deadline is 30 s, but the request's is spent: each of
/// its visits stops at the request's deadline, whether it is its first or
/// one after others, and a visit outside any request keeps its own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_visit_of_a_request_stops_at_the_requests_one_deadline() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = store_with_a_block_and_a_head(root.path(), Duration::from_secs(30)).await;
    let (_, total_a) = cpu_profile(1, 50);
    let (_, total_b) = cpu_profile(2, 50);
    let deadline = Instant::now() + Duration::from_millis(300);
    let (first, second) = with_request_deadline(deadline, async {
        let first = total(&store, &all_selector(), everything()).await;
        tokio::time::sleep_until(deadline.into()).await;
        let second = store.merge(&all_selector(), everything()).await;
        (first, second)
    })
    .await;
    assert_eq!(first, total_a + total_b, "within the deadline");
    let err = second.expect_err("the request's deadline has passed");
    assert!(matches!(err, StorageError::QueryTimeout { .. }), "{err}");
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_a + total_b,
        "outside the request, the store's own deadline"
    );
}
