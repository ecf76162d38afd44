//! Scraping pprof endpoints (issue 52), without privileges: the real agent
//! in host mode (`--scrape` alone, no BPF) against a real Go program with
//! `net/http/pprof`, shipped to a real `kiln-store` (also one that is
//! killed and restarted while the agent ships, issue 50); and against
//! hostile endpoints served by this test.

mod go_program;
mod hostile_endpoints;
mod store_restarts;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kiln_testkit::http::{enc, get, json_int64};
use kiln_testkit::process::KillOnDrop;

const AGENT: &str = env!("CARGO_BIN_EXE_kiln-agent");

/// The Go program these tests scrape (blocks to allocate, goroutines to park).
fn go_program_source() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/pprof_target.go")
}

/// The Go program of [`go_program_source`], built and running, once it
/// has said where it listens and how many goroutines it runs.
struct GoTarget {
    _process: KillOnDrop,
    /// What it prints from then on, as it comes.
    lines: mpsc::Receiver<String>,
    /// `host:port` of its `/debug/pprof` endpoints.
    address: String,
    /// Goroutines it counted when it was ready.
    goroutines: i64,
}

impl GoTarget {
    /// Builds the program in `dir` and starts it to allocate `blocks` of
    /// 64 KiB in `main.allocateKnown` and park `parked` goroutines; `None`
    /// (a visible skip, a failure under CI) where Go is missing.
    fn start(dir: &Path, blocks: u64, parked: i64) -> Option<Self> {
        let program = kiln_testkit::go_programs::build(&go_program_source(), dir, "pprof_target")?;
        let mut process = KillOnDrop(
            Command::new(&program)
                .args([blocks.to_string(), parked.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("the Go program starts"),
        );
        let lines = lines_of(&mut process.0);
        let address = wait_for_line(&lines, "listening ", Duration::from_secs(30));
        let goroutines = wait_for_line(&lines, "goroutines ", Duration::from_secs(30))
            .parse()
            .expect("a count");
        Some(Self {
            _process: process,
            lines,
            address,
            goroutines,
        })
    }
}

/// The lines the program prints, as they come.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

#[track_caller]
fn wait_for_line(lines: &mpsc::Receiver<String>, prefix: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with(prefix) => {
                return line[prefix.len()..].trim().to_owned();
            }
            Ok(_) => {}
            Err(error) => panic!("no {prefix:?} line from the program: {error}"),
        }
    }
}

/// `go tool pprof -raw` reads `bytes` (what the store exported).
#[track_caller]
fn go_pprof_reads(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(format!("{name}.pb.gz"));
    std::fs::write(&path, bytes).expect("write export");
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&path)
        .env("HOME", dir)
        .output()
        .expect("go tool pprof runs");
    assert!(
        out.status.success(),
        "go tool pprof cannot read the {name} export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `column` (`flat` or `cumulative`) of `function` in the store's top
/// table for `query` over the last ten minutes, and the table as text.
#[track_caller]
fn top_value(
    store: SocketAddr,
    query: &str,
    function: &str,
    column: &str,
) -> (Option<i64>, String) {
    let top = get(
        store,
        &format!(
            "/api/v1/top?query={}&from=now-10m&to=now&limit=1000",
            enc(query)
        ),
    );
    assert_eq!(top.status, 200, "{}", top.text());
    let top = top.json();
    let flat = top["top"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|row| row["name"] == function)
        .map(|row| json_int64(&row[column]));
    (flat, top.to_string())
}

/// The value of `name{label}` in Prometheus text.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}
