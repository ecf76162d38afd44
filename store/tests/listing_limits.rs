//! One query must not cost the store unbounded work or memory: label and
//! series listings are bounded by `limit` (default
//! 10,000) and say whether they were cut, so a listing is either complete or
//! marked partial.

use kiln_testkit::http::{get, http};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

#[test]
fn listings_stop_at_the_limit_and_say_they_are_truncated() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    for app in ["alpha", "beta", "gamma"] {
        let response = http(
            store.addr,
            "POST",
            &format!("/ingest?name={app}.cpu&format=folded&from=now-10s&until=now"),
            &[],
            b"main;work 3\n",
        )
        .expect("ingest");
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let values = get(
        store.addr,
        "/api/v1/labels/service_name/values?from=now-1h&limit=2",
    )
    .json();
    assert_eq!(values["values"], serde_json::json!(["alpha", "beta"]));
    assert_eq!(values["truncated"], true);
    let values = get(store.addr, "/api/v1/labels/service_name/values?from=now-1h").json();
    assert_eq!(values["values"].as_array().map(Vec::len), Some(3));
    assert_eq!(values["truncated"], false);

    let series = get(store.addr, "/api/v1/series?from=now-1h&limit=1").json();
    assert_eq!(series["series"].as_array().map(Vec::len), Some(1));
    assert_eq!(series["truncated"], true);
    let names = get(store.addr, "/api/v1/labels?from=now-1h&limit=1000").json();
    assert_eq!(names["truncated"], false);

    let refused = get(store.addr, "/api/v1/series?limit=0");
    assert_eq!(refused.status, 400, "{}", refused.text());
}
