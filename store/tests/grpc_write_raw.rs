//! A tonic WriteRaw client (the agent's path) against a real `kiln-store`,
//! then every query endpoint over HTTP, and a graceful restart that keeps
//! the data.

use kiln_api::kiln::query::v1::query_service_client::QueryServiceClient;
use kiln_api::kiln::query::v1::{
    LabelNamesRequest, LabelValuesRequest, ProfileTypesRequest, SelectMergePprofRequest,
};
use kiln_api::parca::profilestore::v1alpha1::profile_store_service_client::ProfileStoreServiceClient;
use kiln_api::parca::profilestore::v1alpha1::{
    Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest,
};
use kiln_pprof::{FunctionSpec, LabelValue, ProfileBuilder, encode_gzip};
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{enc, flamegraph_names, get};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// A CPU profile: `main -> hot_loop` (30 ms) and `main -> cold_path` (10 ms).
fn cpu_profile(time_nanos: i64) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10_000_000)
        .time(time_nanos, 10_000_000_000);
    let main = builder.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let hot = builder.function(&FunctionSpec {
        name: "hot_loop".into(),
        ..Default::default()
    });
    let cold = builder.function(&FunctionSpec {
        name: "cold_path".into(),
        ..Default::default()
    });
    let main_loc = builder.location(0, 0x1000, &[(main, 1)]);
    let hot_loc = builder.location(0, 0x2000, &[(hot, 2)]);
    let cold_loc = builder.location(0, 0x3000, &[(cold, 3)]);
    builder.sample(
        &[hot_loc, main_loc],
        &[30_000_000],
        &[("thread", LabelValue::Str("worker".into()))],
    );
    builder.sample(&[cold_loc, main_loc], &[10_000_000], &[]);
    encode_gzip(&builder.finish())
}

fn series(labels: &[(&str, &str)], profiles: Vec<Vec<u8>>) -> RawProfileSeries {
    RawProfileSeries {
        labels: Some(LabelSet {
            labels: labels
                .iter()
                .map(|(name, value)| Label {
                    name: (*name).into(),
                    value: (*value).into(),
                })
                .collect(),
        }),
        samples: profiles
            .into_iter()
            .map(|raw_profile| RawSample {
                raw_profile,
                executable_info: vec![],
            })
            .collect(),
    }
}

