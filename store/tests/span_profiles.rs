//! Span profiles against a real `kiln-store`: samples labelled with a
//! tracing span's id stay per sample (no series per span) and
//! `SelectMergeSpanProfile` (Connect JSON and binary), `/api/v1`'s
//! `span_id` and the CLI's `--span-id` keep only the samples of the asked
//! spans. The inputs are a pprof built here, and the uploads of the real
//! SDKs: the OpenTelemetry Go SDK with `grafana/otel-profiling-go` and
//! `grafana/pyroscope-go`.

use kiln_api::querier::v1 as q;
use kiln_pprof::{FunctionSpec, LabelValue, ProfileBuilder};
use kiln_testkit::clock::now_ms;
use kiln_testkit::http::{
    Connect, enc, flamegraph_names, get, http, querier_call, stored_profile_type,
};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;
use serde_json::{Value, json};

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

const SPAN_SLOW: &str = "9a517183f26a089d";
const SPAN_OTHER: &str = "5A4FE264A9C987FE";
const SPAN_NEVER: &str = "0000000000000042";
const TRACE_SLOW: &str = "0af7651916cd43dd8448eb211c80319c";
const TRACE_OTHER: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// A CPU pprof: `main;slow` 70 ms in span SPAN_SLOW of trace TRACE_SLOW,
/// `main;other` 40 ms in span SPAN_OTHER (written in capitals, as some SDKs
/// do) of TRACE_OTHER, `main;idle` 20 ms in no span.
fn span_labelled_pprof() -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    let frame = |builder: &mut ProfileBuilder, name: &str, address: u64| {
        let function = builder.function(&FunctionSpec {
            name: name.to_owned(),
            system_name: name.to_owned(),
            filename: "spans.go".to_owned(),
            start_line: 1,
        });
        builder.location(0, address, &[(function, 1)])
    };
    let main = frame(&mut builder, "main", 0x10);
    let slow = frame(&mut builder, "slow", 0x20);
    let other = frame(&mut builder, "other", 0x30);
    let idle = frame(&mut builder, "idle", 0x40);
    let span = |id: &'static str, name: &'static str, trace: &'static str| {
        vec![
            ("span_id", LabelValue::Str(id.to_owned())),
            ("span_name", LabelValue::Str(name.to_owned())),
            ("trace_id", LabelValue::Str(trace.to_owned())),
        ]
    };
    builder.sample(
        &[slow, main],
        &[70_000_000],
        &span(SPAN_SLOW, "slow-request", TRACE_SLOW),
    );
    builder.sample(
        &[other, main],
        &[40_000_000],
        &span(SPAN_OTHER, "other-request", TRACE_OTHER),
    );
    builder.sample(&[idle, main], &[20_000_000], &[]);
    builder.finish().encode_to_vec()
}

/// `SelectMergeSpanProfile` in `encoding`: status, total and names.
fn span_profile(
    store: &StoreProcess,
    encoding: Connect,
    profile_type: &str,
    selector: &str,
    spans: &[&str],
) -> (u16, i64, Vec<String>, String) {
    let end = now_ms();
    let start = end - 600_000;
    let body = match encoding {
        Connect::Json => json!({
            "profileTypeID": profile_type,
            "labelSelector": selector,
            "spanSelector": spans,
            "start": start.to_string(),
            "end": end,
        })
        .to_string()
        .into_bytes(),
        Connect::Proto => q::SelectMergeSpanProfileRequest {
            profile_type_id: profile_type.to_owned(),
            label_selector: selector.to_owned(),
            span_selector: spans.iter().map(|s| (*s).to_owned()).collect(),
            start,
            end,
            max_nodes: None,
            format: q::ProfileFormat::Flamegraph as i32,
        }
        .encode_to_vec(),
    };
    let response = querier_call(store.addr, "SelectMergeSpanProfile", encoding, &body);
    if response.status != 200 {
        return (response.status, 0, Vec::new(), response.text());
    }
    match encoding {
        Connect::Json => {
            let reply: Value = response.json();
            let total = reply["flamegraph"]["total"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("a string int64 total: {reply}"));
            (200, total, flamegraph_names(&reply), String::new())
        }
        Connect::Proto => {
            let reply = q::SelectMergeSpanProfileResponse::decode(response.body.as_slice())
                .expect("a SelectMergeSpanProfileResponse");
            let graph = reply.flamegraph.unwrap_or_default();
            (200, graph.total, graph.names, String::new())
        }
    }
}

