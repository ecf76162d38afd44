//! `kiln` against a live `kiln-store` on 127.0.0.1 seeded with real pprof
//! profiles: the SVG names the expected frame, the pprof reads in
//! `go tool pprof`, and bad input gets clear errors. Each check runs on CPU
//! profiles a Go workload writes at test time, and again on the `../shared`
//! fixtures where they are present.

use kiln_testkit::binaries::built_binary;
use kiln_testkit::clock::now_s;
use kiln_testkit::fixtures::shared_testdata;
use kiln_testkit::prerequisites::missing;
use kiln_testkit::store_process::StoreProcess;
use std::path::Path;
use std::process::{Command, Output};

const CHECKOUT: &str = "process_cpu:cpu{pod=\"checkout-1\"}";

fn ingest(store: &StoreProcess, fixture: &Path, labels: &str) {
    let now = now_s();
    let body = std::fs::read(fixture).expect("fixture is readable");
    let response = ureq::post(format!("{}/ingest", store.url()))
        .query("format", "pprof")
        .query("name", format!("process_cpu{{{labels}}}"))
        .query("from", (now - 120).to_string())
        .query("until", (now - 110).to_string())
        .send(&body[..])
        .expect("ingest succeeds");
    assert_eq!(response.status().as_u16(), 200);
}

