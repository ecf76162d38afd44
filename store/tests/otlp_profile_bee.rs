//! A real OTLP client: profile-bee (crates.io, `--features otlp`, installed
//! by `./kiln-dev test` under `$KILN_TOOLS_DIR/profile-bee`) samples a C
//! program that spins in a known function and exports over gRPC to a live
//! `kiln-store`; the function must come back in Kiln's flame graph under the
//! `service_name` given with `--otlp-service-name`. Needs root (eBPF) and
//! tracefs, which the test mounts when absent.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use kiln_testkit::http::{enc, flamegraph_names, get};
use kiln_testkit::prerequisites::missing;
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

const HOT_FUNCTION: &str = "kiln_otlp_hot_spin";
const SERVICE: &str = "kiln-otlp-profile-bee";

/// The C program: `main` calls the hot function until 8 s have passed.
const HOT_PROGRAM: &str = r#"
#include <stdint.h>
#include <time.h>
volatile uint64_t sink;
__attribute__((noinline)) void kiln_otlp_hot_spin(void) {
  for (uint64_t i = 0; i < 2000000; i++) sink += i * i;
}
int main(void) {
  time_t end = time(0) + 8;
  while (time(0) < end) kiln_otlp_hot_spin();
  return 0;
}
"#;

fn probee() -> Option<PathBuf> {
    let tools = std::env::var_os("KILN_TOOLS_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp/kiln-tools"), PathBuf::from);
    let path = tools.join("profile-bee/bin/probee");
    path.is_file().then_some(path)
}

fn tracefs_ready() -> bool {
    if std::path::Path::new("/sys/kernel/tracing/events").is_dir() {
        return true;
    }
    Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn profile_bee_exports_a_hot_function_that_kiln_shows() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: profile-bee needs root for eBPF; run as root (./kiln-dev test does)"
        );
        return;
    }
    let Some(probee) = probee() else {
        missing::<()>("profile-bee (cargo install profile-bee --features otlp)");
        return;
    };
    if !tracefs_ready() {
        missing::<()>("tracefs at /sys/kernel/tracing");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let source = work.path().join("hot.c");
    let binary = work.path().join("hot");
    std::fs::write(&source, HOT_PROGRAM).unwrap();
    let compiled = Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&binary)
        .arg(&source)
        .status();
    if !compiled.is_ok_and(|s| s.success()) {
        missing::<()>("a C compiler (cc)");
        return;
    }

    let store = StoreProcess::start(KILN_STORE, &[]);
    let output = Command::new(&probee)
        .arg("--otlp-endpoint")
        .arg(store.addr.to_string())
        .args([
            "--otlp-insecure",
            "--otlp-service-name",
            SERVICE,
            "-t",
            "5000",
            "--",
        ])
        .arg(&binary)
        .output()
        .expect("run profile-bee");
    assert!(
        output.status.success(),
        "profile-bee failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );

    let types = get(store.addr, "/api/v1/profile-types").json();
    let type_id = types["profile_types"]
        .as_array()
        .and_then(|t| t.first())
        .and_then(|t| t["id"].as_str())
        .unwrap_or_else(|| panic!("nothing stored: {types}"))
        .to_owned();
    let query = format!("{type_id}{{service_name=\"{SERVICE}\"}}");
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={}&from=now-1h", enc(&query)),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    let names = flamegraph_names(&json);
    assert!(
        names.iter().any(|n| n == HOT_FUNCTION),
        "{HOT_FUNCTION} missing from {names:?}"
    );
    assert!(json["total"].as_i64().unwrap_or(0) > 0, "{json}");
    let metrics = get(store.addr, "/metrics").text();
    assert!(
        metrics.contains("kiln_otlp_export_requests_total{revision="),
        "{metrics}"
    );
}
