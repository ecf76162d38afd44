//! A client that retries must not double its data: a profile resent with the same idempotency key (the client did
//! not hear the first answer) is stored once, also across a restart, both
//! before and after its WAL segment became a block.

use kiln_storage::StorageError;
use kiln_testkit::profiles::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_profile_is_stored_once_across_restarts_and_flushes() {
    let root = tempfile::tempdir().expect("tempdir");
    let (p, total_p) = cpu_profile(1, 30);
    let resend = |key: &'static str| {
        let p = p.clone();
        move |store: kiln_storage::Store| async move {
            store
                .ingest_once(request("pod-a", BASE_MS, p), key)
                .await
                .expect("ingest");
            store
        }
    };
    let store = open_local(root.path()).await;
    let store = resend("agent-1/0001")(store).await;
    let store = resend("agent-1/0001")(store).await;
    assert_eq!(total(&store, &all_selector(), everything()).await, total_p);

    // Restarted before a flush: the key is known from its WAL record.
    drop(store);
    let store = open_local(root.path()).await;
    let store = resend("agent-1/0001")(store).await;
    assert_eq!(total(&store, &all_selector(), everything()).await, total_p);

    // Flushed (its WAL segment deleted), then restarted: the key is known
    // from the keys file the flush wrote.
    store.flush().await.expect("flush");
    drop(store);
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 0, "the segment is gone");
    let store = resend("agent-1/0001")(store).await;
    assert_eq!(total(&store, &all_selector(), everything()).await, total_p);

    // Another key is another profile.
    let store = resend("agent-1/0002")(store).await;
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        2 * total_p
    );

    // A refused profile does not take its key: the fixed one is stored.
    let err = store
        .ingest_once(
            request("pod-a", BASE_MS, b"not pprof".to_vec()),
            "agent-1/0003",
        )
        .await
        .expect_err("bad pprof");
    assert!(err.is_client_error(), "{err}");
    let store = resend("agent-1/0003")(store).await;
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        3 * total_p
    );
    let err = store
        .ingest_once(request("pod-a", BASE_MS, p.clone()), "")
        .await
        .expect_err("empty key");
    assert!(
        matches!(err, StorageError::InvalidIdempotencyKey { .. }),
        "{err}"
    );
}
