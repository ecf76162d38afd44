//! Every query path names the frames the same way, after the merge, and
//! says `symbols_pending` the same way: Kiln's `/api/v1` (flame graph, top,
//! folded, pprof, diff), the Pyroscope querier.v1 methods Grafana calls,
//! `/pyroscope/render` and the gRPC query API. The symbolizer's metrics
//! on `/metrics` count what the queries did.

use std::time::{Duration, Instant};

use kiln_api::kiln::query::v1::SelectMergePprofRequest;
use kiln_api::kiln::query::v1::query_service_client::QueryServiceClient;
use kiln_testkit::clock::now_ms;
use kiln_testkit::debuginfod::Debuginfod;
use kiln_testkit::http::{Connect, HttpResponse, enc, get, querier_call, stored_profile_type};
use kiln_testkit::store_process::StoreProcess;
use serde_json::{Value, json};

use crate::fixture::{SERIES, Setup, build_program, get_ok, ingest, partial};
use crate::fixture::{store_with, unsymbolized_pprof};

/// A query path of the store.
#[derive(Debug, Clone, Copy)]
enum Path {
    Flamegraph,
    Top,
    Folded,
    Pprof,
    Diff,
    QuerierStacktraces,
    QuerierProfile,
    QuerierDiff,
    Render,
    GrpcPprof,
}

const PATHS: [Path; 10] = [
    Path::Flamegraph,
    Path::Top,
    Path::Folded,
    Path::Pprof,
    Path::Diff,
    Path::QuerierStacktraces,
    Path::QuerierProfile,
    Path::QuerierDiff,
    Path::Render,
    Path::GrpcPprof,
];

/// The strings of a JSON array.
fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// The function names of a pprof.
fn pprof_names(bytes: &[u8]) -> Vec<String> {
    let profile = kiln_pprof::decode(bytes, &kiln_pprof::DecodeLimits::default())
        .expect("the store's pprof decodes");
    profile
        .functions()
        .iter()
        .map(|f| profile.string(f.name).to_owned())
        .collect()
}

/// The frame names `path` answers for the test's series in the last
/// hour, and its partial mark (header, or gRPC metadata).
fn ask(store: &StoreProcess, path: Path) -> (Vec<String>, Option<String>) {
    let type_id = stored_profile_type(store.addr, "process_cpu");
    let api = |endpoint: &str, query: &str| -> (HttpResponse, Option<String>) {
        let response = get_ok(store, &format!("/api/v1/{endpoint}?{query}"));
        let partial = partial(&response);
        (response, partial)
    };
    let (end, start) = (now_ms(), now_ms() - 3_600_000);
    let select = json!({
        "profileTypeID": type_id, "labelSelector": "{pod=\"hot\"}",
        "start": start.to_string(), "end": end.to_string(),
    });
    let querier = |method: &str, body: &Value| -> (Value, Option<String>) {
        let response = querier_call(
            store.addr,
            method,
            Connect::Json,
            body.to_string().as_bytes(),
        );
        assert_eq!(response.status, 200, "{method}: {}", response.text());
        (response.json(), partial(&response))
    };
    match path {
        Path::Flamegraph => {
            let (r, p) = api("flamegraph", &format!("query={SERIES}&from=now-1h"));
            (strings(&r.json()["flamegraph"]["names"]), p)
        }
        Path::Top => {
            let (r, p) = api("top", &format!("query={SERIES}&from=now-1h"));
            let names = r.json()["top"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|row| row["name"].as_str().map(str::to_owned))
                .collect();
            (names, p)
        }
        Path::Folded => {
            let (r, p) = api("folded", &format!("query={SERIES}&from=now-1h"));
            let text = r.text();
            let names = text
                .lines()
                .filter_map(|line| line.rsplit_once(' '))
                .flat_map(|(stack, _)| stack.split(';').map(str::to_owned))
                .collect();
            (names, p)
        }
        Path::Pprof => {
            let (r, p) = api("pprof", &format!("query={SERIES}&from=now-1h"));
            (pprof_names(&r.body), p)
        }
        Path::Diff => {
            let (r, p) = api("diff", &format!("left_query={SERIES}&left_from=now-1h"));
            (strings(&r.json()["diff"]["names"]), p)
        }
        Path::QuerierStacktraces => {
            let (r, p) = querier("SelectMergeStacktraces", &select);
            (strings(&r["flamegraph"]["names"]), p)
        }
        Path::QuerierProfile => {
            // pprof in protobuf JSON: the names are in its string table.
            let (r, p) = querier("SelectMergeProfile", &select);
            (strings(&r["stringTable"]), p)
        }
        Path::QuerierDiff => {
            let (r, p) = querier("Diff", &json!({"left": select, "right": select}));
            (strings(&r["flamegraph"]["names"]), p)
        }
        Path::Render => {
            let query = enc(&format!("{type_id}{{pod=\"hot\"}}"));
            let r = get_ok(
                store,
                &format!("/pyroscope/render?query={query}&from=now-1h"),
            );
            (strings(&r.json()["flamebearer"]["names"]), partial(&r))
        }
        Path::GrpcPprof => grpc_pprof(store),
    }
}