#[test]
fn span_ids_stay_on_samples_and_select_the_samples_of_their_spans() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let response = http(
        store.addr,
        "POST",
        "/ingest?name=spans.app&format=pprof&from=now-30s&until=now-20s",
        &[],
        &span_labelled_pprof(),
    )
    .expect("POST /ingest");
    assert_eq!(response.status, 200, "{}", response.text());
    let profile_type = stored_profile_type(store.addr, "");
    let selector = "{service_name=\"spans.app\"}";

    // No span made a series: one series, and no span label among its names.
    let names = get(store.addr, "/api/v1/labels?from=now-10m").json();
    let names: Vec<&str> = names["names"]
        .as_array()
        .map(|n| n.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for per_sample in ["span_id", "span_name", "trace_id"] {
        assert!(!names.contains(&per_sample), "{per_sample} in {names:?}");
    }

    for encoding in [Connect::Json, Connect::Proto] {
        let (status, total, names, _) =
            span_profile(&store, encoding, &profile_type, selector, &[SPAN_SLOW]);
        assert_eq!((status, total), (200, 70_000_000), "{encoding:?}");
        assert!(names.iter().any(|n| n == "slow"), "{names:?}");
        assert!(
            !names.iter().any(|n| n == "other" || n == "idle"),
            "{names:?}"
        );
        let (_, total, names, _) = span_profile(
            &store,
            encoding,
            &profile_type,
            selector,
            &[SPAN_SLOW, &SPAN_OTHER.to_lowercase()],
        );
        assert_eq!(total, 110_000_000, "{encoding:?}: both spans, case aside");
        assert!(!names.iter().any(|n| n == "idle"), "{names:?}");
        let (status, total, _, _) =
            span_profile(&store, encoding, &profile_type, selector, &[SPAN_NEVER]);
        assert_eq!(
            (status, total),
            (200, 0),
            "{encoding:?}: a span with no samples"
        );
        // A malformed or missing span id is a clear 400, never the whole profile.
        let (status, _, _, body) =
            span_profile(&store, encoding, &profile_type, selector, &["span-1"]);
        assert_eq!(status, 400, "{encoding:?}: {body}");
        let message: Value = serde_json::from_str(&body).expect("a Connect error");
        assert!(
            message["message"]
                .as_str()
                .is_some_and(|m| m.contains("\"span-1\" is not a span id")),
            "{body}"
        );
        let (status, _, _, body) = span_profile(&store, encoding, &profile_type, selector, &[]);
        assert_eq!(status, 400, "{encoding:?}: {body}");
    }

    // SelectMergeStacktraces and SelectMergeProfile honour Grafana's span
    // and trace selectors; together, a sample must match both.
    let end = now_ms();
    let stacktraces = |span_selector: &[&str], trace_id_selector: &[&str]| {
        let body = q::SelectMergeStacktracesRequest {
            profile_type_id: profile_type.clone(),
            label_selector: selector.to_owned(),
            start: end - 600_000,
            end,
            span_selector: span_selector.iter().map(|s| (*s).to_owned()).collect(),
            trace_id_selector: trace_id_selector.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        };
        let response = querier_call(
            store.addr,
            "SelectMergeStacktraces",
            Connect::Proto,
            &body.encode_to_vec(),
        );
        assert_eq!(response.status, 200, "{}", response.text());
        q::SelectMergeStacktracesResponse::decode(response.body.as_slice())
            .expect("a SelectMergeStacktracesResponse")
            .flamegraph
            .map_or(0, |g| g.total)
    };
    assert_eq!(stacktraces(&[], &[]), 130_000_000);
    assert_eq!(stacktraces(&[SPAN_OTHER], &[]), 40_000_000);
    assert_eq!(stacktraces(&[], &[TRACE_SLOW]), 70_000_000);
    assert_eq!(
        stacktraces(&[SPAN_OTHER], &[TRACE_SLOW]),
        0,
        "both must match"
    );
    let response = querier_call(
        store.addr,
        "SelectMergeStacktraces",
        Connect::Json,
        json!({"profileTypeID": profile_type, "labelSelector": selector, "traceIdSelector": [TRACE_OTHER]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["flamegraph"]["total"], "40000000");
    let profile = q::SelectMergeProfileRequest {
        profile_type_id: profile_type.clone(),
        label_selector: selector.to_owned(),
        start: end - 600_000,
        end,
        trace_id_selector: vec![TRACE_SLOW.to_owned()],
        ..Default::default()
    };
    let response = querier_call(
        store.addr,
        "SelectMergeProfile",
        Connect::Proto,
        &profile.encode_to_vec(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let pprof = kiln_pprof::proto::Profile::decode(response.body.as_slice()).expect("a pprof");
    let total: i64 = pprof.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 70_000_000);
    // Grafana's experimental async queries are refused, not ignored.
    let response = querier_call(
        store.addr,
        "SelectMergeStacktraces",
        Connect::Json,
        json!({"profileTypeID": profile_type, "async": {}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(response.status, 400, "{}", response.text());
    assert!(
        response.text().contains("`async` is not supported"),
        "{}",
        response.text()
    );

    // Kiln's own API: the same selection with and without `span_id`.
    let query = enc(&format!("{profile_type}{selector}"));
    let whole = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-10m"),
    )
    .json();
    assert_eq!(whole["total"], 130_000_000, "{whole}");
    let span = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-10m&span_id={SPAN_OTHER}"),
    )
    .json();
    assert_eq!(span["total"], 40_000_000, "{span}");
    let top = get(
        store.addr,
        &format!("/api/v1/top?query={query}&from=now-10m&span_id={SPAN_SLOW},{SPAN_OTHER}"),
    )
    .json();
    assert_eq!(top["total"], 110_000_000, "{top}");
    let trace = get(
        store.addr,
        &format!("/api/v1/folded?query={query}&from=now-10m&trace_id={TRACE_SLOW}"),
    );
    assert_eq!(trace.text(), "main;slow 70000000\n");
    let bad = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-10m&span_id=abc"),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
}

/// The real SDKs: a Go program traces two root spans with the
/// OpenTelemetry SDK, `grafana/otel-profiling-go` labels their CPU samples
/// and `grafana/pyroscope-go` uploads them to the store. The slow span's
/// profile, asked for by its span id, holds its hot function and not the
/// other span's; and the other way round.
#[test]
fn a_slow_spans_profile_from_the_real_go_sdks_holds_its_hot_function() {
    use kiln_testkit::real_inputs::span_profiles::{
        OTHER_FUNCTION, SLOW_FUNCTION, run_span_profiles_app,
    };
    let store = StoreProcess::start(KILN_STORE, &[]);
    let work = tempfile::tempdir().expect("temporary directory");
    let app = "kiln.spans.go";
    let Some(spans) = run_span_profiles_app(work.path(), &store.url(), app, 4.0) else {
        return;
    };
    let cpu_type = stored_profile_type(store.addr, "process_cpu:cpu:nanoseconds");
    let selector = format!("{{service_name=\"{app}\"}}");
    for encoding in [Connect::Json, Connect::Proto] {
        for (span, hot, cold) in [
            (&spans.slow, SLOW_FUNCTION, OTHER_FUNCTION),
            (&spans.other, OTHER_FUNCTION, SLOW_FUNCTION),
        ] {
            let (status, total, names, body) =
                span_profile(&store, encoding, &cpu_type, &selector, &[span.as_str()]);
            assert_eq!(status, 200, "{encoding:?}: {body}");
            assert!(total > 0, "{encoding:?}: span {span} has no samples");
            assert!(
                names.iter().any(|n| n == hot),
                "{encoding:?}: {hot} not in {names:?}"
            );
            assert!(
                !names.iter().any(|n| n == cold),
                "{encoding:?}: {cold} in {names:?}"
            );
        }
    }
    // The span labels made no series.
    let series = get(store.addr, "/api/v1/labels?from=now-10m").json();
    assert!(
        !series.to_string().contains("span_id"),
        "span_id became a series label: {series}"
    );
}
