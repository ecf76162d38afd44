//! The real binary layers its settings (defaults < `--config` file < environment < flags) and
//! takes tokens only from the environment, the config file or token files, never from flags,
//! which show in `/proc/*/cmdline` to every user and pod on the host, so a token
//! there would let anyone who can list processes write or read profiles.

use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kiln_testkit::http::{free_port, get, http};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// `kiln-store` with `args` and `envs` on a fresh data directory, expected to refuse its
/// configuration and exit before serving; a store still running after 30 s is killed and
/// fails the test.
fn refused_start(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln-store"))
        .arg("--listen")
        .arg(free_port().to_string())
        .arg("--data-dir")
        .arg(data_dir.path())
        .args(args)
        .env_remove("KILN_WRITE_TOKENS")
        .env_remove("KILN_READ_TOKENS")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kiln-store");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kiln-store {args:?} started instead of refusing its configuration");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect output")
}

fn status_with_token(store: &StoreProcess, method: &str, target: &str, token: &str) -> u16 {
    let header = format!("Bearer {token}");
    let body: &[u8] = if method == "POST" {
        b"main;work 3"
    } else {
        b""
    };
    http(
        store.addr,
        method,
        target,
        &[("Authorization", header.as_str())],
        body,
    )
    .expect("request")
    .status
}

#[test]
fn flags_beat_the_environment_which_beats_the_file() {
    let config_dir = tempfile::tempdir().expect("temp dir");
    let file_listen = free_port();
    let config = config_dir.path().join("kiln.toml");
    std::fs::write(
        &config,
        format!(
            "version = 1\n[server]\nlisten = \"{file_listen}\"\n\
             [auth]\nwrite_tokens = [\"file-writer\"]\nread_tokens = [\"file-reader\"]\n"
        ),
    )
    .expect("write config");
    // StoreProcess passes --listen, and waits for /readyz there.
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &["--config", config.to_str().expect("utf-8 path")],
        &[("KILN_WRITE_TOKENS", "env-writer")],
    );
    assert!(
        TcpStream::connect(file_listen).is_err(),
        "the --listen flag replaces the file's listen"
    );
    let ingest = "/ingest?name=app";
    assert_eq!(
        status_with_token(&store, "POST", ingest, "file-writer"),
        401
    );
    assert_eq!(
        status_with_token(&store, "POST", ingest, "env-writer"),
        200,
        "KILN_WRITE_TOKENS replaces the file's write tokens"
    );
    let types = "/api/v1/profile-types";
    assert_eq!(status_with_token(&store, "GET", types, "env-writer"), 401);
    assert_eq!(
        status_with_token(&store, "GET", types, "file-reader"),
        200,
        "the file's read tokens hold where nothing replaces them"
    );
}

#[test]
fn tokens_given_as_flags_are_refused() {
    for flag in ["--write-tokens", "--read-tokens"] {
        let output = refused_start(&[flag, "secret"], &[]);
        assert!(!output.status.success(), "{flag} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{stderr}");
    }
}

#[test]
fn an_empty_or_ambiguous_token_file_stops_the_store() {
    let token_dir = tempfile::tempdir().expect("temp dir");
    let empty = token_dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write token file");
    let empty = empty.to_str().expect("utf-8 path");
    let output = refused_start(&["--write-tokens-file", empty], &[]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("auth.write_tokens_file"), "{stderr}");

    let output = refused_start(&["--read-tokens-file", empty], &[("KILN_READ_TOKENS", "r")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not both"), "{stderr}");
}

/// The retention in effect is readable on `/metrics`, so a changed
/// `--retention` (the operator rolls the pod with new flags) can be checked
/// on the running store; the environment sets it like the flag.
#[test]
fn the_retention_in_effect_shows_in_metrics() {
    let gauge = |text: &str, name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .map(str::to_owned)
    };
    let store = StoreProcess::start(
        KILN_STORE,
        &["--retention", "3h", "--retention-bytes", "1073741824"],
    );
    let text = get(store.addr, "/metrics").text();
    assert_eq!(
        gauge(&text, "kiln_retention_seconds").as_deref(),
        Some("10800")
    );
    assert_eq!(
        gauge(&text, "kiln_retention_bytes").as_deref(),
        Some("1073741824")
    );
    drop(store);
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &[],
        &[("KILN_RETENTION", "2d")],
    );
    let text = get(store.addr, "/metrics").text();
    assert_eq!(
        gauge(&text, "kiln_retention_seconds").as_deref(),
        Some("172800")
    );
    assert_eq!(gauge(&text, "kiln_retention_bytes").as_deref(), Some("0"));
}
