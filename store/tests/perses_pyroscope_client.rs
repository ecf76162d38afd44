//! A real query client: the Perses Pyroscope plugin's client
//! (`@perses-dev/pyroscope-plugin` 0.4.0 from npm, installed by
//! `./kiln-dev test` under `$KILN_TOOLS_DIR`) runs in Node against a live
//! `kiln-store` (`tests/perses/perses_client.cjs`). Its
//! `searchProfileTypes`, `searchLabelNames`, `searchLabelValues`,
//! `searchServices` and `searchProfiles` must all return the stored data.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_testkit::http::{enc, get, http};
use kiln_testkit::prerequisites::missing;
use kiln_testkit::store_process::StoreProcess;
use serde_json::Value;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

fn plugin_dir() -> Option<PathBuf> {
    let tools = std::env::var_os("KILN_TOOLS_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp/kiln-tools"), PathBuf::from);
    let dir = tools.join("node_modules/@perses-dev/pyroscope-plugin");
    dir.join("lib/cjs/model/pyroscope-client.js")
        .is_file()
        .then_some(dir)
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn the_perses_pyroscope_client_reads_what_kiln_stores() {
    let Some(plugin) = plugin_dir() else {
        missing::<()>("@perses-dev/pyroscope-plugin in $KILN_TOOLS_DIR/node_modules");
        return;
    };
    if Command::new("node").arg("--version").output().is_err() {
        missing::<()>("node");
        return;
    }
    let store = StoreProcess::start(KILN_STORE, &[]);
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
    let types = get(store.addr, "/api/v1/profile-types").json();
    let type_id = types["profile_types"][0]["id"]
        .as_str()
        .expect("a stored type")
        .to_owned();
    let own_total = get(
        store.addr,
        &format!(
            "/api/v1/flamegraph?query={}&from=now-1h",
            enc(&format!("{type_id}{{service_name=\"checkout\"}}"))
        ),
    )
    .json()["total"]
        .as_i64()
        .expect("total");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/perses/perses_client.cjs");
    let output = Command::new("node")
        .arg(&script)
        .arg(&plugin)
        .arg(store.url())
        .arg(&type_id)
        .output()
        .expect("run node");
    assert!(
        output.status.success(),
        "the Perses client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Value = serde_json::from_slice(&output.stdout).expect("JSON from the client");

    let ids: Vec<&str> = got["profileTypes"]["profileTypes"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["ID"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec![type_id.as_str()], "{got}");
    let names = strings(&got["labelNames"]["names"]);
    for name in ["env", "service_name", "__name__"] {
        assert!(names.contains(&name), "{names:?}");
    }
    assert_eq!(strings(&got["labelValues"]["names"]), vec!["dev", "prod"]);
    assert_eq!(strings(&got["services"]["names"]), vec!["checkout"]);

    let flamebearer = &got["profiles"]["flamebearer"];
    assert_eq!(flamebearer["numTicks"].as_i64(), Some(own_total), "{got}");
    assert_eq!(own_total, 450_000_000);
    let frames = strings(&flamebearer["names"]);
    for frame in ["main", "work", "idle"] {
        assert!(frames.contains(&frame), "{frames:?}");
    }
    let samples: i64 = got["profiles"]["timeline"]["samples"]
        .as_array()
        .map(|s| s.iter().filter_map(Value::as_i64).sum())
        .unwrap_or(0);
    assert_eq!(samples, own_total);
}
