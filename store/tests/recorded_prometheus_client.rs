//! The recorded-series API as Prometheus' own Go client sees it
//! (`client_golang`'s `api/prometheus/v1`, built from source by the test
//! kit): `Buildinfo`, `LabelNames`, `LabelValues`, `Series`, `QueryRange`
//! and `Query`, the client's form POSTs taken without its fallback to
//! GET, and a query the API does not answer surfacing as the client's
//! `bad_data` error. `recorded_api.rs` is the hand-written HTTP twin.

use std::collections::BTreeMap;

use kiln_testkit::http::{enc, http};
use kiln_testkit::prometheus_api_client::{PromAnswers, PromRequest, PrometheusApiClient};
use kiln_testkit::rule_profiles::{RuleProfile, three_stack_cpu_profile};
use kiln_testkit::store_process::StoreProcess;

const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");
const TOKEN: &str = "prometheus-client-read-token";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// `rule_a`: all CPU time by service and pod; `rule_b`: the part under a
/// `fn_3_*` frame, by service only.
fn rules() -> String {
    serde_json::json!([
        {"metric_name": "rule_a", "profile_type": CPU, "group_by": ["service_name", "pod"]},
        {"metric_name": "rule_b", "profile_type": CPU, "function_regex": "fn_3_.*",
         "group_by": ["service_name"]}
    ])
    .to_string()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

/// The client's query and query_range went out as form POSTs and were
/// answered, so it never fell back to GET (it does on 403, 405 and 501).
#[track_caller]
fn posted(answers: &PromAnswers) {
    for path in ["query_range", "query", "labels", "series"] {
        let sent: Vec<&String> = answers
            .requests
            .iter()
            .filter(|r| r.split(' ').nth(1) == Some(&format!("/prometheus/api/v1/{path}")))
            .collect();
        assert_eq!(
            sent,
            [&format!("POST /prometheus/api/v1/{path} 200")],
            "{:?}",
            answers.requests
        );
    }
}

#[test]
fn prometheus_go_client_reads_recorded_series() {
    // Fixed, so the ranges below are too; ten minutes back, inside every
    // default window.
    let at = kiln_testkit::clock::now_ms() / 1000 - 600;
    let rules = rules();
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &[],
        &[
            ("KILN_RECORDING_RULES", &rules),
            ("KILN_READ_TOKENS", TOKEN),
        ],
    );
    let RuleProfile {
        pprof,
        total: cpu_total,
        fn3,
    } = three_stack_cpu_profile();
    // Two pods of one service: `sum by (service_name)` has two series to
    // add up.
    for pod in ["a", "b"] {
        let upload = http(
            store.addr,
            "POST",
            &format!(
                "/ingest?name={}&format=pprof&from={at}&until={}",
                enc(&format!("shop{{pod={pod}}}")),
                at + 10
            ),
            &[],
            &pprof,
        )
        .expect("upload");
        assert_eq!(upload.status, 200, "{}", upload.text());
    }

    let client_dir = tempfile::tempdir().expect("temp dir");
    let Some(client) = PrometheusApiClient::build(client_dir.path()) else {
        return;
    };
    let base = format!("{}/prometheus", store.url());
    let request = |query| PromRequest {
        start_s: at - 60,
        end_s: at + 60,
        step: "30s",
        query,
        series_matches: &["rule_a", "rule_b{service_name=\"shop\"}"],
    };

    let summed = client
        .run(&base, TOKEN, &request("sum by (service_name) (rule_a)"))
        .unwrap_or_else(|f| panic!("the client failed: {f:?}"));
    posted(&summed);
    assert!(!summed.buildinfo_version.is_empty(), "{summed:?}");
    assert_eq!(
        summed.label_names.as_deref(),
        Some(&["__name__", "pod", "service_name"].map(String::from)[..])
    );
    assert_eq!(
        summed.metric_names.as_deref(),
        Some(&["rule_a", "rule_b"].map(String::from)[..])
    );
    let mut series = summed.series.clone().unwrap_or_default();
    series.sort();
    assert_eq!(
        series,
        [
            labels(&[
                ("__name__", "rule_a"),
                ("pod", "a"),
                ("service_name", "shop")
            ]),
            labels(&[
                ("__name__", "rule_a"),
                ("pod", "b"),
                ("service_name", "shop")
            ]),
            labels(&[("__name__", "rule_b"), ("service_name", "shop")]),
        ]
    );
    let range = summed.range.clone().unwrap_or_default();
    assert_eq!(range.len(), 1, "one series per service: {range:?}");
    assert_eq!(range[0].metric, labels(&[("service_name", "shop")]));
    assert_eq!(summed.range_total, (2 * cpu_total) as f64, "{range:?}");
    // The instant query sums the five minutes before the range's end.
    assert_eq!(summed.instant_total, (2 * cpu_total) as f64, "{summed:?}");
    assert!(summed.warnings.is_empty(), "{:?}", summed.warnings);

    let filtered = client
        .run(&base, TOKEN, &request("rule_b{service_name=\"shop\"}"))
        .unwrap_or_else(|f| panic!("the client failed: {f:?}"));
    posted(&filtered);
    let range = filtered.range.clone().unwrap_or_default();
    assert_eq!(range.len(), 1, "{range:?}");
    assert_eq!(
        range[0].metric,
        labels(&[("__name__", "rule_b"), ("service_name", "shop")])
    );
    assert_eq!(filtered.range_total, (2 * fn3) as f64, "{range:?}");
    assert_eq!(filtered.instant_total, (2 * fn3) as f64, "{filtered:?}");

    let refused = client
        .run(&base, TOKEN, &request("rate(rule_a[5m])"))
        .expect_err("a function is not answered");
    assert_eq!(refused.failed_call, "query_range", "{refused:?}");
    assert_eq!(refused.error_type, "bad_data", "{refused:?}");
    assert!(refused.error.contains("rate"), "{refused:?}");
    assert_eq!(
        refused.requests.as_deref().and_then(<[String]>::last),
        Some(&"POST /prometheus/api/v1/query_range 400".to_owned()),
        "refused in Prometheus' shape, not by method: {refused:?}"
    );

    // Without the token the client sees the store's 401, not data.
    let anonymous = client
        .run(&base, "not-a-token", &request("rule_a"))
        .expect_err("the API is read-protected");
    assert_eq!(anonymous.failed_call, "buildinfo", "{anonymous:?}");
    assert_eq!(anonymous.error_type, "client_error", "{anonymous:?}");
}
