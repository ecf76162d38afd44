//! One write budget: `Store::admit_ingest` hands out the store's write
//! slots and reserves each body in the ingest memory budget; the server
//! admits every write request there and nowhere else.

use kiln_storage::{ErrorClass, StorageError, Store};
use kiln_testkit::profiles::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_admitted_up_to_the_slots_and_the_memory_budget() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = config(&root.path().join("data"), "r1");
    config.max_inflight_ingests = 2;
    config.ingest_memory_bytes = 1 << 20;
    let store = Store::open(config, local_bucket(&root.path().join("bucket")))
        .await
        .expect("open");
    let first = store.admit_ingest(1024).expect("a slot");
    let mut second = store.admit_ingest(0).expect("the last slot");
    assert_eq!(store.ingests_in_flight(), 2);
    let err = store.admit_ingest(0).unwrap_err();
    assert!(
        matches!(err, StorageError::Overloaded { limit: 2 }),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Overloaded);
    drop(first);
    assert_eq!(store.ingests_in_flight(), 1);

    // The body and what decoding adds come from the same budget.
    store
        .reserve_more_ingest_memory(&mut second, 600 << 10)
        .expect("within the budget");
    let err = store.admit_ingest(600 << 10).unwrap_err();
    assert_eq!(err.reason(), "memory_busy", "{err}");
    assert_eq!(
        store.ingests_in_flight(),
        1,
        "a refused write holds no slot"
    );
    let err = store
        .reserve_more_ingest_memory(&mut second, 2 << 20)
        .unwrap_err();
    assert!(err.is_client_error(), "never fits: {err}");
    drop(second);
    assert_eq!(store.ingests_in_flight(), 0);
    assert_eq!(store.stats().ingest_memory_reserved_bytes, 0);
    let admitted = store.admit_ingest(600 << 10).expect("released on drop");
    let (pprof, total_value) = cpu_profile(1, 10);
    store
        .ingest(request("pod-a", BASE_MS, pprof))
        .await
        .expect("an admitted write is stored");
    drop(admitted);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        total_value
    );
}
