//! The real `pyroscope-io` client from PyPI, both the 0.8 line (`/ingest`,
//! pprof body) and the 1.x line (Push over Connect), profiling a Python
//! program against a real `kiln-store`. The venvs are created by
//! `./kiln-dev test` under `$KILN_TOOLS_DIR` (default /var/tmp/kiln-tools).

use std::path::PathBuf;
use std::process::Command;

use kiln_testkit::http::{enc, flamegraph_names, get};
use kiln_testkit::store_process::StoreProcess;
use kiln_testkit::tools::venv_python;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// Runs the hot program with the client in `venv`, then checks that the
/// hot function and the tags come back from the query API.
fn profile_python_program(venv: &str, app: &str, seconds: &str, write_token: Option<&str>) {
    let Some(python) = venv_python(venv) else {
        return;
    };
    let store = match write_token {
        Some(token) => StoreProcess::start_with_env(
            KILN_STORE,
            tempfile::tempdir().expect("temp dir"),
            &[],
            &[("KILN_WRITE_TOKENS", token)],
        ),
        None => StoreProcess::start(KILN_STORE, &[]),
    };
    let program =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pyroscope_hot_app.py");
    let output = Command::new(&python)
        .arg(&program)
        .arg(store.url())
        .arg(app)
        .arg(seconds)
        .args(write_token)
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "{venv} program failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    let selector = format!(r#"process_cpu{{service_name="{app}"}}"#);
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={}&from=now-10m", enc(&selector)),
    );
    assert_eq!(response.status, 200, "{venv}: {}", response.text());
    let graph = response.json();
    let names = flamegraph_names(&graph);
    assert!(
        names.iter().any(|n| n.contains("kiln_hot_function")),
        "{venv}: the hot function is missing from {names:?}"
    );
    let top = get(
        store.addr,
        &format!("/api/v1/top?query={}&from=now-10m&limit=3", enc(&selector)),
    )
    .json();
    assert!(
        top["top"][0]["name"]
            .as_str()
            .is_some_and(|n| n.contains("kiln_hot_function")),
        "{venv}: the hot function is not the top self-time entry: {top}"
    );

    let labels = get(store.addr, "/api/v1/labels?from=now-10m").json();
    let label_names: Vec<&str> = labels["names"]
        .as_array()
        .expect("names")
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    for tag in ["env", "team", "endpoint", "service_name"] {
        assert!(
            label_names.contains(&tag),
            "{venv}: tag {tag} missing from {label_names:?}"
        );
    }
    let values = get(store.addr, "/api/v1/labels/endpoint/values?from=now-10m").json();
    assert_eq!(values["values"], serde_json::json!(["/hot"]), "{venv}");
    let env_query = enc(&format!(
        r#"process_cpu{{service_name="{app}", env="ci", team="kiln"}}"#
    ));
    let tagged = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={env_query}&from=now-10m"),
    )
    .json();
    assert!(
        tagged["total"].as_i64().unwrap_or(0) > 0,
        "{venv}: {tagged}"
    );
}

#[test]
fn pyroscope_io_0_8_ingest_names_the_hot_function_and_keeps_tags() {
    // 0.8 uploads every 10 s; run past one upload, shutdown sends the rest.
    profile_python_program("pyroscope-io-0.8", "kiln.py08.app", "11", None);
}

#[test]
fn pyroscope_io_1_x_push_names_the_hot_function_and_keeps_tags() {
    profile_python_program("pyroscope-io-1", "kiln.py1.app", "5", None);
}

#[test]
fn pyroscope_io_1_x_with_basic_auth_passes_a_write_token_check() {
    profile_python_program("pyroscope-io-1", "kiln.py1.auth.app", "4", Some("py-token"));
}
