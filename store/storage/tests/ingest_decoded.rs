//! `Store::ingest_decoded`: a profile the server decoded (and edited) once
//! is stored without a second decode, and the bytes logged for it replay
//! to the same data.

use kiln_pprof::DecodeLimits;
use kiln_storage::{StorageError, Store};
use kiln_testkit::profiles::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_profile_is_stored_as_decoded_and_replays_from_its_logged_bytes() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_local(root.path()).await;
    let (gzipped, total_before) = cpu_profile(3, 40);
    let limits = DecodeLimits::default();
    let mut raw = kiln_pprof::decode(&gzipped, &limits)
        .expect("decodes")
        .into_raw();
    for sample in &mut raw.sample {
        for value in &mut sample.value {
            *value *= 2;
        }
    }
    let encoded = kiln_pprof::encode_gzip(&raw);
    let (edited, _) = kiln_pprof::validate_message(raw, &limits).expect("valid");
    store
        .ingest_decoded(request("pod-a", BASE_MS, encoded), edited)
        .await
        .expect("ingest");
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        2 * total_before
    );
    drop(store);

    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 1);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        2 * total_before,
        "the logged bytes decode to the profile that was stored"
    );
}

/// Replay decodes logged bytes under the input size limit, so bytes over
/// it are refused at ingest even though the profile came decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logged_bytes_over_the_input_limit_are_refused_before_the_wal() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = config(&root.path().join("data"), "r1");
    config.decode_limits.max_input_bytes = 64;
    let store = Store::open(config, local_bucket(&root.path().join("bucket")))
        .await
        .expect("open");
    let (gzipped, _) = cpu_profile(4, 20);
    let profile = kiln_pprof::decode(&gzipped, &DecodeLimits::default()).expect("decodes");
    let err = store
        .ingest_decoded(request("pod-a", BASE_MS, gzipped), profile)
        .await
        .unwrap_err();
    assert!(matches!(&err, StorageError::InvalidProfile { .. }), "{err}");
    assert!(err.is_client_error());
    drop(store);
    let store = open_local(root.path()).await;
    assert_eq!(store.replay_report().records, 0);
}
