//! S3 persistence and replicas sharing one bucket, against a real
//! `moto_server` (PyPI `moto[server]`, installed by `./kiln-dev test` into
//! `$KILN_TOOLS_DIR/venv`). Skips with a message when moto is missing,
//! except under `CI=true`, where a missing moto fails the test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_storage::{BucketConfig, Store};
use kiln_testkit::moto::{Moto, start_moto};
use kiln_testkit::profiles::*;

fn s3(moto: &Moto, bucket: &str) -> Arc<dyn object_store::ObjectStore> {
    BucketConfig::S3 {
        bucket: bucket.into(),
        region: Some("us-east-1".into()),
        endpoint: Some(moto.endpoint()),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        allow_http: true,
    }
    .build()
    .expect("s3 store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_in_s3_survives_a_restart_with_an_empty_local_disk() {
    let Some(moto) = start_moto() else { return };
    moto.create_bucket("kiln-restart");
    let first_disk = tempfile::tempdir().expect("tempdir");
    let store = Store::open(config(first_disk.path(), "r1"), s3(&moto, "kiln-restart"))
        .await
        .expect("open on s3");
    let (a, total_a) = cpu_profile(11, 40);
    let (b, total_b) = cpu_profile(12, 40);
    store
        .ingest(request("pod-a", BASE_MS, a))
        .await
        .expect("ingest");
    store
        .ingest(request("pod-b", BASE_MS + 10_000, b))
        .await
        .expect("ingest");
    // Graceful shutdown flushes the head to the bucket.
    store.shutdown().await.expect("shutdown");
    drop(store);
    drop(first_disk);

    let second_disk = tempfile::tempdir().expect("tempdir");
    let store = Store::open(config(second_disk.path(), "r1"), s3(&moto, "kiln-restart"))
        .await
        .expect("reopen on s3");
    assert_eq!(store.replay_report().records, 0, "the new disk has no WAL");
    assert_eq!(
        total(&store, &pod_selector("pod-a"), everything()).await,
        total_a
    );
    assert_eq!(
        total(&store, &pod_selector("pod-b"), everything()).await,
        total_b
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_an_s3_bucket_see_each_others_writes_after_the_flush_interval() {
    let Some(moto) = start_moto() else { return };
    moto.create_bucket("kiln-shared");
    let disks = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let mut stores = Vec::new();
    for (i, disk) in disks.iter().enumerate() {
        let mut config = config(disk.path(), &format!("replica-{i}"));
        config.background = true;
        config.flush_interval = Duration::from_millis(300);
        config.relist_interval = Duration::from_millis(300);
        stores.push(
            Store::open(config, s3(&moto, "kiln-shared"))
                .await
                .expect("open replica"),
        );
    }
    let (a, total_a) = cpu_profile(21, 30);
    let (b, total_b) = cpu_profile(22, 30);
    // Recent times: background retention runs on the real clock.
    let t = recent_ms();
    stores[0]
        .ingest(request("pod-a", t, a))
        .await
        .expect("ingest");
    stores[1]
        .ingest(request("pod-b", t, b))
        .await
        .expect("ingest");
    // Each replica answers for the other's data once it is flushed and re-listed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let zero_sees_b = total(&stores[0], &pod_selector("pod-b"), everything()).await;
        let one_sees_a = total(&stores[1], &pod_selector("pod-a"), everything()).await;
        if zero_sees_b == total_b && one_sees_a == total_a {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas did not converge: replica-0 sees pod-b={zero_sees_b}, replica-1 sees pod-a={one_sees_a}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And nothing is counted twice across head, blocks and replicas.
    for store in &stores {
        assert_eq!(
            total(store, &all_selector(), everything()).await,
            total_a + total_b
        );
    }
    for store in &stores {
        store.shutdown().await.expect("shutdown");
    }
}