fn kiln(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("KILN_OUTPUT")
        .env_remove("KILN_FORMAT")
        .output()
        .expect("kiln runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A store seeded with CPU profiles of two pods, `checkout-1` and
/// `search-1`, and the frames the checks look for in them.
struct Seeded {
    store: StoreProcess,
    /// A function on checkout-1's stacks only, wide in its flame graph.
    hot: &'static str,
    /// A function on search-1's stacks only.
    other_only: &'static str,
    /// (Part of the name of) a function with flat time on search-1's
    /// stacks only, which the diff table lists.
    other_flat: &'static str,
    /// (Part of the name of) checkout-1's largest flat function.
    top_flat: &'static str,
    /// A search-1 frame wide enough to be drawn, named, in the diff SVG.
    compared_drawn: &'static str,
}

/// Seeded with the `../shared` fixtures, when present.
fn seeded_store() -> Option<Seeded> {
    let fixtures = shared_testdata("profiles")?;
    let binary = built_binary("kiln-store", "KILN_STORE_BIN")?;
    let store = StoreProcess::start(&binary, &[]);
    ingest(
        &store,
        &fixtures.join("google-pprof/sample.cpu.pb.gz"),
        "pod=checkout-1",
    );
    ingest(
        &store,
        &fixtures.join("google-pprof/large.cpu.pb.gz"),
        "pod=search-1",
    );
    Some(Seeded {
        store,
        hot: "main.busyLoop",
        other_only: "time.Now",
        other_flat: "time.Now",
        top_flat: "runtime.mapiternext",
        compared_drawn: "main.next",
    })
}

/// Seeded with CPU profiles the UI's Go workload writes now, so that a
/// clone without `../shared` runs every check: its `checkout` service as
/// checkout-1 and its `search` service as search-1.
fn store_seeded_with_go_workloads(work: &Path) -> Option<Seeded> {
    let profiles = kiln_testkit::go_programs::workload_cpu_profiles(work)?;
    let binary = built_binary("kiln-store", "KILN_STORE_BIN")?;
    let store = StoreProcess::start(&binary, &[]);
    for (service, pod) in [("checkout", "checkout-1"), ("search", "search-1")] {
        let (_, profile) = profiles
            .iter()
            .find(|(s, _)| *s == service)
            .expect("the workload plays every service");
        ingest(&store, profile, &format!("pod={pod}"));
    }
    Some(Seeded {
        store,
        hot: "main.handleCheckout",
        other_only: "main.handleSearch",
        // Sorting's (slices.partitionOrdered and its kin) holds a third of
        // search's time; main.handleSearch itself has little flat time.
        other_flat: "slices.",
        // SHA-256's block function (blockSHANI, blockAVX2, ... by CPU)
        // holds half of checkout's time.
        top_flat: "sha256.block",
        compared_drawn: "main.handleSearch",
    })
}

#[test]
fn query_writes_svg_pprof_json_and_a_top_table_from_a_live_store() {
    if let Some(seeded) = seeded_store() {
        query_writes_svg_pprof_json_and_a_top_table(&seeded);
    }
}

/// Twin of the test above that needs no `../shared`.
#[test]
fn query_writes_svg_pprof_json_and_a_top_table_from_go_profiles_made_now() {
    let work = tempfile::tempdir().expect("temporary directory");
    if let Some(seeded) = store_seeded_with_go_workloads(work.path()) {
        query_writes_svg_pprof_json_and_a_top_table(&seeded);
    }
}

fn query_writes_svg_pprof_json_and_a_top_table(seeded: &Seeded) {
    let url = seeded.store.url();
    let out = tempfile::tempdir().expect("temporary directory");

    let svg_path = out.path().join("flamegraph.svg");
    let svg_arg = svg_path.to_str().expect("utf-8 path");
    let run = kiln(
        &url,
        &[
            "query", "--from", "now-15m", "--to", "now", "--output", svg_arg, CHECKOUT,
        ],
    );
    assert!(
        run.status.success(),
        "kiln query --output svg failed: {}",
        text(&run.stderr)
    );
    let svg = std::fs::read_to_string(&svg_path).expect("SVG written");
    assert!(
        svg.starts_with("<?xml") || svg.starts_with("<svg"),
        "not an SVG: {}",
        &svg[..80.min(svg.len())]
    );
    assert!(svg.contains(seeded.hot), "the SVG names the hot function");
    assert!(
        !svg.contains(seeded.other_only),
        "the other pod's frames stay out"
    );

    let pprof_path = out.path().join("profile.pb.gz");
    let pprof_arg = pprof_path.to_str().expect("utf-8 path");
    let run = kiln(
        &url,
        &[
            "query", "--from", "now-15m", "--output", pprof_arg, CHECKOUT,
        ],
    );
    assert!(
        run.status.success(),
        "kiln query --output pprof failed: {}",
        text(&run.stderr)
    );
    match Command::new("go")
        .args(["tool", "pprof", "-raw", pprof_arg])
        .output()
    {
        Ok(go) => {
            assert!(
                go.status.success(),
                "go tool pprof -raw failed: {}",
                text(&go.stderr)
            );
            assert!(
                text(&go.stdout).contains(seeded.hot),
                "pprof -raw lists the hot function"
            );
        }
        Err(_) => missing::<()>("go (golang-go) is not installed").unwrap_or(()),
    }

    let run = kiln(
        &url,
        &["query", "--from", "now-15m", "--format", "json", CHECKOUT],
    );
    assert!(
        run.status.success(),
        "kiln query --format json failed: {}",
        text(&run.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).expect("stdout is JSON");
    assert!(json["total"].as_i64().is_some_and(|t| t > 0));
    assert!(
        json["flamegraph"]["names"]
            .as_array()
            .is_some_and(|n| n.iter().any(|v| v == seeded.hot))
    );

    let run = kiln(
        &url,
        &["query", "--from", "now-15m", "--limit", "5", CHECKOUT],
    );
    assert!(
        run.status.success(),
        "kiln query (table) failed: {}",
        text(&run.stderr)
    );
    let table = text(&run.stdout);
    let first_row = table.lines().nth(2).unwrap_or_default();
    assert!(
        first_row.contains(seeded.top_flat),
        "largest flat function first:\n{table}"
    );
    assert_eq!(
        table.lines().count(),
        2 + 5,
        "title, header and five rows:\n{table}"
    );
}

#[test]
fn labels_series_and_diff_read_the_live_store() {
    if let Some(seeded) = seeded_store() {
        labels_series_and_diff_read(&seeded);
    }
}

/// Twin of the test above that needs no `../shared`.
#[test]
fn labels_series_and_diff_read_a_store_of_go_profiles_made_now() {
    let work = tempfile::tempdir().expect("temporary directory");
    if let Some(seeded) = store_seeded_with_go_workloads(work.path()) {
        labels_series_and_diff_read(&seeded);
    }
}

fn labels_series_and_diff_read(seeded: &Seeded) {
    let url = seeded.store.url();

    let run = kiln(&url, &["labels", "--from", "now-15m", "pod"]);
    assert!(
        run.status.success(),
        "kiln labels failed: {}",
        text(&run.stderr)
    );
    assert_eq!(text(&run.stdout), "checkout-1\nsearch-1\n");

    let run = kiln(&url, &["labels", "--from", "now-15m"]);
    assert!(text(&run.stdout).lines().any(|l| l == "pod"));

    let run = kiln(&url, &["series", "--from", "now-15m", CHECKOUT]);
    assert!(
        run.status.success(),
        "kiln series failed: {}",
        text(&run.stderr)
    );
    let series = text(&run.stdout);
    assert_eq!(series.lines().count(), 1, "{series}");
    assert!(series.contains("pod=\"checkout-1\""), "{series}");

    let run = kiln(
        &url,
        &[
            "diff",
            "--from",
            "now-15m",
            CHECKOUT,
            "process_cpu:cpu{pod=\"search-1\"}",
        ],
    );
    assert!(
        run.status.success(),
        "kiln diff failed: {}",
        text(&run.stderr)
    );
    let diff = text(&run.stdout);
    assert!(
        diff.contains(seeded.other_flat) && diff.contains(seeded.top_flat),
        "{diff}"
    );

    let out = tempfile::tempdir().expect("temporary directory");
    let svg_path = out.path().join("diff.svg");
    let svg_arg = svg_path.to_str().expect("utf-8 path");
    let run = kiln(
        &url,
        &[
            "diff",
            "--from",
            "now-15m",
            "-o",
            svg_arg,
            CHECKOUT,
            "process_cpu:cpu{pod=\"search-1\"}",
        ],
    );
    assert!(
        run.status.success(),
        "kiln diff -o svg failed: {}",
        text(&run.stderr)
    );
    let svg = std::fs::read_to_string(&svg_path).expect("diff SVG written");
    // Differential flame graphs take their shape from the compared side.
    assert!(
        svg.contains(seeded.compared_drawn),
        "the compared side's frames are drawn"
    );
}

#[test]
fn bad_selectors_show_the_stores_error_with_its_position() {
    if let Some(seeded) = seeded_store() {
        bad_selectors_show_the_stores_error(&seeded.store);
    }
}

/// Twin of the test above that needs no `../shared`.
#[test]
fn bad_selectors_show_the_stores_error_with_its_position_on_go_profiles_made_now() {
    let work = tempfile::tempdir().expect("temporary directory");
    if let Some(seeded) = store_seeded_with_go_workloads(work.path()) {
        bad_selectors_show_the_stores_error(&seeded.store);
    }
}

fn bad_selectors_show_the_stores_error(store: &StoreProcess) {
    let run = kiln(
        &store.url(),
        &["query", "--from", "now-15m", "process_cpu:cpu{pod=}"],
    );
    assert_eq!(run.status.code(), Some(2), "a rejected query exits with 2");
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains("position"),
        "the error names the position: {stderr}"
    );
    assert!(stderr.contains("rejected"), "{stderr}");
}

#[test]
fn an_unreachable_store_is_reported_as_such() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let run = kiln(&format!("http://127.0.0.1:{port}"), &["query", CHECKOUT]);
    assert_eq!(
        run.status.code(),
        Some(3),
        "an unreachable store exits with 3"
    );
    let stderr = text(&run.stderr);
    assert!(stderr.contains("cannot reach the store"), "{stderr}");
    assert!(
        stderr.contains("KILN_STORE"),
        "the error says how to point elsewhere: {stderr}"
    );
}
