//! `/readyz` stays 503 (and ingest and queries say "not ready") while the
//! store is still recovering; `/healthz` answers from the start.

mod common;

use std::net::TcpListener;

use common::{StoreProcess, get, http};

#[test]
fn store_that_cannot_finish_recovery_is_live_but_not_ready() {
    // A bucket endpoint that accepts connections and never answers, so
    // listing the bucket (part of recovery) cannot finish.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().expect("addr"));
    let store = StoreProcess::start_live(
        &[
            "--object-store",
            "s3",
            "--bucket",
            "never",
            "--bucket-endpoint",
            &endpoint,
            "--bucket-allow-http",
            "true",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ],
    );
    let ready = get(store.addr, "/readyz");
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert!(ready.text().contains("recovering"));
    let ingest = http(store.addr, "POST", "/ingest?name=app", &[], b"main 1").expect("ingest");
    assert_eq!(ingest.status, 503, "{}", ingest.text());
    assert!(ingest.text().contains("not ready"), "{}", ingest.text());
    let query = get(store.addr, "/api/v1/profile-types");
    assert_eq!(query.status, 503);
    assert!(
        get(store.addr, "/metrics")
            .text()
            .contains("kiln_ready 0\n")
    );
}
