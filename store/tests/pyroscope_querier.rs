//! Grafana's request shapes against a real `kiln-store`: `querier.v1`
//! calls written from `querier.proto`'s field numbers and sent the way
//! Grafana's Pyroscope datasource sends them (Connect JSON with
//! `Content-Type: application/json` and `Connect-Protocol-Version: 1`, and
//! Connect binary), answering the same totals as Kiln's own `/api/v1` for
//! the same selection; plus `/pyroscope/render`, errors and auth.

use kiln_api::querier::v1 as q;
use kiln_testkit::clock::now_ms;
use kiln_testkit::http::{
    Connect, enc, get, http, json_int64, querier_call, querier_json, stored_profile_type,
};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;
use serde_json::{Value, json};

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// Seeds two series of one service: env=prod (`main;work` 30 + `main;idle`
/// 10 samples) and env=dev (`main;work` 5), folded at 100 Hz.
fn seeded_store(envs: &[(&str, &str)], token: Option<&str>) -> StoreProcess {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let store = StoreProcess::start_with_env(KILN_STORE, data_dir, &[], envs);
    let auth = token.map(|t| format!("Bearer {t}"));
    for (env, body) in [
        ("prod", "main;work 30\nmain;idle 10"),
        ("dev", "main;work 5"),
    ] {
        let name = enc(&format!("checkout.cpu{{env={env}}}"));
        let target =
            format!("/ingest?name={name}&from=now-30s&until=now-20s&sampleRate=100&format=folded");
        let mut headers = vec![];
        if let Some(auth) = &auth {
            headers.push(("Authorization", auth.as_str()));
        }
        let response =
            http(store.addr, "POST", &target, &headers, body.as_bytes()).expect("POST /ingest");
        assert_eq!(response.status, 200, "{}", response.text());
    }
    store
}

