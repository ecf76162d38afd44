//! The second hostile suite: the APIs that came after the first one
//! (Pyroscope's querier over Connect, OTLP, per-series WriteRaw and Push)
//! and the bodies that reach them. Each test starts the real `kiln-store`
//! in a memory cgroup as large as its `--memory-budget`, sends one attack
//! (a handful of requests, sometimes in parallel), and meanwhile a
//! well-behaved client keeps ingesting and querying.
//!
//! Every attack here is small on the wire and large once decoded, expanded
//! or held: a gzipped body of 16M JSON zeros, a stack of 16M frames built
//! from 30 KB of pprof, 8M stack indices cloned for each of 200 samples,
//! 16M empty series, a million `groupBy` labels, bodies that trickle in for
//! as long as the server lets them. A store that any pod can reach must
//! answer each with a refusal (or, for a flame graph, a trimmed tree) and
//! keep serving everyone else.
//!
//! Asserted: the cgroup saw no OOM kill, the store is alive, each hostile
//! request was answered as expected, and every request of the good client
//! succeeded, its writes all readable afterwards. Printed, never asserted:
//! the good client's latencies and the store's peak memory, in a table
//! that grows by a row per attack.

mod deep_stacks;
mod idle_connections;
mod otlp_stacks;
mod outer_messages;
mod querier_bodies;
mod query_work;
mod series_churn;
mod slow_bodies;

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln_testkit::clock::{now_ms, now_s};
use kiln_testkit::http::{HttpResponse, enc, http, parse_response};
use kiln_testkit::memory_cgroup::{LimitedCgroup, status_kib};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");
/// The store's memory budget and its cgroup's limit: going over the budget
/// is an OOM kill this suite sees.
const BUDGET: u64 = 192 << 20;
/// How long a hostile request may take to be answered; past it, it counts
/// as unanswered (a store busy with it for minutes has not refused it).
const HOSTILE_ANSWER_WITHIN: Duration = Duration::from_secs(120);
/// How long the good client goes on after the attack's last answer.
const SETTLE: Duration = Duration::from_secs(2);
/// Between two rounds of the good client.
const GOOD_CLIENT_PAUSE: Duration = Duration::from_millis(200);

/// One store at a time: the attacks measure memory, and two stores in
/// flight would share the machine's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// A row per attack run so far in this process, printed after each.
static TABLE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What a hostile request must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// A client error: 4xx over HTTP, a client-error code over gRPC.
    Refused,
    /// A 200 or a client error: a tree query is trimmed to its node budget,
    /// an export that cannot be trimmed (folded stacks) may be refused as
    /// too large, and a range the deep stack never entered holds no such
    /// profile type; none of them may fail the store.
    ServedOrRefused,
    /// A 200: a well-formed request the attack must not cost its writer.
    Served,
}

/// How the store answered a hostile request.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Http {
        status: u16,
        excerpt: String,
    },
    Grpc {
        code: tonic::Code,
        message: String,
    },
    /// No answer: the connection failed, was closed or timed out.
    Nothing(String),
}

impl Answer {
    pub(crate) fn from_http(result: std::io::Result<HttpResponse>) -> Self {
        match result {
            Ok(response) => Answer::Http {
                status: response.status,
                excerpt: excerpt(&response.text()),
            },
            Err(err) => Answer::Nothing(err.to_string()),
        }
    }

    fn meets(&self, expect: Expect) -> bool {
        let refused = match self {
            Answer::Http { status, .. } => (400..500).contains(status),
            Answer::Grpc { code, .. } => matches!(
                code,
                tonic::Code::InvalidArgument
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::FailedPrecondition
                    | tonic::Code::OutOfRange
            ),
            Answer::Nothing(_) => false,
        };
        let served = matches!(self, Answer::Http { status: 200, .. })
            || matches!(
                self,
                Answer::Grpc {
                    code: tonic::Code::Ok,
                    ..
                }
            );
        match expect {
            Expect::Refused => refused,
            Expect::ServedOrRefused => served || refused,
            Expect::Served => served,
        }
    }

