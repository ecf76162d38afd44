//! One stack of 16.7M frames from a 30 KB upload: a location of 4096
//! inlined lines, repeated 4096 times in one sample. Each count is within
//! its own limit; their product is what a flame graph would expand. The
//! upload must be refused, and a profile like it that is already stored
//! (written before the limit existed) must not make any query of its range
//! fail: a query of death would crash the store again after each restart.

use kiln_engine::model::{Label, LabelSet};
use kiln_pprof::{FunctionSpec, ProfileBuilder};
use kiln_storage::wal::{Wal, WalRecord};
use kiln_testkit::clock::{now_ms, now_nanos};
use kiln_testkit::http::enc;
use prost::Message;

use super::{Attack, Expect, Hostile, last_hour_ms};

/// Inlined lines in the one location, and times it repeats in the stack.
const LINES: usize = 4096;
const DEPTH: usize = 4096;
/// The largest node budget a flame graph request may ask for.
const MAX_NODES: usize = 1 << 20;
const SELECTOR: &str = "process_cpu{service_name=\"deep\"}";
const PROFILE_TYPE: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta";

/// The plain pprof: one function, one location holding `LINES` lines of
/// it, one sample whose stack is that location `DEPTH` times.
fn deep_pprof() -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now_nanos(), 10_000_000_000);
    let function = builder.function(&FunctionSpec {
        name: "deep".into(),
        ..Default::default()
    });
    let lines: Vec<(u64, i64)> = (1..=LINES as i64).map(|line| (function, line)).collect();
    let location = builder.location(0, 0x1000, &lines);
    builder.sample(&[location; DEPTH], &[10_000_000], &[]);
    builder.finish().encode_to_vec()
}

/// A `querier.v1` tree of the last hour with the largest node budget.
///
/// The store refuses the deep stack at upload and sets it aside at replay,
/// so its range may hold nothing: a 4xx naming an unknown profile type is
/// then the right answer. What these attacks assert is that the store is
/// never killed and that the good client is served throughout.
fn querier_tree(addr: std::net::SocketAddr) -> Hostile {
    let (start, end) = last_hour_ms();
    let body = format!(
        r#"{{"profileTypeID":"{PROFILE_TYPE}","labelSelector":"{{service_name=\"deep\"}}","start":{start},"end":{end},"maxNodes":{MAX_NODES}}}"#
    );
    Hostile::http(
        "querier.v1 SelectMergeStacktraces of its range, maxNodes 1048576",
        Expect::ServedOrRefused,
        addr,
        "POST",
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

fn flame_graph(addr: std::net::SocketAddr, max_nodes: Option<usize>) -> Hostile {
    let limit = max_nodes.map_or(String::new(), |n| format!("&max_nodes={n}"));
    Hostile::http(
        format!(
            "/api/v1/flamegraph of its range, max_nodes {}",
            max_nodes.map_or("default".to_owned(), |n| n.to_string())
        ),
        Expect::ServedOrRefused,
        addr,
        "GET",
        &format!(
            "/api/v1/flamegraph?query={}&from=now-1h{limit}",
            enc(SELECTOR)
        ),
        &[],
        b"",
    )
}

#[test]
fn deep_stack_upload_then_its_flame_graph_and_querier_tree() {
    let Some(attack) = Attack::start("deep_stack_upload_then_trees") else {
        return;
    };
    let pprof = deep_pprof();
    eprintln!("deep stack pprof: {} bytes", pprof.len());
    attack.run(|addr| {
        vec![
            Hostile::http(
                format!("/ingest of one stack of {LINES}x{DEPTH} frames"),
                Expect::Refused,
                addr,
                "POST",
                "/ingest?name=deep&format=pprof",
                &[],
                &pprof,
            ),
            flame_graph(addr, Some(MAX_NODES)),
            querier_tree(addr),
        ]
    });
}

/// Logs the deep profile in the WAL with the real writer, as a store that
/// accepted it before the limit existed would have, before the store starts.
fn log_deep_profile(data_dir: &std::path::Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (wal, _) = Wal::open(&data_dir.join("wal"), 64 << 20, |_| {}).expect("open WAL");
        wal.append(&WalRecord {
            labels: LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("service_name", "deep"),
            ]),
            time_ms: now_ms() - 60_000,
            duration_nanos: 10_000_000_000,
            pprof: deep_pprof(),
            idempotency_key: None,
        })
        .await
        .expect("append");
    });
}

#[test]
fn deep_stack_already_stored_fails_no_query_of_its_range() {
    let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    log_deep_profile(data_dir.path());
    let Some(attack) = Attack::start_in("deep_stack_already_stored_then_queries", data_dir) else {
        return;
    };
    let selector = enc(SELECTOR);
    attack.run(|addr| {
        let get = |what: &str, expect, target: String| {
            Hostile::http(what, expect, addr, "GET", &target, &[], b"")
        };
        vec![
            flame_graph(addr, Some(MAX_NODES)),
            flame_graph(addr, None),
            get(
                "/api/v1/diff of its range against itself, max_nodes 1048576",
                Expect::ServedOrRefused,
                format!(
                    "/api/v1/diff?left_query={selector}&left_from=now-1h&right_query={selector}&max_nodes={MAX_NODES}"
                ),
            ),
            get(
                "/api/v1/top of its range",
                Expect::ServedOrRefused,
                format!("/api/v1/top?query={selector}&from=now-1h"),
            ),
            get(
                "/api/v1/folded of its range",
                Expect::ServedOrRefused,
                format!("/api/v1/folded?query={selector}&from=now-1h"),
            ),
            get(
                "/pyroscope/render of its range",
                Expect::ServedOrRefused,
                format!(
                    "/pyroscope/render?query={}&from=now-1h&until=now&max-nodes={MAX_NODES}",
                    enc(&format!("{PROFILE_TYPE}{{service_name=\"deep\"}}"))
                ),
            ),
            querier_tree(addr),
        ]
    });
}