async fn client(store: &StoreProcess) -> ProfileStoreServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("valid url")
        .connect()
        .await
        .expect("connect over h2c");
    ProfileStoreServiceClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_raw_profiles_are_queryable_and_survive_a_graceful_restart() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let mut client = client(&store).await;
    let now = now_nanos();
    client
        .write_raw(WriteRawRequest {
            series: vec![series(
                &[("__name__", "process_cpu"), ("pod", "checkout-1")],
                vec![cpu_profile(now), cpu_profile(now)],
            )],
            ..Default::default()
        })
        .await
        .expect("WriteRaw accepted");

    let types = get(store.addr, "/api/v1/profile-types").json();
    let ids: Vec<&str> = types["profile_types"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, ["process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta"]);

    let query = enc(r#"process_cpu{pod="checkout-1"}"#);
    let graph = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    assert_eq!(graph.status, 200, "{}", graph.text());
    let graph = graph.json();
    assert_eq!(graph["total"], 80_000_000, "two profiles of 40 ms");
    let names = flamegraph_names(&graph);
    assert!(names.iter().any(|n| n == "hot_loop"), "{names:?}");

    let top = get(store.addr, &format!("/api/v1/top?query={query}&limit=1")).json();
    // Ordered by self (flat) value: the hot function first.
    assert_eq!(top["top"][0]["name"], "hot_loop", "{top}");
    assert_eq!(top["top"][0]["flat"], 60_000_000, "{top}");

    let labels = get(store.addr, "/api/v1/labels").json();
    let names = labels["names"].as_array().expect("names");
    assert!(names.iter().any(|n| n == "pod"), "{labels}");
    // The pprof string label is promoted to a series label.
    assert!(names.iter().any(|n| n == "thread"), "{labels}");
    let matched = get(
        store.addr,
        &format!("/api/v1/labels?query={}", enc(r#"{pod="checkout-1"}"#)),
    )
    .json();
    assert!(
        matched["names"].as_array().is_some_and(|n| !n.is_empty()),
        "{matched}"
    );
    let unmatched = get(
        store.addr,
        &format!("/api/v1/labels?query={}", enc(r#"{pod="other"}"#)),
    )
    .json();
    assert_eq!(unmatched["names"], serde_json::json!([]), "{unmatched}");
    let values = get(store.addr, "/api/v1/labels/pod/values").json();
    assert_eq!(values["values"][0], "checkout-1");
    let series_list = get(store.addr, &format!("/api/v1/series?query={query}")).json();
    assert!(!series_list["series"].as_array().expect("series").is_empty());

    let timeline = get(
        store.addr,
        &format!("/api/v1/timeline?query={query}&step=1m"),
    );
    assert_eq!(timeline.status, 200, "{}", timeline.text());
    let timeline = timeline.json();
    let sum: i64 = timeline["timeline"]["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|v| v.as_i64())
        .sum();
    assert_eq!(sum, 80_000_000, "{timeline}");

    let diff = get(
        store.addr,
        &format!(
            "/api/v1/diff?left_query={query}&right_query={}",
            enc("process_cpu")
        ),
    );
    assert_eq!(diff.status, 200, "{}", diff.text());
    assert_eq!(diff.json()["right_total"], 80_000_000);

    let pprof = get(store.addr, &format!("/api/v1/pprof?query={query}"));
    assert_eq!(pprof.status, 200);
    let merged = kiln_pprof::decode(&pprof.body, &kiln_pprof::DecodeLimits::default())
        .expect("the export is valid gzipped pprof");
    let total: i64 = merged.samples().iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 80_000_000);

    let ui = get(store.addr, "/");
    assert_eq!(ui.status, 200);
    assert!(
        ui.header("content-type")
            .is_some_and(|t| t.starts_with("text/html"))
    );

    let metrics = get(store.addr, "/metrics").text();
    assert!(
        metrics.contains("kiln_ingested_profiles_total{protocol=\"write_raw\"} 2"),
        "{metrics}"
    );

    // The gRPC query service answers the same questions.
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut query_client = QueryServiceClient::new(channel);
    let types = query_client
        .profile_types(ProfileTypesRequest::default())
        .await
        .expect("ProfileTypes")
        .into_inner();
    assert_eq!(
        types.profile_types,
        ["process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta"]
    );
    let names = query_client
        .label_names(LabelNamesRequest {
            selector: r#"{pod="checkout-1"}"#.into(),
            range: None,
        })
        .await
        .expect("LabelNames")
        .into_inner();
    assert!(names.names.iter().any(|n| n == "pod"), "{names:?}");
    let values = query_client
        .label_values(LabelValuesRequest {
            name: "pod".into(),
            selector: String::new(),
            range: None,
        })
        .await
        .expect("LabelValues")
        .into_inner();
    assert_eq!(values.values, ["checkout-1"]);
    let merged = query_client
        .select_merge_pprof(SelectMergePprofRequest {
            selector: r#"process_cpu{pod="checkout-1"}"#.into(),
            range: None,
        })
        .await
        .expect("SelectMergePprof")
        .into_inner();
    assert_eq!(merged.total, 80_000_000);
    let profile = kiln_pprof::decode(&merged.pprof_gzip, &kiln_pprof::DecodeLimits::default())
        .expect("valid pprof");
    assert_eq!(
        profile.samples().iter().map(|s| s.value[0]).sum::<i64>(),
        80_000_000
    );
    let status = query_client
        .select_merge_pprof(SelectMergePprofRequest {
            selector: r#"process_cpu{pod>"x"}"#.into(),
            range: None,
        })
        .await
        .expect_err("bad selector");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("selector position 16"),
        "{}",
        status.message()
    );

    // SIGTERM flushes; a new process on the same directory still answers.
    let data_dir = store.stop();
    let store = StoreProcess::start_in(KILN_STORE, data_dir, &[]);
    let graph = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    )
    .json();
    assert_eq!(graph["total"], 80_000_000, "after restart: {graph}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_write_raw_requests_get_invalid_argument_with_the_reason() {
    let store = StoreProcess::start(KILN_STORE, &["--max-labels-per-series", "4"]);
    let mut client = client(&store).await;
    let now = now_nanos();
    let cases: Vec<(WriteRawRequest, &str)> = vec![
        (WriteRawRequest::default(), "no profiles"),
        (
            WriteRawRequest {
                series: vec![series(&[("pod", "x")], vec![cpu_profile(now)])],
                ..Default::default()
            },
            "`__name__` label",
        ),
        (
            WriteRawRequest {
                series: vec![series(
                    &[("__name__", "process_cpu")],
                    vec![b"definitely not pprof".to_vec()],
                )],
                ..Default::default()
            },
            "pprof",
        ),
        (
            WriteRawRequest {
                series: vec![series(
                    &[
                        ("__name__", "x"),
                        ("a", "1"),
                        ("b", "2"),
                        ("c", "3"),
                        ("d", "4"),
                    ],
                    vec![cpu_profile(now)],
                )],
                ..Default::default()
            },
            "over the limit of 4",
        ),
        (
            WriteRawRequest {
                series: vec![series(
                    &[("__name__", "x"), ("bad-name", "1")],
                    vec![cpu_profile(now)],
                )],
                ..Default::default()
            },
            "label name \"bad-name\"",
        ),
    ];
    for (request, expected) in cases {
        let status = client
            .write_raw(request)
            .await
            .expect_err("the request is bad");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(expected),
            "{expected}: {}",
            status.message()
        );
    }
    assert_eq!(get(store.addr, "/healthz").status, 200, "still serving");
}

/// The total of `process_cpu` for one pod over the last hour.
fn pod_total(store: &StoreProcess, pod: &str) -> i64 {
    let query = enc(&format!(r#"process_cpu{{pod="{pod}"}}"#));
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()["total"].as_i64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refused_series_does_not_cost_the_others_and_is_reported_per_series() {
    let store = StoreProcess::start(KILN_STORE, &["--max-label-bytes", "64"]);
    let mut client = client(&store).await;
    let now = now_nanos();
    let long = "x".repeat(65);
    let batch = |pods: [&str; 3]| WriteRawRequest {
        series: vec![
            series(
                &[("__name__", "process_cpu"), ("pod", pods[0])],
                vec![cpu_profile(now)],
            ),
            // One tenant's oversized annotation: it must fail alone, not take the
            // rest of the batch (other tenants' profiles) down with it.
            series(
                &[
                    ("__name__", "process_cpu"),
                    ("pod", pods[1]),
                    ("service_name", &long),
                ],
                vec![cpu_profile(now)],
            ),
            series(
                &[("__name__", "process_cpu"), ("pod", pods[2])],
                vec![cpu_profile(now), b"not pprof".to_vec(), cpu_profile(now)],
            ),
        ],
        ..Default::default()
    };

    // A client that asked for per-series statuses: OK, with the series not
    // stored entirely listed.
    let mut request = tonic::Request::new(batch(["a", "b", "c"]));
    request
        .metadata_mut()
        .insert("kiln-series-status", "1".parse().expect("ascii"));
    let response = client
        .write_raw(request)
        .await
        .expect("processed")
        .into_inner();
    let statuses: Vec<(u32, u32, i32, &str)> = response
        .kiln_series_status
        .iter()
        .map(|s| (s.series, s.stored_profiles, s.code, s.reason.as_str()))
        .collect();
    assert_eq!(
        statuses,
        vec![
            (1, 0, tonic::Code::InvalidArgument as i32, "label_too_long"),
            (2, 1, tonic::Code::InvalidArgument as i32, "not_protobuf"),
        ],
        "{response:?}"
    );
    assert_eq!(pod_total(&store, "a"), 40_000_000);
    assert_eq!(pod_total(&store, "b"), 0);
    assert_eq!(
        pod_total(&store, "c"),
        40_000_000,
        "the series stopped at its bad profile"
    );

    // Parca's and Pyroscope's clients get one status, as before, but the
    // good series are stored all the same.
    let status = client
        .write_raw(batch(["d", "e", "f"]))
        .await
        .expect_err("a series was refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("2 of 3 series not stored; series 1:"),
        "{}",
        status.message()
    );
    assert_eq!(pod_total(&store, "d"), 40_000_000);
    assert_eq!(pod_total(&store, "f"), 40_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_resent_with_its_idempotency_keys_is_stored_once() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let mut writer = client(&store).await;
    let now = now_nanos();
    let batch = |keys: &[&str]| WriteRawRequest {
        series: vec![
            series(
                &[("__name__", "process_cpu"), ("pod", "once-a")],
                vec![cpu_profile(now)],
            ),
            series(
                &[("__name__", "process_cpu"), ("pod", "once-b")],
                vec![cpu_profile(now), cpu_profile(now)],
            ),
        ],
        kiln_idempotency_keys: keys.iter().map(|k| (*k).to_string()).collect(),
        ..Default::default()
    };
    // The first answer was lost (as far as the client knows): it sends the
    // same batch again, and the store keeps one copy.
    for _ in 0..2 {
        writer
            .write_raw(batch(&["agent-1/1", "agent-1/2"]))
            .await
            .expect("stored");
    }
    assert_eq!(pod_total(&store, "once-a"), 40_000_000);
    assert_eq!(pod_total(&store, "once-b"), 80_000_000);
    // Across a restart too (the keys are in the WAL and the keys file).
    let data_dir = store.stop();
    let store = StoreProcess::start_in(KILN_STORE, data_dir, &[]);
    let mut writer = client(&store).await;
    writer
        .write_raw(batch(&["agent-1/1", "agent-1/2"]))
        .await
        .expect("stored");
    assert_eq!(pod_total(&store, "once-a"), 40_000_000);
    assert_eq!(pod_total(&store, "once-b"), 80_000_000);
    // A new key is a new profile, and a series without a key is stored as
    // sent.
    writer
        .write_raw(batch(&["agent-1/3"]))
        .await
        .expect("stored");
    assert_eq!(pod_total(&store, "once-a"), 80_000_000);
    assert_eq!(pod_total(&store, "once-b"), 160_000_000);
}

/// A key of the longest length a client may send (128 bytes) keys a series
/// of several profiles too, though each profile's stored key is longer (the
/// profile's index is added to it): it is stored once, and a longer key is
/// refused for its series alone, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_key_a_client_may_send_keys_a_series_of_several_profiles() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let mut writer = client(&store).await;
    let now = now_nanos();
    let batch = |pod: &str, key: String| WriteRawRequest {
        series: vec![series(
            &[("__name__", "process_cpu"), ("pod", pod)],
            vec![cpu_profile(now), cpu_profile(now)],
        )],
        kiln_idempotency_keys: vec![key],
        ..Default::default()
    };
    let longest = "k".repeat(128);
    for _ in 0..2 {
        writer
            .write_raw(batch("long-key", longest.clone()))
            .await
            .expect("stored");
    }
    assert_eq!(pod_total(&store, "long-key"), 80_000_000, "stored once");
    let status = writer
        .write_raw(batch("too-long-key", "k".repeat(129)))
        .await
        .expect_err("a key over 128 bytes");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("idempotency key"),
        "{}",
        status.message()
    );
    assert_eq!(pod_total(&store, "too-long-key"), 0);
}