    fn short(&self) -> String {
        match self {
            Answer::Http { status, .. } => status.to_string(),
            Answer::Grpc { code, .. } => format!("{code:?}"),
            Answer::Nothing(_) => "none".to_owned(),
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Http { status, excerpt } => write!(f, "HTTP {status}: {excerpt}"),
            Answer::Grpc { code, message } => {
                write!(f, "gRPC {code:?}: {}", excerpt(message))
            }
            Answer::Nothing(why) => write!(f, "no answer: {why}"),
        }
    }
}

/// The first 200 characters of a reply, on one line.
fn excerpt(text: &str) -> String {
    text.chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// One hostile request and its answer.
#[derive(Debug)]
pub(crate) struct Hostile {
    pub(crate) what: String,
    pub(crate) expect: Expect,
    pub(crate) answer: Answer,
    pub(crate) took: Duration,
}

impl Hostile {
    /// Sends one HTTP request and records how it was answered.
    pub(crate) fn http(
        what: impl Into<String>,
        expect: Expect,
        addr: SocketAddr,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Self {
        let started = Instant::now();
        let answer = Answer::from_http(send_reading(addr, method, target, headers, body));
        Hostile {
            what: what.into(),
            expect,
            answer,
            took: started.elapsed(),
        }
    }
}

/// Sends one request while reading the answer on a second handle of the
/// connection. A store may refuse a large body from its headers or its
/// first bytes and close the connection while the rest is still being
/// written; reading only after writing would lose that answer to a reset.
fn send_reading(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(HOSTILE_ANSWER_WITHIN))?;
    stream.set_write_timeout(Some(HOSTILE_ANSWER_WITHIN))?;
    let mut reader = stream.try_clone()?;
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    head.push_str("\r\n");
    std::thread::scope(|scope| {
        let read = scope.spawn(move || {
            let mut raw = Vec::new();
            let result = reader.read_to_end(&mut raw);
            (raw, result)
        });
        // A write the store cut short is its answer to read, not an error.
        let _ = stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body));
        let (raw, result) = read.join().expect("reader thread");
        match (parse_response(&raw), result) {
            (Ok(response), _) => Ok(response),
            (Err(_), Err(err)) => Err(err),
            (Err(err), Ok(_)) => Err(err),
        }
    })
}

/// What the good client saw while an attack ran.
#[derive(Debug, Default)]
struct GoodClient {
    ingest: Vec<Duration>,
    query: Vec<Duration>,
    failures: Vec<String>,
    /// Writes the store acknowledged; each is 7 samples of 10 ms.
    acknowledged: i64,
}

/// The good client's folded profile, 7 samples of `main;work`.
fn good_ingest(addr: SocketAddr) -> std::io::Result<HttpResponse> {
    let target = format!(
        "/ingest?name=good.cpu&format=folded&from={}&until={}",
        now_s() - 10,
        now_s()
    );
    http(addr, "POST", &target, &[], b"main;work 7\n")
}

fn good_query(addr: SocketAddr) -> std::io::Result<HttpResponse> {
    let query = format!(
        "/api/v1/flamegraph?query={}&from=now-1h",
        enc("process_cpu{service_name=\"good\"}")
    );
    http(addr, "GET", &query, &[], b"")
}

/// Ingests and queries in rounds until `stop`, at least once.
fn good_client(addr: SocketAddr, stop: &AtomicBool) -> GoodClient {
    let mut seen = GoodClient::default();
    // A dead store fails every round: the first few say enough.
    let fail = |seen: &mut GoodClient, what: &str, answer: Answer| {
        if seen.failures.len() < 5 {
            seen.failures.push(format!("{what}: {answer}"));
        }
    };
    loop {
        let started = Instant::now();
        match good_ingest(addr) {
            Ok(response) if response.status == 200 => {
                seen.ingest.push(started.elapsed());
                seen.acknowledged += 1;
            }
            other => fail(&mut seen, "ingest", Answer::from_http(other)),
        }
        let started = Instant::now();
        match good_query(addr) {
            Ok(response) if response.status == 200 => seen.query.push(started.elapsed()),
            other => fail(&mut seen, "query", Answer::from_http(other)),
        }
        if stop.load(Ordering::Relaxed) {
            return seen;
        }
        std::thread::sleep(GOOD_CLIENT_PAUSE);
    }
}

