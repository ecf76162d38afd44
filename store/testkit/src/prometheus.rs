//! A real Prometheus server scraping a store, for tests that check what
//! Kiln exposes to Prometheus against what Prometheus itself stores.
//!
//! The server is built from source, pinned by
//! `programs/prometheus_server/go.mod` (a `tool` directive on
//! `github.com/prometheus/prometheus/cmd/prometheus`), the way the
//! cluster's Go tools are built. The `remove_all_sd` tag leaves out the
//! cloud service discoveries, which a test's `static_configs` do not need
//! and which are most of the build.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::binaries::target_dir;
use crate::http::{enc, free_port, get};
use crate::process::KillOnDrop;
use crate::real_inputs::build_go_package;

/// How long Prometheus may take to answer `/-/ready`: it replays an empty
/// WAL, so seconds, but CI machines are shared.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The job name of the one scrape config; it is the `job` label of every
/// series scraped.
pub const JOB: &str = "kiln";

/// The Prometheus server binary, built once per test process into
/// `<target>/tmp/prometheus_server/prometheus` (later processes relink
/// nothing: `go build` leaves an up-to-date binary alone). `None` (after
/// the house rule) without Go or the module proxy.
pub fn prometheus_binary() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = target_dir().join("tmp").join("prometheus_server");
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let binary = dir.join("prometheus");
            build_go_package(
                "prometheus_server",
                "github.com/prometheus/prometheus/cmd/prometheus",
                &["remove_all_sd"],
                &binary,
            )?;
            Some(binary)
        })
        .clone()
}

/// What Prometheus scrapes: `http://<addr><metrics_path>`, with a bearer
/// token when the endpoint wants one.
#[derive(Debug, Clone)]
pub struct ScrapeTarget<'a> {
    pub addr: SocketAddr,
    pub metrics_path: &'a str,
    pub bearer_token: Option<&'a str>,
}

/// One element of an instant query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PromSample {
    /// The series' labels, `__name__` included when the query kept it.
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch.
    pub timestamp: f64,
    pub value: f64,
}

/// A running Prometheus scraping one target every second; killed on drop.
#[derive(Debug)]
pub struct PrometheusProcess {
    child: KillOnDrop,
    pub addr: SocketAddr,
    // Holds the config, the TSDB and the log for as long as the server runs.
    dir: tempfile::TempDir,
}

impl PrometheusProcess {
    /// Writes a config scraping `target` every second, starts `binary` on a
    /// free loopback port with a fresh TSDB, and waits for `/-/ready`.
    #[track_caller]
    pub fn start(binary: &Path, target: &ScrapeTarget<'_>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for Prometheus");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_yaml(target)).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let addr = free_port();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        let mut prometheus = Self {
            child: KillOnDrop(child),
            addr,
            dir,
        };
        prometheus.wait_ready();
        prometheus
    }

    #[track_caller]
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.0.try_wait() {
                panic!("prometheus exited early: {status}\n{}", self.log());
            }
            if crate::http::http(self.addr, "GET", "/-/ready", &[], b"")
                .is_ok_and(|response| response.status == 200)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "prometheus on {} was not ready in time:\n{}",
            self.addr,
            self.log()
        );
    }

    /// What Prometheus wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// Evaluates `promql` through `/api/v1/query` at `time` (seconds since
    /// the epoch; `None`: now). A scalar answers one sample without labels.
    #[track_caller]
    pub fn query(&self, promql: &str, time: Option<f64>) -> Vec<PromSample> {
        let mut target = format!("/api/v1/query?query={}", enc(promql));
        if let Some(time) = time {
            target.push_str(&format!("&time={time:.3}"));
        }
        let response = get(self.addr, &target);
        let body = response.json();
        assert!(
            response.status == 200 && body["status"] == "success",
            "prometheus query {promql:?}: {} {}",
            response.status,
            response.text()
        );
        let data = &body["data"];
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|element| sample(&element["metric"], &element["value"]))
                .collect(),
            Some("scalar") => vec![sample(&serde_json::Value::Null, &data["result"])],
            other => panic!("prometheus query {promql:?} answered a {other:?}: {body}"),
        }
    }

    /// The one value `promql` has now; panics unless exactly one series
    /// answers.
    #[track_caller]
    pub fn query_one(&self, promql: &str) -> f64 {
        match self.query(promql, None).as_slice() {
            [one] => one.value,
            many => panic!("{promql:?} answered {} series: {many:?}", many.len()),
        }
    }

    /// Waits until Prometheus has stored a successful scrape of the target
    /// that started after `after` (seconds since the epoch), so that every
    /// change the target made before `after` is in the TSDB. Panics with
    /// the target's last error when none comes in `within`.
    #[track_caller]
    pub fn wait_for_scrape_after(&self, after: f64, within: Duration) {
        // `timestamp` gives a sample's own time only when its argument is
        // a plain selector (of anything else it gives the evaluation time),
        // so whether that scrape succeeded is a second query, at that time.
        let started = format!("timestamp(up{{job=\"{JOB}\"}})");
        let up = format!("up{{job=\"{JOB}\"}}");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            // A scrape's samples carry its start time, which Prometheus may
            // align to the schedule by a few milliseconds either way.
            let after_change = self
                .query(&started, None)
                .first()
                .map(|s| s.value)
                .filter(|&started| started > after + 0.05);
            if let Some(started) = after_change
                && self.query(&up, Some(started)).first().map(|s| s.value) == Some(1.0)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "no successful scrape started after {after:.3} within {} s; targets: {}\n{}",
            within.as_secs(),
            get(self.addr, "/api/v1/targets").text(),
            self.log()
        );
    }

    /// How many times the target was scraped (successfully or not) in the
    /// last hour.
    #[track_caller]
    pub fn scrapes(&self) -> u64 {
        let promql = format!("count_over_time(up{{job=\"{JOB}\"}}[1h])");
        self.query(&promql, None)
            .first()
            .map_or(0, |s| s.value as u64)
    }
}

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Captured by libtest and shown with the failing test only.
            eprintln!("prometheus on {} logged:\n{}", self.addr, self.log());
        }
    }
}

/// The config: one job, one static target, scraped and evaluated every
/// second. Strings are written as JSON strings, which YAML reads as its
/// own double-quoted strings.
fn config_yaml(target: &ScrapeTarget<'_>) -> String {
    let quote = |text: &str| serde_json::Value::from(text).to_string();
    let mut yaml = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n  - job_name: {job}\n    metrics_path: {path}\n    \
         static_configs:\n      - targets: [{addr}]\n",
        job = quote(JOB),
        path = quote(target.metrics_path),
        addr = quote(&target.addr.to_string()),
    );
    if let Some(token) = target.bearer_token {
        yaml.push_str(&format!(
            "    authorization:\n      type: Bearer\n      credentials: {}\n",
            quote(token)
        ));
    }
    yaml
}

/// A `[seconds, "value"]` pair with its series' labels.
#[track_caller]
fn sample(metric: &serde_json::Value, pair: &serde_json::Value) -> PromSample {
    let labels = metric
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect();
    let timestamp = pair[0].as_f64();
    let value = pair[1].as_str().and_then(|v| v.parse::<f64>().ok());
    match (timestamp, value) {
        (Some(timestamp), Some(value)) => PromSample {
            labels,
            timestamp,
            value,
        },
        _ => panic!("not a Prometheus [time, \"value\"] pair: {pair}"),
    }
}
