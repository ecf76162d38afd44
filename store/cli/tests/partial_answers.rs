//! `kiln` says when the store's answer is partial (`Kiln-Partial`), in
//! every output format and command, and with `--fail-on-partial`
//! (`KILN_FAIL_ON_PARTIAL`) exits 4 after writing the answer. The store is
//! a real `kiln-store` whose one peer refuses connections (a replica that
//! is down), so every answer it gives is `peers_unanswered=r1`.

use std::process::{Command, Output};
use std::sync::OnceLock;

use kiln_testkit::binaries::built_binary;
use kiln_testkit::clock::now_s;
use kiln_testkit::http::{free_port, http};
use kiln_testkit::store_process::StoreProcess;

const WARNING: &str = "partial (Kiln-Partial: peers_unanswered=r1)";

/// Runs `kiln` over the last hour, fixed as unix seconds, so that two runs
/// answer the same bytes.
fn kiln(store: &StoreProcess, args: &[&str], envs: &[(&str, &str)]) -> Output {
    static NOW: OnceLock<i64> = OnceLock::new();
    let now = *NOW.get_or_init(now_s);
    let range = [
        ("KILN_FROM", (now - 3600).to_string()),
        ("KILN_TO", (now + 60).to_string()),
    ];
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--store")
        .arg(store.url())
        .args(args)
        .env_remove("KILN_OUTPUT")
        .env_remove("KILN_FORMAT")
        .env_remove("KILN_FAIL_ON_PARTIAL")
        .envs(range)
        .envs(envs.iter().copied())
        .output()
        .expect("kiln runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A store holding one profile of `app`, whose peer `r1` is down when
/// `with_down_peer`.
fn store(with_down_peer: bool) -> Option<StoreProcess> {
    let binary = built_binary("kiln-store", "KILN_STORE_BIN")?;
    let addr = free_port();
    // Bound and let go: nothing listens there, so r1 refuses at once.
    let down = free_port();
    let peers = format!("r0=http://{addr},r1=http://{down}");
    let args: &[&str] = if with_down_peer {
        &["--replica", "r0", "--peers", &peers]
    } else {
        &["--replica", "r0"]
    };
    let store = StoreProcess::start_on(
        &binary,
        addr,
        tempfile::tempdir().expect("data dir"),
        args,
        &[],
    );
    let response = http(
        store.addr,
        "POST",
        "/ingest?name=app.cpu&from=now-10s&until=now&sampleRate=100",
        &[],
        b"main;work 7",
    )
    .expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
    Some(store)
}

#[test]
fn every_format_and_command_warns_of_a_partial_answer_and_can_fail_on_it() {
    let Some(store) = store(true) else {
        return;
    };
    let out = tempfile::tempdir().expect("output dir");
    let path = |name: &str| out.path().join(name).to_str().expect("utf-8").to_owned();
    let selector = r#"process_cpu{service_name="app"}"#;
    let runs: Vec<Vec<String>> = [
        vec!["query", selector],
        vec!["query", "--format", "json", selector],
        vec!["query", "--format", "folded", selector],
        vec!["query", "-o", &path("flame.svg"), selector],
        vec!["query", "-o", &path("profile.pb.gz"), selector],
        vec!["diff", selector],
        vec!["diff", "-o", &path("diff.svg"), selector],
        vec!["types"],
        vec!["labels"],
        vec!["labels", "service_name"],
        vec!["series", selector],
    ]
    .into_iter()
    .map(|args| args.into_iter().map(str::to_owned).collect())
    .collect();
    for args in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = kiln(&store, &args, &[]);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(WARNING),
            "{args:?}: {}",
            stderr(&output)
        );
        // The answer itself is still written: what the store could read.
        let failing = kiln(&store, &[&["--fail-on-partial"], &args[..]].concat(), &[]);
        assert_eq!(
            failing.status.code(),
            Some(4),
            "{args:?}: {}",
            stderr(&failing)
        );
        assert!(stderr(&failing).contains(WARNING), "{args:?}");
        assert_eq!(failing.stdout, output.stdout, "{args:?}");
    }
    let table = kiln(&store, &["query", selector], &[]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("work"),
        "{}",
        String::from_utf8_lossy(&table.stdout)
    );
    assert!(std::fs::metadata(path("profile.pb.gz")).is_ok_and(|m| m.len() > 0));
    let by_env = kiln(
        &store,
        &["query", selector],
        &[("KILN_FAIL_ON_PARTIAL", "true")],
    );
    assert_eq!(by_env.status.code(), Some(4), "{}", stderr(&by_env));
}

#[test]
fn a_complete_answer_neither_warns_nor_fails() {
    let Some(store) = store(false) else {
        return;
    };
    let output = kiln(
        &store,
        &[
            "--fail-on-partial",
            "query",
            r#"process_cpu{service_name="app"}"#,
        ],
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains("partial"), "{}", stderr(&output));
}
