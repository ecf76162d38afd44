//! Object storage through the server: data written to one `kiln-store`
//! survives on S3 (`moto_server`) when the next process starts with an empty
//! local disk, and replicas sharing the bucket answer for each other's data
//! after the flush interval.

mod common;
#[path = "support/moto.rs"]
mod moto;

use std::time::{Duration, Instant};

use common::{StoreProcess, enc, get, http};
use moto::{AWS_ENV, Moto, start_moto};

fn s3_store(moto: &Moto, bucket: &str, replica: &str) -> StoreProcess {
    let endpoint = format!("http://127.0.0.1:{}", moto.port);
    StoreProcess::start_with_env(
        tempfile::tempdir().expect("temp dir"),
        &[
            "--object-store",
            "s3",
            "--bucket",
            bucket,
            "--bucket-endpoint",
            &endpoint,
            "--bucket-allow-http",
            "true",
            "--bucket-prefix",
            "cluster-a",
            "--replica",
            replica,
            "--flush-interval",
            "1s",
            "--relist-interval",
            "1s",
        ],
        &AWS_ENV,
    )
}

fn ingest_folded(store: &StoreProcess, app: &str) {
    let response = http(
        store.addr,
        "POST",
        &format!("/ingest?name={app}.cpu&from=now-10s&until=now&sampleRate=100"),
        &[],
        b"main;replicated_work 7",
    )
    .expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
}

fn total_for(store: &StoreProcess, app: &str) -> i64 {
    let query = enc(&format!(r#"process_cpu{{service_name="{app}"}}"#));
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    if response.status != 200 {
        return 0;
    }
    response.json()["total"].as_i64().unwrap_or(0)
}

#[test]
fn data_on_s3_survives_a_restart_with_an_empty_local_disk() {
    let Some(moto) = start_moto() else { return };
    moto.create_bucket("kiln-server-restart");
    let first = s3_store(&moto, "kiln-server-restart", "r0");
    ingest_folded(&first, "persisted");
    assert_eq!(total_for(&first, "persisted"), 70_000_000);
    // SIGTERM flushes the head to the bucket; the local disk is thrown away.
    drop(first.stop());
    let second = s3_store(&moto, "kiln-server-restart", "r0");
    assert_eq!(total_for(&second, "persisted"), 70_000_000);
}

#[test]
fn a_replica_answers_for_data_written_to_another_after_the_flush_interval() {
    let Some(moto) = start_moto() else { return };
    moto.create_bucket("kiln-server-replicas");
    let writer = s3_store(&moto, "kiln-server-replicas", "writer");
    let reader = s3_store(&moto, "kiln-server-replicas", "reader");
    ingest_folded(&writer, "shared");
    // Flush every 1 s and re-list every 1 s: poll until the block shows up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let total = total_for(&reader, "shared");
        if total == 70_000_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reader never saw the writer's block (total {total})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // And the other way round: both replicas answer for everything.
    ingest_folded(&reader, "from-reader");
    let deadline = Instant::now() + Duration::from_secs(30);
    while total_for(&writer, "from-reader") != 70_000_000 {
        assert!(
            Instant::now() < deadline,
            "the writer never saw the reader's block"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
