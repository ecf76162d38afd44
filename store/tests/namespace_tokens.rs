//! A write token bound to namespaces writes only there: the `namespace`
//! label is the client's own text, so without the binding one tenant could
//! write series into another's namespace, and use up the series that
//! namespace may hold. Against the real binary, over `/ingest` and Push.

use kiln_api::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_api::types::v1::LabelPair;
use kiln_pprof::{FunctionSpec, LabelValue, ProfileBuilder};
use kiln_testkit::http::{enc, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// Posts three folded samples as `name` (Pyroscope's `/ingest`).
fn ingest_folded(store: &StoreProcess, token: &str, name: &str) -> (u16, String) {
    let bearer = format!("Bearer {token}");
    let response = http(
        store.addr,
        "POST",
        &format!("/ingest?name={}&from=now-10s&until=now", enc(name)),
        &[("Authorization", bearer.as_str())],
        b"main;work 3\n",
    )
    .expect("ingest");
    (response.status, response.text())
}

/// A Push of one profile whose one sample carries the string label
/// `namespace` (promoted to a series label), under series labels `labels`.
fn push_with_sample_namespace(
    store: &StoreProcess,
    token: &str,
    labels: &[(&str, &str)],
    sample_namespace: &str,
) -> (u16, String) {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    let f = builder.function(&FunctionSpec {
        name: "pushed".into(),
        ..Default::default()
    });
    let loc = builder.location(0, 0, &[(f, 0)]);
    builder.sample(
        &[loc],
        &[20_000_000],
        &[("namespace", LabelValue::Str(sample_namespace.into()))],
    );
    let request = PushRequest {
        series: vec![RawProfileSeries {
            labels: labels
                .iter()
                .map(|(name, value)| LabelPair {
                    name: (*name).into(),
                    value: (*value).into(),
                })
                .collect(),
            samples: vec![RawSample {
                raw_profile: builder.finish().encode_to_vec(),
                id: String::new(),
            }],
        }],
    };
    let bearer = format!("Bearer {token}");
    let response = http(
        store.addr,
        "POST",
        "/push.v1.PusherService/Push",
        &[
            ("Content-Type", "application/proto"),
            ("Authorization", bearer.as_str()),
        ],
        &request.encode_to_vec(),
    )
    .expect("push");
    (response.status, response.text())
}

/// The namespaces that hold series, read with the read token.
fn namespaces(store: &StoreProcess) -> Vec<String> {
    let response = http(
        store.addr,
        "GET",
        "/api/v1/labels/namespace/values?from=now-1h",
        &[("Authorization", "Bearer reader")],
        b"",
    )
    .expect("label values");
    assert_eq!(response.status, 200, "{}", response.text());
    let mut values: Vec<String> = response.json()["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    values.sort();
    values
}

#[test]
fn a_namespace_token_writes_only_its_namespaces() {
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &[],
        &[
            ("KILN_READ_TOKENS", "reader"),
            ("KILN_WRITE_TOKENS", "agents"),
            (
                "KILN_NAMESPACE_WRITE_TOKENS",
                "shop:shop-token,checkout:two-token,payments:two-token",
            ),
        ],
    );

    // Its own namespace, named or not: a token bound to one namespace
    // writes the series that name none into it.
    assert_eq!(
        ingest_folded(&store, "shop-token", "app{namespace=shop}").0,
        200
    );
    assert_eq!(ingest_folded(&store, "shop-token", "unnamed").0, 200);

    // Another tenant's namespace: refused, whole, naming why.
    let (status, text) = ingest_folded(&store, "shop-token", "app{namespace=payments}");
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("namespace_not_allowed"), "{text}");
    assert!(text.contains("payments"), "{text}");
    // With two namespaces, a series naming none is in neither.
    let (status, text) = ingest_folded(&store, "two-token", "app");
    assert_eq!(status, 403, "{text}");
    assert_eq!(
        ingest_folded(&store, "two-token", "app{namespace=payments}").0,
        200
    );
    // A sample label cannot move a series out of the writer's namespaces:
    // beside a series `namespace` it is kept as `exported_namespace`, and
    // where it would be promoted to the series' namespace it is checked.
    assert_eq!(
        push_with_sample_namespace(
            &store,
            "shop-token",
            &[("__name__", "process_cpu")],
            "payments"
        )
        .0,
        200
    );
    let exported = http(
        store.addr,
        "GET",
        "/api/v1/labels/exported_namespace/values?from=now-1h",
        &[("Authorization", "Bearer reader")],
        b"",
    )
    .expect("label values")
    .json();
    assert_eq!(
        exported["values"],
        serde_json::json!(["payments"]),
        "{exported}"
    );
    let (status, text) =
        push_with_sample_namespace(&store, "two-token", &[("__name__", "process_cpu")], "shop");
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("permission_denied"), "{text}");
    assert_eq!(
        push_with_sample_namespace(
            &store,
            "two-token",
            &[("__name__", "process_cpu")],
            "checkout"
        )
        .0,
        200
    );

    // The agents' token writes any namespace; no token writes none.
    assert_eq!(
        ingest_folded(&store, "agents", "app{namespace=kube-system}").0,
        200
    );
    assert_eq!(
        ingest_folded(&store, "nobody", "app{namespace=shop}").0,
        401
    );

    assert_eq!(
        namespaces(&store),
        ["checkout", "kube-system", "payments", "shop"]
    );
    // Nothing of the refused writes reached the store.
    let refused = get(store.addr, "/metrics").text();
    let line = refused
        .lines()
        .find(|l| l.contains("namespace_not_allowed"))
        .unwrap_or("");
    assert!(!line.is_empty(), "the refusals are counted:\n{refused}");
}
