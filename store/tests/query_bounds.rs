//! The query API's bounds against a real `kiln-store`: what any pod that
//! can reach the store may send to `querier.v1` (reads are open by
//! default) is refused with a 4xx before it can take the store's memory
//! or run without end, and the store keeps answering well-formed queries.
//!
//! The sizes are those of the attacks these bounds answer: a 35 KB gzip
//! body that inflates to a 32 MB JSON list of zeros (about 540 MB as a
//! JSON value tree), its protobuf twin (two bytes per empty string, ten
//! times that when decoded), a `groupBy` of one label a million times,
//! 100,000 matcher sets, and times at the ends of i64.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kiln_api::querier::v1 as q;
use kiln_api::types::v1 as t;
use kiln_testkit::clock::now_ms;
use kiln_testkit::http::{enc, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;
use serde_json::{Value, json};

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// The largest Connect body the store reads.
const MAX_BODY: usize = 1 << 20;

/// A store with one service in two envs (45 samples at 100 Hz), started
/// with `extra` flags.
fn seeded_store(extra: &[&str]) -> StoreProcess {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let store = StoreProcess::start_with_env(KILN_STORE, data_dir, extra, &[]);
    for (env, body) in [
        ("prod", "main;work 30\nmain;idle 10"),
        ("dev", "main;work 5"),
    ] {
        let name = enc(&format!("checkout.cpu{{env={env}}}"));
        let target =
            format!("/ingest?name={name}&from=now-30s&until=now-20s&sampleRate=100&format=folded");
        let response = http(store.addr, "POST", &target, &[], body.as_bytes()).expect("ingest");
        assert_eq!(response.status, 200, "{}", response.text());
    }
    store
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data).expect("gzip");
    encoder.finish().expect("gzip")
}

/// A querier call; `content_type` picks JSON or protobuf.
fn call(
    store: &StoreProcess,
    method: &str,
    content_type: &str,
    gzipped: bool,
    body: &[u8],
) -> (u16, String) {
    let mut headers = vec![
        ("Content-Type", content_type),
        ("Connect-Protocol-Version", "1"),
    ];
    if gzipped {
        headers.push(("Content-Encoding", "gzip"));
    }
    let started = Instant::now();
    let response = http(
        store.addr,
        "POST",
        &format!("/querier.v1.QuerierService/{method}"),
        &headers,
        body,
    )
    .expect("POST a querier call");
    eprintln!(
        "{method} ({content_type}, {} body bytes{}): {} in {:?}",
        body.len(),
        if gzipped { ", gzip" } else { "" },
        response.status,
        started.elapsed()
    );
    (response.status, response.text())
}

fn json_call(store: &StoreProcess, method: &str, body: &Value) -> (u16, String) {
    call(
        store,
        method,
        "application/json",
        false,
        body.to_string().as_bytes(),
    )
}

/// A normal query answers, with the store's label names.
#[track_caller]
fn assert_serving(store: &mut StoreProcess) {
    assert!(
        store.exited().is_none(),
        "the store exited: {}",
        store.log()
    );
    let (status, body) = json_call(
        store,
        "LabelNames",
        &json!({"matchers": ["{service_name=\"checkout\"}"]}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"env\""), "{body}");
}

/// `{"<field>":[<item>,<item>,...]}` with `count` items.
fn json_list(field: &str, item: &str, count: usize) -> Vec<u8> {
    let mut body = format!("{{\"{field}\":[").into_bytes();
    for i in 0..count {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(item.as_bytes());
    }
    body.extend_from_slice(b"]}");
    body
}

#[test]
fn gzip_list_bombs_are_refused_before_they_inflate_and_the_store_serves_on() {
    let mut store = seeded_store(&[]);
    // 16 million `0,` in a field no message has, gzipped: about 35 KB.
    let json_bomb = gzip(&json_list("x", "0", 16_000_000));
    // The protobuf twin: 16.7 million empty `matchers` (`0a 00`).
    let proto_bomb = gzip(&b"\x0a\x00".repeat(16_700_000));
    eprintln!(
        "bombs: JSON {} bytes, protobuf {} bytes",
        json_bomb.len(),
        proto_bomb.len()
    );
    // Four at once, as one attacker would send them.
    std::thread::scope(|scope| {
        let store = &store;
        let sends: Vec<_> = (0..4)
            .map(|i| {
                let (content_type, bomb) = if i % 2 == 0 {
                    ("application/json", &json_bomb)
                } else {
                    ("application/proto", &proto_bomb)
                };
                scope.spawn(move || call(store, "LabelNames", content_type, true, bomb))
            })
            .collect();
        for send in sends {
            let (status, body) = send.join().expect("sender");
            assert_eq!(status, 413, "{body}");
            assert!(body.contains("resource_exhausted"), "{body}");
        }
    });
    assert_serving(&mut store);

    // Just over the cap as sent, no gzip: 413; just under: read (and
    // refused for what it says, not for its size).
    let over = json_list("x", "0", MAX_BODY / 2);
    assert!(over.len() > MAX_BODY);
    let (status, body) = call(&store, "LabelNames", "application/json", false, &over);
    assert_eq!(status, 413, "{body}");
    let under = json_list("x", "0", MAX_BODY / 2 - 8);
    assert!(under.len() <= MAX_BODY);
    let (status, body) = call(&store, "LabelNames", "application/json", false, &under);
    assert_eq!(status, 200, "unknown fields are skipped: {body}");
    assert_serving(&mut store);
}

