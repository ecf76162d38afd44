//! `group_by` through the real server: a label the store promotes to a
//! series label (`thread`) and one it keeps on samples (`span_id`) both
//! group, nested in the order given, on the flame graph, top and folded
//! queries; a bad `group_by` names the mistake.

use kiln_pprof::{FunctionSpec, LabelValue, ProfileBuilder};
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{HttpResponse, enc, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;
use serde_json::Value;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

const MS: i64 = 1_000_000;

/// Pushes one CPU profile: `main;work` 30 ms (thread worker, span a1),
/// `main;idle` 10 ms (thread io, span b2), `main;work` 5 ms (thread worker,
/// no span).
fn push_profile(store: &StoreProcess) {
    let now = now_nanos();
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10 * MS)
        .time(now, 10_000 * MS);
    let mut location = |name: &str, address: u64| {
        let function = builder.function(&FunctionSpec {
            name: name.into(),
            ..Default::default()
        });
        builder.location(0, address, &[(function, 1)])
    };
    let (main, work, idle) = (
        location("main.main", 0x1000),
        location("main.work", 0x2000),
        location("main.idle", 0x3000),
    );
    let text = |s: &str| LabelValue::Str(s.to_owned());
    builder.sample(
        &[work, main],
        &[30 * MS],
        &[("thread", text("worker")), ("span_id", text("a1"))],
    );
    builder.sample(
        &[idle, main],
        &[10 * MS],
        &[("thread", text("io")), ("span_id", text("b2"))],
    );
    builder.sample(&[work, main], &[5 * MS], &[("thread", text("worker"))]);
    let request = kiln_api::push::v1::PushRequest {
        series: vec![kiln_api::push::v1::RawProfileSeries {
            labels: vec![
                kiln_api::types::v1::LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                },
                kiln_api::types::v1::LabelPair {
                    name: "service_name".into(),
                    value: "grouped".into(),
                },
            ],
            samples: vec![kiln_api::push::v1::RawSample {
                raw_profile: builder.finish().encode_to_vec(),
                id: String::new(),
            }],
        }],
    };
    let response = http(
        store.addr,
        "POST",
        "/push.v1.PusherService/Push",
        &[("Content-Type", "application/proto")],
        &request.encode_to_vec(),
    )
    .expect("push");
    assert_eq!(response.status, 200, "{}", response.text());
}

fn query(store: &StoreProcess, endpoint: &str, group_by: &str) -> HttpResponse {
    get(
        store.addr,
        &format!(
            "/api/v1/{endpoint}?query={}&from=now-1h&to=now&group_by={}",
            enc(r#"process_cpu:cpu{service_name="grouped"}"#),
            enc(group_by)
        ),
    )
}

/// `(name, total)` of a flame graph node's children.
fn children(graph: &Value, node: &Value) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = node["children"]
        .as_array()
        .expect("children")
        .iter()
        .map(|c| {
            let name = graph["names"][c["name"].as_u64().expect("name index") as usize]
                .as_str()
                .expect("name")
                .to_owned();
            (name, c["total"].as_i64().expect("total"))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn series_and_sample_labels_group_flame_graphs_top_and_folded() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    push_profile(&store);

    let answer = query(&store, "flamegraph", "span_id");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["group_by"], serde_json::json!(["span_id"]));
    let graph = &body["flamegraph"];
    assert_eq!(
        children(graph, &graph["root"]),
        [
            ("span_id=(none)".to_owned(), 5 * MS),
            ("span_id=a1".to_owned(), 30 * MS),
            ("span_id=b2".to_owned(), 10 * MS),
        ],
        "a per-sample label groups each stack"
    );

    let body = query(&store, "flamegraph", "thread,span_id").json();
    let graph = &body["flamegraph"];
    let threads = graph["root"]["children"].as_array().expect("roots");
    assert_eq!(
        children(graph, &graph["root"]),
        [
            ("thread=io".to_owned(), 10 * MS),
            ("thread=worker".to_owned(), 35 * MS)
        ],
        "a promoted (series) label groups first"
    );
    let worker = threads
        .iter()
        .find(|t| t["total"].as_i64() == Some(35 * MS))
        .expect("worker");
    assert_eq!(
        children(graph, worker),
        [
            ("span_id=(none)".to_owned(), 5 * MS),
            ("span_id=a1".to_owned(), 30 * MS)
        ],
        "then the sample label, inside each thread"
    );

    let top = query(&store, "top", "thread").json();
    let row = top["top"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["name"] == "thread=worker")
        .expect("a row per group");
    assert_eq!(row["flat"], 0);
    assert_eq!(row["cumulative"], 35 * MS);

    let folded = query(&store, "folded", "thread");
    assert_eq!(folded.status, 200, "{}", folded.text());
    assert_eq!(
        folded.header("kiln-profile-type"),
        Some("process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta")
    );
    assert_eq!(
        folded.text(),
        format!(
            "thread=io;main.main;main.idle {}\nthread=worker;main.main;main.work {}\n",
            10 * MS,
            35 * MS
        )
    );

    let bad = query(&store, "flamegraph", "thread,{pod}");
    assert_eq!(bad.status, 400);
    assert!(
        bad.text()
            .contains(r#"invalid `group_by`: \"{pod}\" is not a label name"#),
        "{}",
        bad.text()
    );
}
