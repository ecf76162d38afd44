//! The exact requests real Pyroscope clients send, replayed byte for byte
//! against a real `kiln-store`, then queried back: requests the real
//! `pyroscope-io` clients (0.8 and 1.x), the pyroscope-go SDK and the
//! Node.js SDK send at test time to a recorder in the test, and, where
//! `../shared/testdata/clients` is checked out, the captures there (the
//! Rust client's too).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_testkit::fixtures::shared_testdata;
use kiln_testkit::http::{enc, flamegraph_names, get, http};
use kiln_testkit::recorder::{Recorded, Recorder};
use kiln_testkit::store_process::StoreProcess;
use kiln_testkit::tools::venv_python;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// The capture machine's clock read November 2026: query a fixed window
/// around the captures, independent of today's clock.
const CAPTURE_FROM: &str = "1795300000";
const CAPTURE_TO: &str = "1795320000";

/// Replays every `*.request.json` in `dir`; returns how many were sent.
fn replay_dir(store: &StoreProcess, dir: &Path) -> usize {
    let mut sent = 0;
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read capture dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".request.json"))
        .collect();
    entries.sort();
    for path in entries {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read request")).expect("json");
        let body = std::fs::read(dir.join(meta["body_file"].as_str().expect("body_file")))
            .expect("read body");
        let headers: Vec<(String, String)> = meta["headers"]
            .as_object()
            .expect("headers")
            .iter()
            .filter(|(name, _)| name.as_str() != "connection")
            .map(|(name, value)| (name.clone(), value.as_str().unwrap_or("").to_owned()))
            .collect();
        let header_refs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let response = http(
            store.addr,
            meta["method"].as_str().expect("method"),
            meta["raw_target"].as_str().expect("raw_target"),
            &header_refs,
            &body,
        )
        .expect("send");
        assert_eq!(
            response.status,
            200,
            "{}: {}",
            path.display(),
            response.text()
        );
        sent += 1;
    }
    sent
}

fn profile_types(store: &StoreProcess) -> Vec<String> {
    profile_types_in(store, &format!("from={CAPTURE_FROM}&to={CAPTURE_TO}"))
}

/// Profile types with data in the window `window` (`from=..&to=..`).
fn profile_types_in(store: &StoreProcess, window: &str) -> Vec<String> {
    get(store.addr, &format!("/api/v1/profile-types?{window}")).json()["profile_types"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["id"].as_str().map(str::to_owned))
        .collect()
}

fn flamegraph(store: &StoreProcess, selector: &str) -> serde_json::Value {
    flamegraph_in(
        store,
        selector,
        &format!("from={CAPTURE_FROM}&to={CAPTURE_TO}"),
    )
}

fn flamegraph_in(store: &StoreProcess, selector: &str, window: &str) -> serde_json::Value {
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={}&{window}", enc(selector)),
    );
    assert_eq!(response.status, 200, "{selector}: {}", response.text());
    response.json()
}

fn label_values(store: &StoreProcess, name: &str) -> Vec<String> {
    label_values_in(store, name, &format!("from={CAPTURE_FROM}&to={CAPTURE_TO}"))
}

