//! The recorded-series API as a client sees it, with no Prometheus: rules
//! given as `KILN_RECORDING_RULES` (the operator's way), read tokens on,
//! a profile uploaded, then `/metrics/recorded`, the Prometheus-compatible
//! `/prometheus/api/v1/*` (GET and Grafana's form POST), Prometheus-shaped
//! errors for what is not answered, and the series after a restart (WAL
//! replay) where the since-start counters begin again. The real-Prometheus
//! twin is `recording_rules_prometheus.rs`.

use kiln_testkit::http::{HttpResponse, enc, http};
use kiln_testkit::rule_profiles::{RuleProfile, three_stack_cpu_profile};
use kiln_testkit::store_process::StoreProcess;
use serde_json::Value;

const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");
const TOKEN: &str = "recorded-read-token";
const AUTH: (&str, &str) = ("Authorization", "Bearer recorded-read-token");
/// The profile's time, unix seconds: fixed, so the ranges below are too.
fn profile_s() -> i64 {
    kiln_testkit::clock::now_ms() / 1000 - 600
}

fn rules() -> String {
    serde_json::json!([
        {"metric_name": "kiln_cpu", "profile_type": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
         "group_by": ["service_name"]},
        {"metric_name": "kiln_fn3", "profile_type": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
         "function_regex": "fn_3_.*", "group_by": ["service_name", "pod"]},
        {"metric_name": "kiln_nothing_yet", "profile_type": "memory:alloc_space:bytes::"}
    ])
    .to_string()
}

fn start(data_dir: tempfile::TempDir) -> StoreProcess {
    let rules = rules();
    StoreProcess::start_with_env(
        KILN_STORE,
        data_dir,
        &[],
        &[
            ("KILN_RECORDING_RULES", &rules),
            ("KILN_READ_TOKENS", TOKEN),
        ],
    )
}

fn read(store: &StoreProcess, target: &str) -> HttpResponse {
    http(store.addr, "GET", target, &[AUTH], b"").expect("GET")
}

#[track_caller]
fn success(response: &HttpResponse, what: &str) -> Value {
    assert_eq!(response.status, 200, "{what}: {}", response.text());
    let body = response.json();
    assert_eq!(body["status"], "success", "{what}: {body}");
    body["data"].clone()
}

#[track_caller]
fn refused(response: &HttpResponse, what: &str) -> String {
    assert_eq!(response.status, 400, "{what}: {}", response.text());
    let body = response.json();
    assert_eq!(body["status"], "error", "{what}: {body}");
    assert_eq!(body["errorType"], "bad_data", "{what}: {body}");
    body["error"].as_str().unwrap_or_default().to_owned()
}

/// The sum of every point of every series of a matrix.
fn matrix_sum(data: &Value) -> i64 {
    assert_eq!(data["resultType"], "matrix", "{data}");
    data["result"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|series| series["values"].as_array().cloned().unwrap_or_default())
        .map(|point| {
            point[1]
                .as_str()
                .and_then(|v| v.parse::<i64>().ok())
                .expect("an integer value")
        })
        .sum()
}

/// `/api/v1/top`'s total over `[from, to]`.
fn top_total(store: &StoreProcess, from: i64, to: i64) -> i64 {
    let selector = enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{service_name=\"shop\"}");
    let top = read(
        store,
        &format!("/api/v1/top?query={selector}&from={from}&to={to}&limit=100000"),
    )
    .json();
    top["total"].as_i64().expect("a total")
}

