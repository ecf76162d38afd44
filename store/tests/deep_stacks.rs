//! A stack over a thousand frames deep (real ones come from deep recursion,
//! and a peer agent's OTLP export once carried 1,042 `[unknown]` frames)
//! is stored whole and comes back whole in the flame graph's nested JSON,
//! which a JSON reader with a depth limit of 128 would refuse.
//!
//! A stack deeper than the decode limit once its locations' inlined lines
//! are unwound is refused at upload, while one just within it is stored
//! and every tree of its range (flame graph, diff, folded stacks,
//! `querier.v1` and Pyroscope's render) answers with the store still up.
//! A stack stored before that limit existed, 16.7 million frames deep,
//! cannot be uploaded any more; `kiln-engine`'s `deep_stacks` test puts
//! one straight into a head and builds each of these trees from it.

use std::io::Write;
use std::time::Instant;

use kiln_pprof::{FunctionSpec, ProfileBuilder};
use kiln_testkit::clock::{now_ms, now_nanos, now_s};
use kiln_testkit::http::{HttpResponse, enc, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

const FRAMES: usize = 1_500;

#[test]
fn a_stack_of_1500_frames_comes_back_whole_in_the_flame_graph() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let stack: Vec<String> = (0..FRAMES).map(|i| format!("frame_{i}")).collect();
    let body = format!("{} 7\nshallow;leaf 3\n", stack.join(";"));
    let now = now_s();
    let target = format!(
        "/ingest?name=deep.cpu&format=folded&from={}&until={now}",
        now - 10
    );
    let response = http(store.addr, "POST", &target, &[], body.as_bytes()).expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());

    let query = format!(
        "/api/v1/flamegraph?query={}&from=now-1h",
        enc("process_cpu{service_name=\"deep\"}")
    );
    let response = get(store.addr, &query);
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    // Folded counts are samples; the flame graph's values are CPU time,
    // one sample period each.
    let total = json["total"].as_i64().expect("total");
    assert!(total > 0 && total % 10 == 0, "total {total}");
    let deep = Some(total / 10 * 7);
    let names: Vec<&str> = json["flamegraph"]["names"]
        .as_array()
        .expect("names")
        .iter()
        .map(|n| n.as_str().expect("a name is a string"))
        .collect();
    // Walk the deep branch without recursion: each level has the next
    // frame as a child, with the deep stack's whole value.
    let mut node = &json["flamegraph"]["root"];
    let mut depth = 0;
    loop {
        let next = node["children"]
            .as_array()
            .expect("children")
            .iter()
            .find(|child| {
                names[child["name"].as_u64().expect("name index") as usize]
                    == format!("frame_{depth}")
            });
        let Some(child) = next else { break };
        assert_eq!(child["total"].as_i64(), deep, "frame_{depth}");
        node = child;
        depth += 1;
    }
    assert_eq!(depth, FRAMES, "the deep branch ends early");
    assert_eq!(node["self"].as_i64(), deep, "the leaf holds the value");
}

/// The pprof decode limit on frames in one stack, inlined lines unwound.
const MAX_STACK_DEPTH: usize = 4096;

/// A plain pprof of one function `name`, one location holding `lines`
/// lines of it, and one sample whose stack is that location `repeats` times.
fn inlined_tower(name: &str, lines: usize, repeats: usize) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now_nanos(), 10_000_000_000);
    let function = builder.function(&FunctionSpec {
        name: name.into(),
        ..Default::default()
    });
    let lines: Vec<(u64, i64)> = (1..=lines as i64).map(|line| (function, line)).collect();
    let location = builder.location(0, 0x1000, &lines);
    builder.sample(&vec![location; repeats], &[10_000_000], &[]);
    builder.finish().encode_to_vec()
}

fn upload(store: &StoreProcess, service: &str, pprof: &[u8]) -> HttpResponse {
    http(
        store.addr,
        "POST",
        &format!("/ingest?name={service}&format=pprof"),
        &[],
        pprof,
    )
    .expect("upload")
}

/// Times a request and prints how long it took.
fn timed(what: &str, request: impl FnOnce() -> HttpResponse) -> HttpResponse {
    let started = Instant::now();
    let response = request();
    let _ = writeln!(
        std::io::stderr(),
        "{what}: {} with {} bytes in {:?}",
        response.status,
        response.body.len(),
        started.elapsed()
    );
    response
}

