//! A path that no route serves is refused with a 404 before auth or any
//! handler sees it: it is not open because nothing lists it, and a guarded
//! prefix does not turn it into a request for a token.

use kiln_testkit::http::{get, http};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// A 404 that names the path, as the route table refuses it.
fn assert_no_such_endpoint(store: &StoreProcess, method: &str, target: &str) {
    let response = http(store.addr, method, target, &[], b"").expect("request");
    assert_eq!(
        response.status,
        404,
        "{method} {target}: {}",
        response.text()
    );
    let text = response.text();
    assert!(text.contains("no such endpoint"), "{text}");
    assert!(text.contains("\"reason\":\"not_found\""), "{text}");
}

#[test]
fn a_path_in_no_route_is_refused_before_auth_even_under_a_guarded_prefix() {
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &[],
        &[
            ("KILN_READ_TOKENS", "r-secret"),
            ("KILN_WRITE_TOKENS", "w-secret"),
        ],
    );
    // Under the prefixes of read and write routes, but served by none.
    assert_no_such_endpoint(&store, "GET", "/api/v1/nothing-here");
    assert_no_such_endpoint(&store, "GET", "/api/v2/series");
    assert_no_such_endpoint(&store, "GET", "/pyroscope/render-diff");
    assert_no_such_endpoint(&store, "POST", "/push.v1.PusherService/Other");
    assert_no_such_endpoint(
        &store,
        "POST",
        "/parca.profilestore.v1alpha1.ProfileStoreService/Other",
    );
    assert_no_such_endpoint(&store, "POST", "/nothing-here");
    assert_no_such_endpoint(&store, "POST", "/");

    // The routes themselves still ask for their tokens ...
    assert_eq!(get(store.addr, "/api/v1/series").status, 401);
    assert_eq!(
        get(store.addr, "/api/v1/labels/service_name/values").status,
        401
    );
    let ingest = http(store.addr, "POST", "/ingest?name=app", &[], b"main 1").expect("ingest");
    assert_eq!(ingest.status, 401, "{}", ingest.text());
    // ... and what is open stays open: health, metrics and the web UI.
    assert_eq!(get(store.addr, "/healthz").status, 200);
    assert_eq!(get(store.addr, "/metrics").status, 200);
    assert_eq!(get(store.addr, "/").status, 200, "the web UI");
}