#[test]
fn recorded_series_are_served_as_prometheus_text_and_a_prometheus_api() {
    let at = profile_s();
    let store = start(tempfile::tempdir().expect("temp dir"));
    let RuleProfile {
        pprof,
        total: cpu_total,
        fn3,
    } = three_stack_cpu_profile();
    let upload = http(
        store.addr,
        "POST",
        &format!(
            "/ingest?name={}&format=pprof&from={at}&until={}",
            enc("shop{pod=a}"),
            at + 10
        ),
        &[],
        &pprof,
    )
    .expect("upload");
    assert_eq!(upload.status, 200, "{}", upload.text());
    let (from, to) = (at - 60, at + 60);
    assert_eq!(
        top_total(&store, from, to),
        cpu_total,
        "the store holds the profile's CPU time"
    );

    // The scrape: read-protected, counters, every rule announced.
    assert_eq!(
        http(store.addr, "GET", "/metrics/recorded", &[], b"")
            .expect("GET")
            .status,
        401
    );
    let scraped = read(&store, "/metrics/recorded");
    assert_eq!(scraped.status, 200);
    let content_type = scraped
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.clone())
        .unwrap_or_default();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = scraped.text();
    for line in [
        "# TYPE kiln_cpu counter".to_owned(),
        format!("kiln_cpu{{service_name=\"shop\"}} {cpu_total}"),
        format!("kiln_fn3{{pod=\"a\",service_name=\"shop\"}} {fn3}"),
        "# TYPE kiln_nothing_yet counter".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from:\n{text}"
        );
    }

    // query_range, GET and form POST, a selector and a sum.
    let range = |query: &str| format!("query={}&start={from}&end={to}&step=30s", enc(query));
    let got = read(
        &store,
        &format!("/prometheus/api/v1/query_range?{}", range("kiln_cpu")),
    );
    assert_eq!(matrix_sum(&success(&got, "GET query_range")), cpu_total);
    let posted = http(
        store.addr,
        "POST",
        "/prometheus/api/v1/query_range",
        &[AUTH, ("Content-Type", "application/x-www-form-urlencoded")],
        range("sum by (pod) (kiln_fn3{service_name=\"shop\"})").as_bytes(),
    )
    .expect("POST");
    let data = success(&posted, "POST query_range");
    assert_eq!(matrix_sum(&data), fn3);
    assert_eq!(data["result"][0]["metric"], serde_json::json!({"pod": "a"}));

    // An instant query sums the five minutes before its time.
    let instant = read(
        &store,
        &format!("/prometheus/api/v1/query?query=kiln_cpu&time={}", at + 120),
    );
    let data = success(&instant, "query");
    assert_eq!(data["resultType"], "vector");
    assert_eq!(data["result"][0]["value"][1], cpu_total.to_string());
    let later = read(
        &store,
        &format!("/prometheus/api/v1/query?query=kiln_cpu&time={}", at + 1200),
    );
    assert_eq!(
        success(&later, "a later instant")["result"],
        serde_json::json!([])
    );
    let scalar = read(
        &store,
        &format!("/prometheus/api/v1/query?query={}", enc("1+1")),
    );
    assert_eq!(success(&scalar, "1+1")["result"][1], "2");

    // Listings.
    let window = format!("start={from}&end={to}");
    let names = success(
        &read(
            &store,
            &format!("/prometheus/api/v1/label/__name__/values?{window}"),
        ),
        "names",
    );
    assert_eq!(
        names,
        serde_json::json!(["kiln_cpu", "kiln_fn3", "kiln_nothing_yet"])
    );
    let labels = success(
        &read(&store, &format!("/prometheus/api/v1/labels?{window}")),
        "labels",
    );
    assert_eq!(
        labels,
        serde_json::json!(["__name__", "pod", "service_name"])
    );
    let series = success(
        &read(
            &store,
            &format!(
                "/prometheus/api/v1/series?{window}&match[]={}",
                enc("kiln_fn3")
            ),
        ),
        "series",
    );
    assert_eq!(
        series,
        serde_json::json!([{"__name__": "kiln_fn3", "pod": "a", "service_name": "shop"}])
    );
    let build = success(
        &read(&store, "/prometheus/api/v1/status/buildinfo"),
        "buildinfo",
    );
    assert!(build["version"].is_string());

    // What is not answered is refused in Prometheus' shape.
    for (target, why) in [
        (
            format!(
                "/prometheus/api/v1/query_range?{}",
                range("rate(kiln_cpu[5m])")
            ),
            "a function",
        ),
        (
            format!("/prometheus/api/v1/query_range?query=kiln_cpu&start={from}&end={to}&step=0"),
            "a zero step",
        ),
        (
            format!(
                "/prometheus/api/v1/query_range?query=kiln_cpu&start={from}&end={}&step=1",
                from + 20_000
            ),
            "too many points",
        ),
        (
            format!("/prometheus/api/v1/query_range?query=kiln_cpu&start={to}&end={from}&step=1"),
            "end before start",
        ),
        (
            "/prometheus/api/v1/query?query=%7Bpod%3D%22a%22%7D".to_owned(),
            "no metric name",
        ),
        ("/prometheus/api/v1/query".to_owned(), "no query"),
    ] {
        let message = refused(&read(&store, &target), why);
        assert!(!message.is_empty(), "{why}: an empty message");
    }
    let json_post = http(
        store.addr,
        "POST",
        "/prometheus/api/v1/query",
        &[AUTH, ("Content-Type", "application/json")],
        b"{\"query\":\"kiln_cpu\"}",
    )
    .expect("POST");
    refused(&json_post, "a JSON body");

    // A restart replays the WAL: the series keep their points, and the
    // since-start counters begin again.
    let data_dir = store.stop();
    let store = start(data_dir);
    let got = read(
        &store,
        &format!("/prometheus/api/v1/query_range?{}", range("kiln_cpu")),
    );
    assert_eq!(matrix_sum(&success(&got, "after a restart")), cpu_total);
    let text = read(&store, "/metrics/recorded").text();
    assert!(
        text.lines().any(|l| l == "# TYPE kiln_cpu counter")
            && !text.lines().any(|l| l.starts_with("kiln_cpu{")),
        "no ingest since the restart:\n{text}"
    );
}

#[test]
fn a_rule_that_does_not_compile_stops_the_store_with_its_name() {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let output = std::process::Command::new(KILN_STORE)
        .env(
            "KILN_RECORDING_RULES",
            r#"[{"metric_name":"bad_rule","profile_type":"process_cpu:cpu:nanoseconds:cpu:nanoseconds","function_regex":"("}]"#,
        )
        .env("KILN_DATA_DIR", data_dir.path())
        .env("KILN_LISTEN", "127.0.0.1:0")
        .output()
        .expect("run kiln-store");
    assert!(
        !output.status.success(),
        "the store started with a broken rule"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad_rule") && stderr.contains("recording"),
        "the error names the rule: {stderr}"
    );
}
