//! Recording rules against a real Prometheus (issue 53): a store with two
//! rules over CPU time is scraped every second by a Prometheus server built
//! from source, and what PromQL reads from Prometheus' TSDB equals what the
//! store's own `/api/v1` answers for the same selection, once a scrape has
//! started after the last upload. The store's Prometheus-compatible
//! `query_range` adds up to the same totals.
//!
//! The profiles are real: the UI's Go workload writes a `runtime/pprof`
//! CPU profile per service, and each is uploaded several times, as an SDK
//! uploads one profile per interval.

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_testkit::clock::now_ms;
use kiln_testkit::go_programs::workload_cpu_profiles;
use kiln_testkit::http::{enc, get, http, stored_profile_type};
use kiln_testkit::prometheus::{PrometheusProcess, ScrapeTarget, prometheus_binary};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

const PROFILE_TYPE: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// Rule A: all of a service's CPU time.
const ALL_CPU: &str = "kiln_cpu_nanoseconds_total";
/// Rule B: the CPU time of the stacks that run [`HOT_FUNCTION`].
const HOT_CPU: &str = "kiln_hot_function_cpu_nanoseconds_total";
/// The workload's shared hot function: every service hashes, and `search`
/// also sorts, so rule B is below rule A.
const HOT_FUNCTION: &str = "main.hashItems";
const SERVICES: [&str; 2] = ["checkout", "search"];
/// Each service's profile is uploaded this many times, with a scrape
/// between uploads, so the counters are seen growing.
const ROUNDS: i64 = 3;
/// Prometheus scrapes every second; a scrape after an upload comes well
/// within this, even on a loaded machine.
const SCRAPE_WITHIN: Duration = Duration::from_secs(30);

#[test]
fn prometheus_scraping_recording_rules_stores_the_totals_the_api_answers() {
    let work = tempfile::tempdir().expect("temp dir");
    let Some(profiles) = workload_cpu_profiles(work.path()) else {
        return;
    };
    let Some(prometheus) = prometheus_binary() else {
        return;
    };
    let config = work.path().join("kiln.toml");
    std::fs::write(&config, store_config()).expect("write the store's config");
    let config = config.to_str().expect("a UTF-8 temp path");
    let store = StoreProcess::start(KILN_STORE, &["--config", config]);
    let prometheus = PrometheusProcess::start(
        &prometheus,
        &ScrapeTarget {
            addr: store.addr,
            metrics_path: "/metrics/recorded",
            bearer_token: None,
        },
    );

    // The range every /api/v1 question covers: from before the first
    // profile's time to after the last upload.
    let start_s = now_ms() / 1000 - 300;
    for round in 0..ROUNDS {
        for service in SERVICES {
            let (_, profile) = profiles
                .iter()
                .find(|(s, _)| *s == service)
                .expect("the workload plays every service");
            let body = std::fs::read(profile).expect("the workload's profile");
            // Distinct times: one profile per interval, as an SDK sends.
            let from = start_s + 200 + 10 * round;
            upload(&store, service, from, &body);
        }
        let uploaded = now_ms() as f64 / 1000.0;
        prometheus.wait_for_scrape_after(uploaded, SCRAPE_WITHIN);
        let end_s = now_ms() / 1000 + 1;
        check_totals(&store, &prometheus, start_s, end_s);
    }
    assert!(
        prometheus.scrapes() >= ROUNDS as u64,
        "Prometheus scraped at least once a round"
    );
}

/// Per service, Prometheus' last value of each rule equals the store's
/// `/api/v1/top` for `[start_s, end_s]`, and so does the sum of the points
/// of the store's own `/prometheus/api/v1/query_range` over that range.
#[track_caller]
fn check_totals(store: &StoreProcess, prometheus: &PrometheusProcess, start_s: i64, end_s: i64) {
    let profile_type = stored_profile_type(store.addr, PROFILE_TYPE);
    let range_all = query_range_sums(store, ALL_CPU, start_s, end_s);
    let range_hot = query_range_sums(store, HOT_CPU, start_s, end_s);
    let (mut all_sum, mut hot_sum) = (0, 0);
    for service in SERVICES {
        let (total, hot) = api_totals(store, &profile_type, service, start_s, end_s);
        assert!(total > 0 && hot > 0, "{service}: no CPU time recorded");
        let scraped_all = counter(prometheus, ALL_CPU, service);
        let scraped_hot = counter(prometheus, HOT_CPU, service);
        assert_eq!(
            scraped_all, total,
            "{service}: {ALL_CPU} against /api/v1/top's total"
        );
        assert_eq!(
            scraped_hot, hot,
            "{service}: {HOT_CPU} against /api/v1/top's cumulative value of {HOT_FUNCTION}"
        );
        assert_eq!(
            range_all.get(service),
            Some(&total),
            "{service}: query_range of {ALL_CPU}"
        );
        assert_eq!(
            range_hot.get(service),
            Some(&hot),
            "{service}: query_range of {HOT_CPU}"
        );
        assert!(
            hot <= total,
            "{service}: the hot function's stacks are part of all stacks"
        );
        all_sum += total;
        hot_sum += hot;
    }
    assert!(hot_sum < all_sum, "search sorts outside {HOT_FUNCTION}");
}