#[test]
fn a_stack_of_sixteen_million_unwound_frames_is_refused_at_upload() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let tower = inlined_tower("deep", MAX_STACK_DEPTH, MAX_STACK_DEPTH);
    eprintln!("the upload is {} bytes", tower.len());
    let response = timed("deep upload", || upload(&store, "deep", &tower));
    assert!(
        (400..500).contains(&response.status),
        "{}: {}",
        response.status,
        response.text()
    );
    assert!(
        response.text().contains("inlined lines unwound"),
        "the error names the limit: {}",
        response.text()
    );
    // Nothing of it was stored, and the store still answers.
    let response = get(
        store.addr,
        &format!(
            "/api/v1/flamegraph?query={}&from=now-1h&max_nodes=1048576",
            enc("process_cpu{service_name=\"deep\"}")
        ),
    );
    assert!(
        response.status == 200
            || response.status == 404
            || response.text().contains("selector_unknown_profile_type"),
        "{}: {}",
        response.status,
        response.text()
    );
    assert_eq!(get(store.addr, "/healthz").status, 200);
}

#[test]
fn every_tree_of_a_stack_just_within_the_depth_limit_answers() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    // 64 locations of 64 inlined lines: exactly the limit once unwound.
    let within = inlined_tower("edge", 64, MAX_STACK_DEPTH / 64);
    let response = upload(&store, "edge", &within);
    assert_eq!(response.status, 200, "{}", response.text());
    let over = inlined_tower("edge", 64, MAX_STACK_DEPTH / 64 + 1);
    let response = upload(&store, "edge", &over);
    assert!(
        (400..500).contains(&response.status),
        "one location more: {}",
        response.status
    );

    let selector = enc("process_cpu{service_name=\"edge\"}");
    let response = timed("flame graph", || {
        get(
            store.addr,
            &format!("/api/v1/flamegraph?query={selector}&from=now-1h&max_nodes=1048576"),
        )
    });
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    let total = json["total"].as_i64().expect("total");
    assert_eq!(total, 10_000_000);
    assert_eq!(json["flamegraph"]["root"]["total"].as_i64(), Some(total));
    // Root, then one node per unwound frame.
    assert_eq!(
        json["flamegraph"]["node_count"].as_u64(),
        Some(MAX_STACK_DEPTH as u64 + 1)
    );

    let response = timed("diff", || {
        get(
            store.addr,
            &format!(
                "/api/v1/diff?left_query={selector}&left_from=now-1h&left_to=now&max_nodes=1048576"
            ),
        )
    });
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    assert_eq!(json["diff"]["root"]["base_total"].as_i64(), Some(total));

    let response = timed("folded", || {
        get(
            store.addr,
            &format!("/api/v1/folded?query={selector}&from=now-1h"),
        )
    });
    assert_eq!(response.status, 200, "{}", response.text());
    let text = response.text();
    let (frames, value) = text.trim_end().rsplit_once(' ').expect("one line");
    assert_eq!(frames.split(';').count(), MAX_STACK_DEPTH);
    assert_eq!(value, total.to_string(), "the stack's whole value");

    let response = timed("top", || {
        get(
            store.addr,
            &format!("/api/v1/top?query={selector}&from=now-1h"),
        )
    });
    assert_eq!(response.status, 200, "{}", response.text());

    let (start, end) = (now_ms() - 3_600_000, now_ms());
    let body = format!(
        r#"{{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta","labelSelector":"{{service_name=\"edge\"}}","start":"{start}","end":"{end}","maxNodes":"1048576","format":"PROFILE_FORMAT_FLAMEGRAPH"}}"#
    );
    let response = timed("querier.v1 SelectMergeStacktraces", || {
        http(
            store.addr,
            "POST",
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            &[
                ("Content-Type", "application/json"),
                ("Connect-Protocol-Version", "1"),
            ],
            body.as_bytes(),
        )
        .expect("querier call")
    });
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    let levels = json["flamegraph"]["levels"].as_array().expect("levels");
    assert_eq!(levels.len(), MAX_STACK_DEPTH + 1, "one row per depth");

    let response = timed("pyroscope render", || {
        get(
            store.addr,
            &format!(
                "/pyroscope/render?query={}&from=now-1h&maxNodes=1048576",
                enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{service_name=\"edge\"}")
            ),
        )
    });
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    assert_eq!(
        json["flamebearer"]["levels"].as_array().map(Vec::len),
        Some(MAX_STACK_DEPTH + 1)
    );
    assert_eq!(get(store.addr, "/healthz").status, 200, "the store is up");
}