/// gRPC `SelectMergePprof` of the test's series: its function names and
/// its `kiln-partial` metadata.
fn grpc_pprof(store: &StoreProcess) -> (Vec<String>, Option<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(store.url())
            .expect("url")
            .connect()
            .await
            .expect("connect");
        let reply = QueryServiceClient::new(channel)
            .select_merge_pprof(SelectMergePprofRequest {
                selector: r#"process_cpu{pod="hot"}"#.into(),
                range: None,
            })
            .await
            .expect("SelectMergePprof");
        let partial = reply
            .metadata()
            .get("kiln-partial")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (pprof_names(&reply.into_inner().pprof_gzip), partial)
    })
}

/// True when `names` hold the hot function and no frame of the program
/// by module and offset.
fn named(names: &[String]) -> bool {
    names.iter().any(|n| n == "hot_static_work") && !names.iter().any(|n| n.starts_with("hot+0x"))
}

/// The value of the sample `series` (name and labels, exactly as
/// written) on the store's `/metrics`.
pub fn metric(store: &StoreProcess, series: &str) -> f64 {
    let text = get(store.addr, "/metrics").text();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} not in {text}"))
        .parse()
        .expect("a number")
}

fn lookups(store: &StoreProcess, source: &str, result: &str) -> f64 {
    metric(
        store,
        &format!("kiln_symbolization_lookups_total{{source=\"{source}\",result=\"{result}\"}}"),
    )
}

/// Each path names the static function from the real debuginfod, complete;
/// the debug file is fetched once, by the first query, and every later
/// query names the frames from the cache.
#[test]
fn every_query_path_names_frames_after_the_merge() {
    let Some(setup) = Setup::start("30s", &[]) else {
        return;
    };
    let program = &setup.program;
    let stacks: Vec<Vec<u64>> = program.hot_addresses.iter().map(|&a| vec![a]).collect();
    setup.ingest(&stacks);
    let store = &setup.store;
    assert_eq!(metric(store, "kiln_symbolization_cache_bytes"), 0.0);
    let probed = setup.server.requests_for(&program.split.build_id);
    for path in PATHS {
        let (names, partial) = ask(store, path);
        assert_eq!(partial, None, "{path:?}");
        assert!(named(&names), "{path:?}: {names:?}");
    }
    // Three distinct addresses: missed by the cache once, then found in
    // it by every other path (the diffs' two sides each count).
    let addresses = stacks.len() as f64;
    let queries = PATHS.len() as f64 + 2.0;
    assert_eq!(lookups(store, "cache", "miss"), addresses);
    assert_eq!(lookups(store, "cache", "hit"), addresses * (queries - 1.0));
    assert_eq!(lookups(store, "bucket", "miss"), 1.0);
    assert_eq!(lookups(store, "debuginfod", "hit"), 1.0);
    assert_eq!(lookups(store, "debuginfod", "error"), 0.0);
    assert_eq!(
        metric(store, "kiln_symbolization_debuginfod_fetch_seconds_count"),
        1.0
    );
    assert!(metric(store, "kiln_symbolization_cache_bytes") > 0.0);
    assert_eq!(
        metric(store, "kiln_symbolization_pending_answers_total"),
        0.0
    );
    assert_eq!(
        setup.server.requests_for(&program.split.build_id),
        probed + 1,
        "one fetch for every path"
    );
}

/// With no wait, each path's first answer names the frame by module and
/// offset and says `symbols_pending=1` (header, or gRPC metadata), counted
/// on `/metrics`; the same path names it once the fetch is done. A fresh
/// store per path, so that each path's first query is the one that starts
/// the fetch.
#[test]
fn every_query_path_says_when_its_symbols_are_pending() {
    let Some(program) = build_program() else {
        return;
    };
    let Some(server) = Debuginfod::start(&program.split) else {
        return;
    };
    let pprof = unsymbolized_pprof(&program.mapping, &[vec![program.hot_addresses[0]]]);
    for path in PATHS {
        let store = store_with(&[
            "--debuginfod-urls",
            &server.url,
            "--symbolization-wait",
            "0s",
        ]);
        ingest(&store, &pprof, &[]);
        let (names, partial) = ask(&store, path);
        assert_eq!(
            partial.as_deref(),
            Some("symbols_pending=1"),
            "{path:?}: {names:?}"
        );
        // A diff merges and names its two sides one after the other: the
        // fetch the first side started may be done by the second.
        let diff = matches!(path, Path::Diff | Path::QuerierDiff);
        assert!(
            diff || !names.iter().any(|n| n == "hot_static_work"),
            "{path:?}: {names:?}"
        );
        // A pprof keeps an unnamed frame's mapping and address for later
        // tools, with no function; the other answers name it by module
        // and offset.
        let pprof = matches!(path, Path::Pprof | Path::QuerierProfile | Path::GrpcPprof);
        assert!(
            pprof || names.iter().any(|n| n.starts_with("hot+0x")),
            "{path:?}: module and offset: {names:?}"
        );
        assert!(metric(&store, "kiln_symbolization_pending_answers_total") >= 1.0);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (names, partial) = ask(&store, path);
            if partial.is_none() && named(&names) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{path:?} never named: {names:?} {partial:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