#[test]
fn grafana_shaped_calls_answer_the_same_totals_as_kilns_own_api() {
    let seeding = now_ms();
    let store = seeded_store(&[], None);
    let seeded = now_ms();
    let type_id = stored_profile_type(store.addr, "");
    let end = now_ms();
    let start = end - 3_600_000;
    let selector = "{service_name=\"checkout\"}";
    let own = get(
        store.addr,
        &format!(
            "/api/v1/flamegraph?query={}&from={start}&to={end}",
            enc(&format!("{type_id}{selector}"))
        ),
    )
    .json();
    let own_total = own["total"].as_i64().unwrap();
    assert_eq!(own_total, 450_000_000, "45 samples at 100 Hz: {own}");

    let (status, types) = querier_json(
        store.addr,
        "ProfileTypes",
        &json!({"start": start.to_string(), "end": end.to_string()}),
    );
    assert_eq!(status, 200, "{types}");
    assert_eq!(types["profileTypes"][0]["ID"], type_id.as_str());
    assert_eq!(types["profileTypes"][0]["name"], "process_cpu");

    let (status, names) = querier_json(
        store.addr,
        "LabelNames",
        &json!({"matchers": [selector], "start": start, "end": end}),
    );
    assert_eq!(status, 200, "{names}");
    let own_names = get(
        store.addr,
        &format!(
            "/api/v1/labels?query={}&from={start}&to={end}",
            enc(selector)
        ),
    )
    .json();
    assert_eq!(names["names"], own_names["names"]);

    let (status, values) = querier_json(
        store.addr,
        "LabelValues",
        &json!({"name": "env", "matchers": [selector], "start": start, "end": end}),
    );
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["names"], json!(["dev", "prod"]));

    let (status, series) = querier_json(
        store.addr,
        "Series",
        &json!({"matchers": [selector], "labelNames": ["env", "service_name"], "start": start, "end": end}),
    );
    assert_eq!(status, 200, "{series}");
    assert_eq!(
        series["labelsSet"].as_array().map(Vec::len),
        Some(2),
        "{series}"
    );

    let select = json!({
        "profileTypeID": type_id, "labelSelector": selector,
        "start": start.to_string(), "end": end.to_string(), "maxNodes": "16384",
        "format": "PROFILE_FORMAT_FLAMEGRAPH",
    });
    let (status, merged) = querier_json(store.addr, "SelectMergeStacktraces", &select);
    assert_eq!(status, 200, "{merged}");
    let graph = &merged["flamegraph"];
    assert_eq!(json_int64(&graph["total"]), own_total);
    let names: Vec<&str> = graph["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in ["total", "main", "work", "idle"] {
        assert!(names.contains(&name), "{names:?}");
    }
    let root: Vec<i64> = graph["levels"][0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(json_int64)
        .collect();
    assert_eq!(root[..3], [0, own_total, 0], "root quad");

    let step_seconds = 60;
    let own_timeline = get(
        store.addr,
        &format!(
            "/api/v1/timeline?query={}&from={start}&to={end}&step={step_seconds}s",
            enc(&format!("{type_id}{selector}"))
        ),
    )
    .json();
    let own_sum: i64 = own_timeline["timeline"]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(json_int64)
        .sum();
    let (status, series) = querier_json(
        store.addr,
        "SelectSeries",
        &json!({
            "profileTypeID": type_id, "labelSelector": selector, "start": start, "end": end,
            "step": step_seconds, "groupBy": ["env"], "aggregation": "TIME_SERIES_AGGREGATION_TYPE_SUM",
        }),
    );
    assert_eq!(status, 200, "{series}");
    let groups = series["series"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{series}");
    let sum: f64 = groups
        .iter()
        .flat_map(|s| {
            s["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["value"].as_f64().unwrap())
        })
        .sum();
    assert_eq!(sum as i64, own_sum);
    assert_eq!(own_sum, own_total);

    let left = json!({"profileTypeID": type_id, "labelSelector": "{env=\"dev\"}", "start": start, "end": end});
    let right = json!({"profileTypeID": type_id, "labelSelector": "{env=\"prod\"}", "start": start, "end": end});
    let (status, diff) = querier_json(store.addr, "Diff", &json!({"left": left, "right": right}));
    assert_eq!(status, 200, "{diff}");
    assert_eq!(json_int64(&diff["flamegraph"]["leftTicks"]), 50_000_000);
    assert_eq!(json_int64(&diff["flamegraph"]["rightTicks"]), 400_000_000);

    let (status, stats) = querier_json(store.addr, "GetProfileStats", &json!({}));
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["dataIngested"], true);
    // The seeded profiles span `now-30s`..`now-20s` as the store read `now`:
    // their first and last sample, to the millisecond, lie within that.
    let (oldest, newest) = (
        json_int64(&stats["oldestProfileTime"]),
        json_int64(&stats["newestProfileTime"]),
    );
    eprintln!(
        "GetProfileStats: oldest {} ms, newest {} ms before the seeding ended",
        seeded - oldest,
        seeded - newest
    );
    assert!(oldest <= newest, "{stats}");
    assert!(
        oldest >= seeding - 31_000 && newest <= seeded - 19_000,
        "{stats}: not within the seeded range {}..{}",
        seeding - 31_000,
        seeded - 19_000
    );

    // Connect binary: the same SelectMergeStacktraces as protobuf.
    let request = q::SelectMergeStacktracesRequest {
        profile_type_id: type_id.clone(),
        label_selector: selector.to_owned(),
        start,
        end,
        max_nodes: Some(16_384),
        format: q::ProfileFormat::Flamegraph as i32,
        ..Default::default()
    };
    let response = querier_call(
        store.addr,
        "SelectMergeStacktraces",
        Connect::Proto,
        &request.encode_to_vec(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let reply = q::SelectMergeStacktracesResponse::decode(response.body.as_slice()).unwrap();
    assert_eq!(reply.flamegraph.map(|g| g.total), Some(own_total));

    let request = q::SelectMergeProfileRequest {
        profile_type_id: type_id.clone(),
        label_selector: selector.to_owned(),
        start,
        end,
        ..Default::default()
    };
    let response = querier_call(
        store.addr,
        "SelectMergeProfile",
        Connect::Proto,
        &request.encode_to_vec(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let pprof = kiln_pprof::proto::Profile::decode(response.body.as_slice()).unwrap();
    let pprof_total: i64 = pprof.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(pprof_total, own_total);

    // max_nodes trims the profile to its heaviest functions and one
    // `(other)`, its total unchanged.
    let request = q::SelectMergeProfileRequest {
        profile_type_id: type_id.clone(),
        label_selector: selector.to_owned(),
        start,
        end,
        max_nodes: Some(1),
        ..Default::default()
    };
    let response = querier_call(
        store.addr,
        "SelectMergeProfile",
        Connect::Proto,
        &request.encode_to_vec(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let trimmed = kiln_pprof::proto::Profile::decode(response.body.as_slice()).unwrap();
    eprintln!(
        "SelectMergeProfile: {} functions whole, {} with max_nodes=1",
        pprof.function.len(),
        trimmed.function.len()
    );
    assert!(
        pprof.function.len() > 2,
        "the seeded profile has more functions"
    );
    assert!(trimmed.function.len() <= 2, "one kept and (other)");
    let trimmed_total: i64 = trimmed.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(trimmed_total, own_total);

    let render = get(
        store.addr,
        &format!(
            "/pyroscope/render?query={}&from={}&until={}",
            enc(&format!("{type_id}{selector}")),
            start / 1000,
            end / 1000 + 1
        ),
    );
    assert_eq!(render.status, 200, "{}", render.text());
    let render = render.json();
    assert_eq!(render["flamebearer"]["numTicks"].as_i64(), Some(own_total));
    let timeline_sum: i64 = render["timeline"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(json_int64)
        .sum();
    assert_eq!(timeline_sum, own_total);
    let values = get(store.addr, "/pyroscope/label-values?label=env").json();
    assert_eq!(values, json!(["dev", "prod"]));
}

#[test]
fn querier_errors_use_connect_codes_and_read_tokens() {
    let store = seeded_store(
        &[
            ("KILN_READ_TOKENS", "reader"),
            ("KILN_WRITE_TOKENS", "writer"),
        ],
        Some("writer"),
    );
    let (status, body) = querier_json(store.addr, "LabelNames", &json!({}));
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["code"], "unauthenticated");

    let call = |method: &str, body: &Value| {
        let response = http(
            store.addr,
            "POST",
            &format!("/querier.v1.QuerierService/{method}"),
            &[
                ("Content-Type", "application/json"),
                ("Connect-Protocol-Version", "1"),
                ("Authorization", "Bearer reader"),
            ],
            body.to_string().as_bytes(),
        )
        .unwrap();
        (response.status, response.json())
    };
    let (status, body) = call("LabelNames", &json!({}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        "SelectMergeStacktraces",
        &json!({"profileTypeID": "process_cpu", "labelSelector": "{env=}"}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "invalid_argument");
    let (status, body) = call(
        "SelectMergeStacktraces",
        &json!({"profileTypeID": "process_cpu", "format": "PROFILE_FORMAT_TREE"}),
    );
    assert_eq!(status, 501, "{body}");
    assert_eq!(body["code"], "unimplemented");
    let (status, body) = call("SelectHeatmap", &json!({}));
    assert_eq!(status, 501, "{body}");
    // Span exemplars are refused, not silently left out of the answer.
    let series = |exemplars: &str| {
        call(
            "SelectSeries",
            &json!({"profileTypeID": "process_cpu", "labelSelector": "{}", "step": 10, "exemplarType": exemplars}),
        )
    };
    let (status, body) = series("EXEMPLAR_TYPE_SPAN");
    assert_eq!(status, 501, "{body}");
    assert_eq!(body["code"], "unimplemented");
    assert!(
        body["message"].to_string().contains("EXEMPLAR_TYPE_SPAN"),
        "{body}"
    );
    for asked in ["EXEMPLAR_TYPE_NONE", "EXEMPLAR_TYPE_INDIVIDUAL"] {
        let (status, body) = series(asked);
        assert_eq!(status, 200, "{asked}: {body}");
    }
    // A profile id that Kiln did not issue is a bad parameter, named.
    let (status, body) = call(
        "SelectMergeStacktraces",
        &json!({"profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "profileIdSelector": ["7c9e6679-7425-40de-944b-e07fc1f90ae7"]}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "invalid_argument");
    assert!(
        body["message"]
            .to_string()
            .contains("not a profile id that Kiln issued"),
        "{body}"
    );
    let (status, body) = call("LabelValues", &json!({"name": 7}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("`name` must be a string"),
        "{body}"
    );
    let render = get(store.addr, "/pyroscope/render?query=process_cpu");
    assert_eq!(render.status, 401);
}

/// Grafana's own Go client (`github.com/grafana/pyroscope/api`'s
/// `querierv1connect`) calls every `querier.v1` method, in Connect's
/// binary and JSON codecs, on what the real Go SDKs uploaded (a span-tagged
/// CPU profile: OpenTelemetry SDK, `otel-profiling-go`, `pyroscope-go`).
/// Every total agrees with Kiln's own `/api/v1` for the same selection,
/// and the two methods Kiln does not serve say `unimplemented`.
#[test]
fn grafanas_own_go_client_calls_every_method_in_both_codecs() {
    use kiln_testkit::grafana_client::{Selection, run_grafana_querier_client};
    use kiln_testkit::real_inputs::span_profiles::{SLOW_FUNCTION, run_span_profiles_app};

    let store = StoreProcess::start(KILN_STORE, &[]);
    let work = tempfile::tempdir().expect("temporary directory");
    let app = "kiln.grafana.client";
    let Some(spans) = run_span_profiles_app(work.path(), &store.url(), app, 2.0) else {
        return;
    };
    let end = now_ms();
    let start = end - 600_000;
    let cpu_type = stored_profile_type(store.addr, "process_cpu:cpu:nanoseconds");
    let selector = format!("{{service_name=\"{app}\"}}");
    let own_total = |extra: &str| {
        let own = get(
            store.addr,
            &format!(
                "/api/v1/flamegraph?query={}&from={start}&to={end}{extra}",
                enc(&format!("{cpu_type}{selector}"))
            ),
        )
        .json();
        own["total"].as_i64().unwrap_or_else(|| panic!("{own}"))
    };
    let total = own_total("");
    let span_total = own_total(&format!("&span_id={}", spans.slow));
    assert!(
        0 < span_total && span_total < total,
        "{span_total} of {total}"
    );

    let Some(answers) = run_grafana_querier_client(
        work.path(),
        &store.url(),
        &Selection {
            profile_type: &cpu_type,
            label_selector: &selector,
            start_ms: start,
            end_ms: end,
            span_id: &spans.slow,
        },
    ) else {
        return;
    };
    assert_eq!(answers.len(), 2, "{answers:?}");
    for a in &answers {
        let codec = &a.codec;
        let has = |list: &Option<Vec<String>>, name: &str| {
            list.as_deref()
                .unwrap_or_default()
                .iter()
                .any(|n| n == name)
        };
        assert!(has(&a.profile_types, &cpu_type), "{codec}: {a:?}");
        assert!(has(&a.label_names, "service_name"), "{codec}: {a:?}");
        assert!(
            !has(&a.label_names, "span_id"),
            "{codec}: span ids made series"
        );
        assert!(has(&a.service_names, app), "{codec}: {a:?}");
        assert!(a.series >= 1, "{codec}: {a:?}");
        assert_eq!(
            a.stacktraces_total, total,
            "{codec}: SelectMergeStacktraces"
        );
        assert_eq!(a.span_total, span_total, "{codec}: SelectMergeSpanProfile");
        assert!(has(&a.span_names, SLOW_FUNCTION), "{codec}: {a:?}");
        assert_eq!(a.profile_total, total, "{codec}: SelectMergeProfile");
        assert!(a.profile_functions > 0, "{codec}: {a:?}");
        assert_eq!(a.series_total, total as f64, "{codec}: SelectSeries");
        // Exemplars: each point's heaviest profile, never more than the
        // point, and opened by its id it answers its own total.
        eprintln!(
            "{codec}: {} exemplars; the heaviest, {}, weighs {} of {total}",
            a.exemplars, a.exemplar_id, a.exemplar_value
        );
        assert!(a.exemplars >= 1, "{codec}: no exemplars {a:?}");
        assert!(!a.exemplar_over_point, "{codec}: {a:?}");
        assert!(
            0 < a.exemplar_value && a.exemplar_value <= total,
            "{codec}: {a:?}"
        );
        assert!(a.exemplar_labels >= 1, "{codec}: {a:?}");
        assert_eq!(
            a.exemplar_profile_total, a.exemplar_value,
            "{codec}: SelectMergeProfile by id {}",
            a.exemplar_id
        );
        assert_eq!(
            a.exemplar_stacktraces_total, a.exemplar_value,
            "{codec}: SelectMergeStacktraces by id {}",
            a.exemplar_id
        );
        assert_eq!(
            (a.diff_left_ticks, a.diff_right_ticks),
            (total, total),
            "{codec}: Diff"
        );
        assert!(a.data_ingested, "{codec}: GetProfileStats");
        assert!(
            start <= a.oldest_profile_time
                && a.oldest_profile_time <= a.newest_profile_time
                && a.newest_profile_time <= end,
            "{codec}: GetProfileStats {a:?}"
        );
        assert_eq!(a.select_heatmap, "unimplemented", "{codec}");
        assert_eq!(a.analyze_query, "unimplemented", "{codec}");
    }
}
