//! `go tool pprof` (Debian `golang-go`) reads a merged profile straight from
//! the store's HTTP API.

use std::process::Command;

use kiln_pprof::{FunctionSpec, ProfileBuilder};
use kiln_testkit::binaries::target_dir;
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{enc, http};
use kiln_testkit::prerequisites::missing;
use kiln_testkit::store_process::StoreProcess;
use prost::Message;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// A Push (Connect, binary) of a CPU profile with one hot function.
fn push_profile(store: &StoreProcess, service: &str, hot_ms: i64) {
    push_typed(
        store,
        service,
        ("process_cpu", "cpu", "nanoseconds"),
        hot_ms * 1_000_000,
    );
}

/// A Push of a profile `(name, sample type, unit)` with one hot function
/// holding `value`.
fn push_typed(store: &StoreProcess, service: &str, kind: (&str, &str, &str), value: i64) {
    let (name, sample_type, unit) = kind;
    let now = now_nanos();
    let mut builder = ProfileBuilder::new(&[(sample_type, unit)]);
    builder
        .period(sample_type, unit, 1)
        .time(now, 10_000_000_000);
    let main = builder.function(&FunctionSpec {
        name: "main.main".into(),
        filename: "main.go".into(),
        ..Default::default()
    });
    let hot = builder.function(&FunctionSpec {
        name: "main.pprofVisibleHotFunction".into(),
        filename: "main.go".into(),
        ..Default::default()
    });
    let main_loc = builder.location(0, 0x401000, &[(main, 10)]);
    let hot_loc = builder.location(0, 0x402000, &[(hot, 20)]);
    builder.sample(&[hot_loc, main_loc], &[value], &[]);
    let request = kiln_api::push::v1::PushRequest {
        series: vec![kiln_api::push::v1::RawProfileSeries {
            labels: vec![
                kiln_api::types::v1::LabelPair {
                    name: "__name__".into(),
                    value: name.into(),
                },
                kiln_api::types::v1::LabelPair {
                    name: "service_name".into(),
                    value: service.into(),
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

/// `go tool pprof -raw` of the store's export for `query`.
fn go_tool_pprof_raw(store: &StoreProcess, query: &str) -> String {
    let url = format!(
        "{}/api/v1/pprof?query={}&from=now-1h&to=now",
        store.url(),
        enc(query)
    );
    let tmp = tempfile::tempdir().expect("temp dir");
    let output = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none", &url])
        .env("PPROF_TMPDIR", tmp.path())
        .env("HOME", tmp.path())
        // The target's Go build cache, which the kit's Go builds share: with HOME in a
        // temporary folder, go would otherwise rebuild its pprof tool on every run.
        .env("GOCACHE", target_dir().join("tmp").join("go-build-cache"))
        .output()
        .expect("run go tool pprof");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "go tool pprof failed: {stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn go_tool_pprof_reads_memory_goroutine_and_off_cpu_exports() {
    if Command::new("go").arg("version").output().is_err() {
        missing::<()>("go (Debian golang-go)");
        return;
    }
    let store = StoreProcess::start(KILN_STORE, &[]);
    for (kind, value) in [
        (("memory", "inuse_space", "bytes"), 4_096),
        (("memory", "alloc_objects", "count"), 17),
        (("goroutine", "goroutine", "count"), 9),
        (("off_cpu", "off_cpu", "nanoseconds"), 123_456_789),
    ] {
        push_typed(&store, "svc", kind, value);
        let (name, sample_type, unit) = kind;
        let stdout = go_tool_pprof_raw(
            &store,
            &format!("{name}:{sample_type}:{unit}{{service_name=\"svc\"}}"),
        );
        assert!(
            stdout.contains("main.pprofVisibleHotFunction"),
            "{kind:?}: function missing: {stdout}"
        );
        assert!(
            stdout.contains(&format!("{sample_type}/{unit}")),
            "{kind:?}: sample type missing: {stdout}"
        );
        assert!(
            stdout.contains(&format!(" {value}: ")) || stdout.contains(&format!("{value}:")),
            "{kind:?}: value {value} missing: {stdout}"
        );
    }
}

#[test]
fn go_tool_pprof_reads_the_merged_profile_over_http() {
    if Command::new("go").arg("version").output().is_err() {
        missing::<()>("go (Debian golang-go)");
        return;
    }
    let store = StoreProcess::start(KILN_STORE, &[]);
    push_profile(&store, "svc", 30);
    push_profile(&store, "svc", 50);
    let stdout = go_tool_pprof_raw(&store, r#"process_cpu{service_name="svc"}"#);
    assert!(
        stdout.contains("main.pprofVisibleHotFunction"),
        "function missing: {stdout}"
    );
    // The two pushes merge into one sample of 80 ms.
    assert!(
        stdout.contains("80000000"),
        "merged value missing: {stdout}"
    );
    assert!(
        stdout.contains("cpu/nanoseconds"),
        "sample type missing: {stdout}"
    );
}
