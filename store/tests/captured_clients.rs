//! The exact requests real Pyroscope clients sent (`../shared/testdata/clients`),
//! replayed byte for byte against a real `kiln-store`, then queried back.

mod common;

use std::path::Path;

use common::{StoreProcess, enc, flamegraph_names, get, http, testdata_dir};

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
    get(
        store.addr,
        &format!("/api/v1/profile-types?from={CAPTURE_FROM}&to={CAPTURE_TO}"),
    )
    .json()["profile_types"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["id"].as_str().map(str::to_owned))
        .collect()
}

fn flamegraph(store: &StoreProcess, selector: &str) -> serde_json::Value {
    let response = get(
        store.addr,
        &format!(
            "/api/v1/flamegraph?query={}&from={CAPTURE_FROM}&to={CAPTURE_TO}",
            enc(selector)
        ),
    );
    assert_eq!(response.status, 200, "{selector}: {}", response.text());
    response.json()
}

fn label_values(store: &StoreProcess, name: &str) -> Vec<String> {
    get(
        store.addr,
        &format!("/api/v1/labels/{name}/values?from={CAPTURE_FROM}&to={CAPTURE_TO}"),
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
    let Some(testdata) = testdata_dir() else {
        return;
    };
    let clients = testdata.join("clients");
    // The captures carry their own (fixed) times; keep them accepted.
    let store = StoreProcess::start(&["--retention", "36500d"]);
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
