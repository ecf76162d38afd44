//! A query whose range holds a block the store cannot read answers what it
//! could read with 200, and says it is partial: `Kiln-Partial` over HTTP,
//! `kiln-partial` response metadata over gRPC, so that a block another
//! replica or a compaction removed never makes an answer silently short. A
//! complete answer carries neither.

use kiln_api::kiln::query::v1::SelectMergePprofRequest;
use kiln_api::kiln::query::v1::query_service_client::QueryServiceClient;
use kiln_testkit::http::{HttpResponse, enc, get, ingest_folded};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

fn ingest(store: &StoreProcess, app: &str) {
    ingest_folded(store.addr, app, b"main;work 7");
}

fn flamegraph(store: &StoreProcess, app: &str) -> HttpResponse {
    let query = enc(&format!(r#"process_cpu{{service_name="{app}"}}"#));
    get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_missing_an_unreadable_block_is_marked_partial_over_http_and_grpc() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    ingest(&store, "flushed");
    let complete = flamegraph(&store, "flushed");
    assert_eq!(complete.json()["total"], 70_000_000);
    assert_eq!(complete.header("kiln-partial"), None);
    // SIGTERM flushes the head into a block; then the block is damaged.
    let data_dir = store.stop();
    // Blocks are under the replica's prefix: `blocks/<replica>/<id>`.
    let replica = std::fs::read_dir(data_dir.path().join("bucket/blocks"))
        .expect("blocks")
        .next()
        .expect("one replica")
        .expect("entry")
        .path();
    let block = std::fs::read_dir(&replica)
        .expect("replica blocks")
        .next()
        .expect("one block")
        .expect("entry")
        .path();
    std::fs::write(block.join("data"), b"not a block").expect("damage the block");

    let store = StoreProcess::start_in(KILN_STORE, data_dir, &[]);
    ingest(&store, "live");
    let whole = flamegraph(&store, "live");
    assert_eq!(whole.status, 200, "{}", whole.text());
    // The block overlaps every recent range, so it is read and skipped.
    assert_eq!(whole.json()["total"], 70_000_000);
    assert_eq!(whole.header("kiln-partial"), Some("skipped_blocks=1"));
    let partial = flamegraph(&store, "flushed");
    assert_eq!(partial.status, 200, "{}", partial.text());
    assert_eq!(partial.json()["total"], 0);
    assert_eq!(partial.header("kiln-partial"), Some("skipped_blocks=1"));
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let merged = QueryServiceClient::new(channel)
        .select_merge_pprof(SelectMergePprofRequest {
            selector: r#"process_cpu{service_name="flushed"}"#.into(),
            range: None,
        })
        .await
        .expect("SelectMergePprof");
    assert_eq!(
        merged
            .metadata()
            .get("kiln-partial")
            .and_then(|v| v.to_str().ok()),
        Some("skipped_blocks=1")
    );
    assert_eq!(merged.into_inner().total, 0);
}