/// The rules: a TOML config file for `--config`.
fn store_config() -> String {
    format!(
        "version = 1\n\n\
         [[recording.recording_rules]]\n\
         metric_name = \"{ALL_CPU}\"\n\
         profile_type = \"{PROFILE_TYPE}\"\n\
         group_by = [\"service_name\"]\n\n\
         [[recording.recording_rules]]\n\
         metric_name = \"{HOT_CPU}\"\n\
         profile_type = \"{PROFILE_TYPE}\"\n\
         function = \"{HOT_FUNCTION}\"\n\
         group_by = [\"service_name\"]\n"
    )
}

/// Uploads a CPU pprof as pyroscope-go does, `service` as the app name
/// (the `service_name` label), the profile timed at `from`.
#[track_caller]
fn upload(store: &StoreProcess, service: &str, from: i64, body: &[u8]) {
    let target = format!(
        "/ingest?name={}&format=pprof&from={from}&until={}",
        enc(&format!("{service}{{env=test}}")),
        from + 10
    );
    let response = http(store.addr, "POST", &target, &[], body).expect("upload");
    assert_eq!(response.status, 200, "{service}: {}", response.text());
}

/// `(total, cumulative value of HOT_FUNCTION)` of a service's CPU time, as
/// `/api/v1/top` answers them.
#[track_caller]
fn api_totals(
    store: &StoreProcess,
    profile_type: &str,
    service: &str,
    start_s: i64,
    end_s: i64,
) -> (i64, i64) {
    let selector = format!("{profile_type}{{service_name=\"{service}\"}}");
    let response = get(
        store.addr,
        &format!(
            "/api/v1/top?query={}&from={start_s}&to={end_s}&limit=100000",
            enc(&selector)
        ),
    );
    assert_eq!(response.status, 200, "{selector}: {}", response.text());
    let top = response.json();
    let total = top["total"].as_i64().expect("top has a total");
    let hot = top["top"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|row| row["name"] == HOT_FUNCTION)
        .and_then(|row| row["cumulative"].as_i64())
        .unwrap_or_else(|| panic!("{HOT_FUNCTION} is not in {service}'s top table: {top}"));
    (total, hot)
}

/// Prometheus' last scraped value of `metric` for `service`, an integer.
#[track_caller]
fn counter(prometheus: &PrometheusProcess, metric: &str, service: &str) -> i64 {
    let value = prometheus.query_one(&format!("{metric}{{service_name=\"{service}\"}}"));
    assert!(
        value.fract() == 0.0 && value >= 0.0,
        "{metric}: {value} is not a count of nanoseconds"
    );
    value as i64
}

/// The sum of every point the store's `/prometheus/api/v1/query_range`
/// answers for `sum by (service_name) (metric)` over `[start_s, end_s]`,
/// per service. One step spans the range, so its points cover it.
#[track_caller]
fn query_range_sums(
    store: &StoreProcess,
    metric: &str,
    start_s: i64,
    end_s: i64,
) -> BTreeMap<String, i64> {
    let query = format!("sum by (service_name) ({metric})");
    let step = end_s - start_s;
    let response = get(
        store.addr,
        &format!(
            "/prometheus/api/v1/query_range?query={}&start={start_s}&end={end_s}&step={step}",
            enc(&query)
        ),
    );
    assert_eq!(response.status, 200, "{query}: {}", response.text());
    let body = response.json();
    assert_eq!(body["status"], "success", "{query}: {body}");
    assert_eq!(body["data"]["resultType"], "matrix", "{query}: {body}");
    let mut sums = BTreeMap::new();
    for series in body["data"]["result"].as_array().into_iter().flatten() {
        let service = series["metric"]["service_name"]
            .as_str()
            .unwrap_or_else(|| panic!("{query}: a series without service_name: {series}"))
            .to_owned();
        let sum: f64 = series["values"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|point| {
                point[1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("{query}: not a [t, \"v\"] point: {point}"))
            })
            .sum();
        assert!(sum.fract() == 0.0, "{query}: {service} sums to {sum}");
        *sums.entry(service).or_insert(0) += sum as i64;
    }
    sums
}