#[test]
fn long_lists_are_refused_and_repeated_group_labels_count_once() {
    let mut store = seeded_store(&[]);
    let type_id = {
        let types = get(store.addr, "/api/v1/profile-types").json();
        types["profile_types"][0]["id"]
            .as_str()
            .expect("a stored type")
            .to_owned()
    };

    // SelectSeries grouping by one label a million times: 6 MB of JSON,
    // sent gzipped, is over the body cap once inflated.
    let mut select = format!(
        "{{\"profileTypeID\":\"{type_id}\",\"labelSelector\":\"{{service_name=\\\"checkout\\\"}}\",\"groupBy\":["
    )
    .into_bytes();
    select.extend(b"\"pod\",".repeat(1_000_000));
    select.extend(b"\"pod\"]}");
    let (status, body) = call(
        &store,
        "SelectSeries",
        "application/json",
        true,
        &gzip(&select),
    );
    assert_eq!(status, 413, "{body}");
    let request = q::SelectSeriesRequest {
        profile_type_id: type_id.clone(),
        group_by: vec!["pod".to_owned(); 1_000_000],
        ..Default::default()
    };
    let (status, body) = call(
        &store,
        "SelectSeries",
        "application/proto",
        true,
        &gzip(&request.encode_to_vec()),
    );
    assert_eq!(status, 413, "{body}");
    // Within the body cap, past the list cap: refused while read.
    let request = q::SelectSeriesRequest {
        profile_type_id: type_id.clone(),
        group_by: vec!["pod".to_owned(); 10_000],
        ..Default::default()
    };
    let (status, body) = call(
        &store,
        "SelectSeries",
        "application/proto",
        false,
        &request.encode_to_vec(),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`groupBy` holds more than"), "{body}");
    let nine: Vec<String> = (0..9).map(|i| format!("label{i}")).collect();
    let (status, body) = json_call(
        &store,
        "SelectSeries",
        &json!({"profileTypeID": type_id, "groupBy": nine}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("at most 8"), "{body}");
    // A label named again and again is grouped by once.
    let end = now_ms();
    let (status, body) = json_call(
        &store,
        "SelectSeries",
        &json!({
            "profileTypeID": type_id, "labelSelector": "{service_name=\"checkout\"}",
            "start": end - 3_600_000, "end": end, "step": 60,
            "groupBy": vec!["env"; 50],
        }),
    );
    assert_eq!(status, 200, "{body}");
    let series: Value = serde_json::from_str(&body).expect("JSON");
    let groups = series["series"].as_array().expect("series");
    assert_eq!(groups.len(), 2, "{series}");
    for group in groups {
        assert_eq!(group["labels"].as_array().map(Vec::len), Some(1), "{group}");
    }

    // LabelNames with 100,000 matcher sets, each of which would be a
    // query of its own: about 500 KB, under the body cap.
    let matchers = json_list("matchers", "\"{}\"", 100_000);
    assert!(matchers.len() < MAX_BODY);
    let (status, body) = call(&store, "LabelNames", "application/json", false, &matchers);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`matchers` holds more than"), "{body}");
    let request = t::LabelNamesRequest {
        matchers: vec!["{}".to_owned(); 100_000],
        ..Default::default()
    };
    let (status, body) = call(
        &store,
        "LabelNames",
        "application/proto",
        false,
        &request.encode_to_vec(),
    );
    assert_eq!(status, 400, "{body}");
    for method in ["LabelValues", "Series"] {
        let mut request = json!({"name": "env", "matchers": vec!["{}"; 100_000]});
        if method == "Series" {
            request["labelNames"] = json!(vec!["env"; 1_000]);
        }
        let (status, body) = json_call(&store, method, &request);
        assert_eq!(status, 400, "{method}: {body}");
    }
    assert_serving(&mut store);
}

#[test]
fn times_at_the_ends_of_i64_are_400s() {
    let mut store = seeded_store(&[]);
    let type_id = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    for (method, request) in [
        ("ProfileTypes", json!({"end": i64::MAX.to_string()})),
        ("ProfileTypes", json!({"end": (i64::MAX - 1).to_string()})),
        ("LabelNames", json!({"start": i64::MIN.to_string()})),
        ("LabelNames", json!({"end": i64::MIN.to_string()})),
        ("LabelValues", json!({"name": "env", "end": 1e300})),
        ("Series", json!({"start": 1, "end": u64::MAX})),
        (
            "SelectMergeStacktraces",
            json!({"profileTypeID": type_id, "end": i64::MAX.to_string()}),
        ),
        (
            "SelectSeries",
            json!({"profileTypeID": type_id, "start": (i64::MIN + 1).to_string(), "end": i64::MAX.to_string()}),
        ),
        (
            "Diff",
            json!({"left": {"profileTypeID": type_id}, "right": {"profileTypeID": type_id, "end": i64::MIN.to_string()}}),
        ),
    ] {
        let (status, body) = json_call(&store, method, &request);
        assert_eq!(status, 400, "{method} {request}: {body}");
        assert!(body.contains("out of range"), "{method}: {body}");
    }
    let request = q::ProfileTypesRequest {
        start: 0,
        end: i64::MAX,
    };
    let (status, body) = call(
        &store,
        "ProfileTypes",
        "application/proto",
        false,
        &request.encode_to_vec(),
    );
    assert_eq!(status, 400, "{body}");
    for target in [
        "/api/v1/labels?to=9223372036854775807999",
        "/api/v1/labels?from=now-9223372036854775807ms",
        "/pyroscope/label-values?label=env&until=now%2B9223372036854775807ms",
    ] {
        let response = get(store.addr, target);
        assert_eq!(response.status, 400, "{target}: {}", response.text());
    }
    assert_serving(&mut store);
}

#[test]
fn a_stalled_body_holds_no_query_slot_and_is_cut_off() {
    // One query slot: a stalled body that held it would turn every other
    // query away.
    let mut store = seeded_store(&["--max-inflight-queries", "1"]);
    let mut stalled = TcpStream::connect(store.addr).expect("connect");
    stalled
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let head = format!(
        "POST /querier.v1.QuerierService/LabelNames HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{{\"matchers\":",
        store.addr
    );
    stalled.write_all(head.as_bytes()).expect("send a part");
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert_serving(&mut store);
    let mut reply = Vec::new();
    // The store answers and closes; a reset after the answer is fine.
    let _ = stalled.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    eprintln!(
        "stalled body answered after {:?}: {}",
        started.elapsed(),
        reply.lines().next().unwrap_or("")
    );
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert_serving(&mut store);
}

#[test]
fn bodies_are_held_in_the_query_memory_budget() {
    // 1 MiB of query memory: a body that inflates to 600 KB, held twice
    // (as inflated and as parsed), can never fit. Sent gzipped, so the
    // store has read all of it when it answers.
    let mut store = seeded_store(&["--query-memory-bytes", "1048576"]);
    let body = gzip(&json_list("x", "0", 300_000));
    let (status, text) = call(&store, "LabelNames", "application/json", true, &body);
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("query memory budget"), "{text}");
    assert_serving(&mut store);
}

#[test]
fn what_a_merge_builds_is_bounded_by_the_query_memory() {
    // 2 MiB of query memory, shared by the running queries: a merge of
    // 30,000 distinct stacks (60,000 distinct function names) holds more
    // than that in its symbols alone, so it is refused as too large
    // instead of growing with its range; a narrow selection still answers.
    let mut store = seeded_store(&["--query-memory-bytes", "2097152"]);
    for upload in 0..10 {
        let body: String = (0..3_000)
            .map(|i| format!("main;handler_{upload}_{i};leaf_{upload}_{i} 1\n"))
            .collect();
        let name = enc("wide.cpu{env=wide}");
        let target =
            format!("/ingest?name={name}&from=now-30s&until=now-20s&sampleRate=100&format=folded");
        let response = http(store.addr, "POST", &target, &[], body.as_bytes()).expect("ingest");
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let started = Instant::now();
    let wide = get(
        store.addr,
        &format!(
            "/api/v1/flamegraph?query={}&from=now-1h",
            enc(r#"process_cpu{service_name="wide"}"#)
        ),
    );
    println!(
        "wide merge answered {} in {:?}",
        wide.status,
        started.elapsed()
    );
    assert_eq!(wide.status, 413, "{}", wide.text());
    assert!(wide.text().contains("query_too_large"), "{}", wide.text());
    let narrow = get(
        store.addr,
        &format!(
            "/api/v1/flamegraph?query={}&from=now-1h",
            enc(r#"process_cpu{service_name="checkout", env="prod"}"#)
        ),
    );
    assert_eq!(narrow.status, 200, "{}", narrow.text());
    assert_eq!(narrow.json()["total"], 400_000_000, "{}", narrow.text());
    assert_serving(&mut store);
}