/// Median and maximum, in ms.
fn latencies(times: &[Duration]) -> String {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    match (ms.get(ms.len() / 2), ms.last()) {
        (Some(median), Some(max)) => format!("{median:.0}/{max:.0} ms"),
        _ => "-".to_owned(),
    }
}

/// A fresh store in its own memory cgroup for one attack. The store is
/// declared first so that it is killed before its group is removed.
pub(crate) struct Attack {
    name: &'static str,
    store: StoreProcess,
    cgroup: LimitedCgroup,
    _one_at_a_time: MutexGuard<'static, ()>,
}

impl Attack {
    /// A store with the suite's budget, or `None` (after a visible skip,
    /// or a failure under CI) without a memory cgroup.
    pub(crate) fn start(name: &'static str) -> Option<Self> {
        Self::start_with_flags(name, &[])
    }

    /// As [`Attack::start`], with more flags for the store.
    pub(crate) fn start_with_flags(name: &'static str, extra: &[&str]) -> Option<Self> {
        let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
        Self::start_in_with_flags(name, data_dir, extra)
    }

    /// As [`Attack::start`], on a data directory the test prepared.
    pub(crate) fn start_in(name: &'static str, data_dir: tempfile::TempDir) -> Option<Self> {
        Self::start_in_with_flags(name, data_dir, &[])
    }