fn label_values_in(store: &StoreProcess, name: &str, window: &str) -> Vec<String> {
    get(
        store.addr,
        &format!("/api/v1/labels/{name}/values?{window}"),
    )
    .json()["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn every_captured_client_request_is_accepted_and_queryable() {
    let Some(clients) = shared_testdata("clients") else {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: the ../shared client captures (Node, Rust, Python) were not replayed \
             (the Rust client's folded uploads have no twin); \
             live_pyroscope_io_requests_replay_byte_for_byte_and_query_back covers Python, \
             live_pyroscope_go_requests_replay_byte_for_byte_and_query_back an SDK with tags in name=, \
             live_pyroscope_node_requests_replay_byte_for_byte_and_query_back Node's wall type and dotted keys"
        );
        return;
    };
    // The captures carry their own (fixed) times; keep them accepted.
    let store = StoreProcess::start(KILN_STORE, &["--retention", "36500d"]);
    let mut sent = 0;
    for client in [
        "python-pyroscope-io-1.4.0",
        "python-pyroscope-io-0.8.16",
        "nodejs-pyroscope-0.6.4",
        "rust-pyroscope-0.5.8",
    ] {
        sent += replay_dir(&store, &clients.join(client));
    }
    assert_eq!(sent, 9, "every capture replayed");

    let types = profile_types(&store);
    for expected in [
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "memory:alloc_space:bytes:space:bytes",
        "wall:wall:nanoseconds",
        "memory:inuse_space:bytes",
    ] {
        assert!(
            types.iter().any(|t| t.starts_with(expected)),
            "{expected} missing from {types:?}"
        );
    }

    // Rust folded uploads: `.cpu` suffix, 100 Hz, tags in `name`.
    let cpu_type = types
        .iter()
        .find(|t| t.starts_with("process_cpu:cpu:nanoseconds:cpu:nanoseconds"))
        .expect("cpu type");
    let graph = flamegraph(
        &store,
        &format!(r#"{cpu_type}{{service_name="fixture.rust.app", endpoint="/a", env="test"}}"#),
    );
    let rust_total = graph["total"].as_i64().expect("total");
    // 377 samples at 100 Hz from the folded upload, plus the pprof upload's
    // endpoint=/a samples (a pprof sample label).
    assert!(rust_total >= 377 * 10_000_000, "{graph}");
    let names = flamegraph_names(&graph);
    assert!(names.iter().any(|n| n.contains("fib")), "{names:?}");

    // Python 1.x Push and 0.8 ingest: labels and the hot function.
    let graph = flamegraph(
        &store,
        &format!(r#"{cpu_type}{{service_name="fixture.python.app"}}"#),
    );
    assert!(graph["total"].as_i64().expect("total") > 0, "{graph}");

    // Node: dotted keys and a `/` in a value from `name=`.
    assert!(
        label_values(&store, "otel.scope.name")
            .contains(&"com.grafana.pyroscope/nodejs".to_owned())
    );
    assert!(label_values(&store, "service_name").contains(&"fixture.node.app".to_owned()));
    // pprof sample labels became series labels.
    let endpoints = label_values(&store, "endpoint");
    assert!(endpoints.contains(&"/a".to_owned()), "{endpoints:?}");
    assert!(endpoints.contains(&"/b".to_owned()), "{endpoints:?}");
}

/// Runs the capture program with the client in `venv` against a recorder
/// and returns every request it sent.
fn capture_client(python: &Path, app: &str, seconds: &str) -> Vec<Recorded> {
    let recorder = Recorder::start();
    let program =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pyroscope_capture_app.py");
    let output = Command::new(python)
        .arg(&program)
        .arg(recorder.url())
        .arg(app)
        .arg(seconds)
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "{app}: the client program failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    recorder.requests()
}

/// Sends a recorded request to the store exactly as the client sent it
/// (method, target, headers, body); only `Host` and `Connection` are the
/// replayer's own.
fn replay(store: &StoreProcess, request: &Recorded) {
    let headers: Vec<(&str, &str)> = request
        .headers
        .iter()
        .filter(|(name, _)| {
            !name.eq_ignore_ascii_case("host") && !name.eq_ignore_ascii_case("connection")
        })
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let response = http(
        store.addr,
        &request.method,
        &request.target,
        &headers,
        &request.body,
    )
    .expect("send");
    assert_eq!(
        response.status,
        200,
        "{} {}: {}",
        request.method,
        request.target,
        response.text()
    );
}

/// What the real Python clients send now, so the replay needs nothing
/// outside the repository (issue 13): 1.x Push (CPU and memory, Connect
/// protocol) and 0.8 `/ingest`, with static and dynamic tags.
#[test]
fn live_pyroscope_io_requests_replay_byte_for_byte_and_query_back() {
    let (Some(python1), Some(python08)) = (
        venv_python("pyroscope-io-1"),
        venv_python("pyroscope-io-0.8"),
    ) else {
        return;
    };
    let push = capture_client(&python1, "kiln.capture.py1", "4");
    // 0.8 uploads on 10 s boundaries of the wall clock and at shutdown, and
    // its shutdown upload is not always sent (CI once saw no
    // kiln_capture_b at all from an 11 s run). 11 s per function puts a
    // periodic upload inside each one, wherever the run starts.
    let ingest = capture_client(&python08, "kiln.capture.py08", "22");
    assert!(
        push.iter()
            .all(|r| r.target == "/push.v1.PusherService/Push"),
        "1.x targets: {:?}",
        push.iter().map(|r| &r.target).collect::<Vec<_>>()
    );
    assert!(
        !ingest.is_empty() && ingest.iter().all(|r| r.target.starts_with("/ingest?")),
        "0.8 targets: {:?}",
        ingest.iter().map(|r| &r.target).collect::<Vec<_>>()
    );

    let store = StoreProcess::start(KILN_STORE, &[]);
    for request in push.iter().chain(&ingest) {
        replay(&store, request);
    }

    let window = "from=now-10m";
    let types = profile_types_in(&store, window);
    let cpu_type = types
        .iter()
        .find(|t| t.starts_with("process_cpu:cpu:nanoseconds:cpu:nanoseconds"))
        .unwrap_or_else(|| panic!("no CPU type in {types:?}"));
    assert!(
        types.iter().any(|t| t.starts_with("memory:")),
        "1.x's memory profile is missing from {types:?}"
    );
    for app in ["kiln.capture.py1", "kiln.capture.py08"] {
        let graph = flamegraph_in(
            &store,
            &format!(r#"{cpu_type}{{service_name="{app}", env="ci"}}"#),
            window,
        );
        assert!(graph["total"].as_i64().unwrap_or(0) > 0, "{app}: {graph}");
        let names = flamegraph_names(&graph);
        for function in ["kiln_capture_a", "kiln_capture_b"] {
            assert!(
                names.iter().any(|n| n.contains(function)),
                "{app}: {function} is missing from {names:?}; 0.8 sent {:?}",
                ingest.iter().map(|r| &r.target).collect::<Vec<_>>()
            );
        }
        // The dynamic tag split the time by endpoint.
        for endpoint in ["/a", "/b"] {
            let graph = flamegraph_in(
                &store,
                &format!(r#"{cpu_type}{{service_name="{app}", endpoint="{endpoint}"}}"#),
                window,
            );
            assert!(
                graph["total"].as_i64().unwrap_or(0) > 0,
                "{app} {endpoint}: {graph}"
            );
        }
    }
    // 1.x names its scope with a dotted key.
    assert!(
        label_values_in(&store, "otel.scope.name", window)
            .contains(&"com.grafana.pyroscope/python".to_owned())
    );
}

/// A twin of `every_captured_client_request_is_accepted_and_queryable` for
/// what the Python twin above leaves out: a real SDK that puts its static
/// tags in `name=app{k=v,...}`, a `/` in a value among them, as the Node
/// client's captures do, and uploads heap and goroutine types beside CPU
/// (goroutines with `sampleRate=0`). pyroscope-go
/// sends its multipart `/ingest` requests now, and they are replayed
/// byte for byte.
#[test]
fn live_pyroscope_go_requests_replay_byte_for_byte_and_query_back() {
    use kiln_testkit::real_inputs::pyroscope_go::{FUNCTIONS, STATIC_TAGS, run_pyroscope_go_app};
    let work = tempfile::tempdir().expect("temporary directory");
    let recorder = Recorder::start();
    let app = "kiln.capture.go";
    if run_pyroscope_go_app(work.path(), recorder.url(), app, 3.0).is_none() {
        return;
    }
    let store = store_of_sdk_uploads("pyroscope-go", &recorder);

    let window = "from=now-10m";
    let types = profile_types_in(&store, window);
    let cpu_type = types
        .iter()
        .find(|t| t.starts_with("process_cpu:cpu:nanoseconds:cpu:nanoseconds"))
        .unwrap_or_else(|| panic!("no CPU type in {types:?}"));
    // Goroutine uploads come with sampleRate=0.
    for other in [
        "memory:alloc_space:bytes",
        "memory:inuse_space:bytes",
        "goroutines:goroutines:count",
    ] {
        assert!(
            types.iter().any(|t| t.starts_with(other)),
            "{other} missing from {types:?}"
        );
    }
    // Static tags came inside `name=`, dotted name and `/` included.
    assert!(label_values_in(&store, "service_name", window).contains(&app.to_owned()));
    assert_labels(&store, window, &STATIC_TAGS);
    // Dynamic tags were pprof sample labels, and split the time by endpoint.
    assert_endpoints_split_time(
        &store,
        window,
        &format!("{cpu_type}{{service_name=\"{app}\""),
        FUNCTIONS,
    );
}

/// A twin of `every_captured_client_request_is_accepted_and_queryable` for
/// its Node.js captures: the real `@pyroscope/nodejs` SDK (the version the
/// captures came from) uploads a wall profile with `sampleRate` and a heap
/// profile, with dotted tag keys of its own inside `name=`, and its dynamic
/// labels as pprof sample labels. Its requests are replayed byte for byte.
#[test]
fn live_pyroscope_node_requests_replay_byte_for_byte_and_query_back() {
    use kiln_testkit::real_inputs::pyroscope_node::{
        FUNCTIONS, SDK_TAG, STATIC_TAGS, run_pyroscope_node_app,
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let recorder = Recorder::start();
    let app = "kiln.capture.node";
    if run_pyroscope_node_app(work.path(), recorder.url(), app, 4.0).is_none() {
        return;
    }
    let store = store_of_sdk_uploads("the Node SDK", &recorder);

    let window = "from=now-10m";
    let types = profile_types_in(&store, window);
    let wall_type = types
        .iter()
        .find(|t| t.starts_with("wall:wall:nanoseconds"))
        .unwrap_or_else(|| panic!("no wall type in {types:?}"));
    assert!(
        types
            .iter()
            .any(|t| t.starts_with("memory:inuse_space:bytes")),
        "no heap type in {types:?}"
    );
    assert!(label_values_in(&store, "service_name", window).contains(&app.to_owned()));
    // The SDK's dotted key, whose value has a `/`, came inside `name=`.
    assert_labels(&store, window, &[SDK_TAG]);
    assert_labels(&store, window, &STATIC_TAGS);
    assert_endpoints_split_time(
        &store,
        window,
        &format!("{wall_type}{{service_name=\"{app}\""),
        FUNCTIONS,
    );
}

/// A store holding every request `recorder` got from `sdk`, replayed byte
/// for byte; they must be Pyroscope `/ingest` uploads, and at least one.
fn store_of_sdk_uploads(sdk: &str, recorder: &Recorder) -> StoreProcess {
    let requests = recorder.requests();
    assert!(
        !requests.is_empty() && requests.iter().all(|r| r.target.starts_with("/ingest?")),
        "{sdk} targets: {:?}",
        requests.iter().map(|r| &r.target).collect::<Vec<_>>()
    );
    let store = StoreProcess::start(KILN_STORE, &[]);
    for request in &requests {
        replay(&store, request);
    }
    store
}

/// Each `(key, value)` is among the store's values of `key`.
fn assert_labels(store: &StoreProcess, window: &str, labels: &[(&str, &str)]) {
    for (key, value) in labels {
        let values = label_values_in(store, key, window);
        assert!(values.contains(&(*value).to_owned()), "{key}: {values:?}");
    }
}

/// The SDK apps run `functions[0]` under `endpoint=/a` and `functions[1]`
/// under `endpoint=/b`: each endpoint's flame graph (`selector_head` is the
/// selector up to its closing brace) has time, and that function in it
/// (Node names a frame `file:function:line`).
fn assert_endpoints_split_time(
    store: &StoreProcess,
    window: &str,
    selector_head: &str,
    functions: [&str; 2],
) {
    for (endpoint, function) in [("/a", functions[0]), ("/b", functions[1])] {
        let graph = flamegraph_in(
            store,
            &format!(r#"{selector_head}, endpoint="{endpoint}"}}"#),
            window,
        );
        assert!(
            graph["total"].as_i64().unwrap_or(0) > 0,
            "{endpoint}: {graph}"
        );
        let names = flamegraph_names(&graph);
        assert!(
            names
                .iter()
                .any(|n| n == function || n.split(':').any(|part| part == function)),
            "{endpoint}: {function} is missing from {names:?}"
        );
    }
}