    fn start_in_with_flags(
        name: &'static str,
        data_dir: tempfile::TempDir,
        extra: &[&str],
    ) -> Option<Self> {
        // A test that failed while holding the lock has its own failure;
        // the next attack still runs alone.
        let serial = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cgroup = LimitedCgroup::create_or_skip(BUDGET)?;
        let budget = format!("--memory-budget={BUDGET}");
        let mut flags = vec![budget.as_str()];
        // An attack may flush more often; by default the head stays.
        if !extra.iter().any(|f| f.starts_with("--flush-interval")) {
            flags.push("--flush-interval=1h");
        }
        flags.extend_from_slice(extra);
        let store = StoreProcess::start_in_cgroup(KILN_STORE, &cgroup, data_dir, &flags);
        Some(Attack {
            name,
            store,
            cgroup,
            _one_at_a_time: serial,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.store.addr
    }

    /// Runs `attack` while the good client ingests and queries, then
    /// checks the outcomes, prints the table and fails on any problem.
    #[track_caller]
    pub(crate) fn run(mut self, attack: impl FnOnce(SocketAddr) -> Vec<Hostile>) {
        let addr = self.store.addr;
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let (hostile, good) = std::thread::scope(|scope| {
            let good = scope.spawn(|| good_client(addr, &stop));
            let hostile = attack(addr);
            // What an attack set off may outlive its answer (work left
            // running, memory not yet given back): the good client goes on
            // a little longer.
            std::thread::sleep(SETTLE);
            stop.store(true, Ordering::Relaxed);
            (hostile, good.join().expect("good client thread"))
        });
        let took = started.elapsed();
        self.judge(&hostile, &good, took);
    }

    #[track_caller]
    fn judge(&mut self, hostile: &[Hostile], good: &GoodClient, took: Duration) {
        let mut problems = Vec::new();
        let exited = self.store.exited();
        if let Some(status) = exited {
            problems.push(format!("kiln-store is not alive: {status}"));
        }
        let oom_kills = self.cgroup.oom_kills();
        if oom_kills > 0 {
            problems.push(format!("{oom_kills} OOM kill(s) in the store's cgroup"));
        }
        for h in hostile {
            if !h.answer.meets(h.expect) {
                problems.push(format!(
                    "{}: expected {:?}, got {} (after {:.1} s)",
                    h.what,
                    h.expect,
                    h.answer,
                    h.took.as_secs_f64()
                ));
            }
        }
        for failure in &good.failures {
            problems.push(format!("the good client failed: {failure}"));
        }
        // Every write the store acknowledged is readable, attack or not.
        if exited.is_none() && good.failures.is_empty() {
            match good_query(self.store.addr) {
                Ok(response) if response.status == 200 => {
                    let total = response.json()["total"].as_i64();
                    if total != Some(70_000_000 * good.acknowledged) {
                        problems.push(format!(
                            "{} good writes acknowledged, the flame graph's total is {total:?}",
                            good.acknowledged
                        ));
                    }
                }
                other => problems.push(format!(
                    "the good client's final query: {}",
                    Answer::from_http(other)
                )),
            }
        }
        let rss = self
            .store
            .pid()
            .filter(|_| exited.is_none())
            .and_then(|pid| status_kib(pid, "VmHWM:"))
            .map_or("-".to_owned(), |kib| format!("{} MiB", kib >> 10));
        let peak = self
            .cgroup
            .peak_bytes()
            .map_or("-".to_owned(), |bytes| format!("{} MiB", bytes >> 20));
        // Alike answers counted, in the order they first came: "63x400,1x429".
        let mut answers: Vec<(String, usize)> = Vec::new();
        for h in hostile {
            let short = h.answer.short();
            match answers.iter_mut().find(|(seen, _)| *seen == short) {
                Some((_, count)) => *count += 1,
                None => answers.push((short, 1)),
            }
        }
        let answers: Vec<String> = answers
            .iter()
            .map(|(short, count)| format!("{count}x{short}"))
            .collect();
        let row = format!(
            "{:<46} {:<5} {:<24} {:>9} {:>12} {:>4} {:>6} {:>4} {:>14} {:>14} {:>5.0} s",
            self.name,
            if problems.is_empty() { "held" } else { "FAIL" },
            answers.join(","),
            rss,
            peak,
            oom_kills,
            if exited.is_none() { "yes" } else { "no" },
            good.ingest.len(),
            latencies(&good.ingest),
            latencies(&good.query),
            took.as_secs_f64()
        );
        let mut report = String::new();
        for h in hostile {
            let _ = writeln!(
                report,
                "  {}: {} in {:.1} s",
                h.what,
                h.answer,
                h.took.as_secs_f64()
            );
        }
        for problem in &problems {
            let _ = writeln!(report, "  PROBLEM: {problem}");
        }
        print_table(self.name, &report, row);
        // The store's log comes with the failure (its guard prints it).
        assert!(
            problems.is_empty(),
            "{}: {}",
            self.name,
            problems.join("\n")
        );
    }
}

/// Prints this attack's requests and the table of every attack so far
/// where a person running `cargo test` sees it (libtest keeps `eprintln!`
/// of passing tests to itself).
fn print_table(name: &str, report: &str, row: String) {
    let mut table = TABLE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    table.push(row);
    let mut text = format!("\n{name}:\n{report}");
    let _ = writeln!(
        text,
        "{:<46} {:<5} {:<24} {:>9} {:>12} {:>4} {:>6} {:>4} {:>14} {:>14} {:>7}",
        "attack",
        "held",
        "hostile answers",
        "VmHWM",
        "cgroup peak",
        "OOM",
        "alive",
        "good",
        "ingest p50/max",
        "query p50/max",
        "took"
    );
    for row in table.iter() {
        let _ = writeln!(text, "{row}");
    }
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Now and an hour ago in unix ms, a range that holds every profile a test
/// wrote.
pub(crate) fn last_hour_ms() -> (i64, i64) {
    let now = now_ms();
    (now - 3_600_000, now)
}
