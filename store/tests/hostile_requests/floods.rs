//! The hostile suite's floods (issue 15): series cardinality, costly
//! queries and connections that hold the store's slots, run by
//! `main.rs` on its store after the single-request steps.
//! Loops are bounded in count and time; nothing asserts on durations but
//! the suite's own one-second check of the good client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::Suite;
use kiln_testkit::clock::now_s;
use kiln_testkit::http::{enc, http};

/// Series limits for the cardinality flood (the head is not cut during the suite: a cut
/// starts the counts again).
pub const SERIES_PER_NAMESPACE: usize = 64;
pub const SERIES_IN_ALL: usize = 160;
/// The heaviest `(\w..){..}` shape the selector parser still accepts
/// (its compiled size is under the 1 MiB limit).
const HEAVY_REGEX: &str = r"(\w{1,4}){1,5}";

/// `/ingest` of one folded profile as app `burst` with these labels.
fn burst_target(namespace: &str, pod: &str) -> String {
    format!(
        "/ingest?name={}&format=folded&from={}&until={}",
        enc(&format!("burst.cpu{{namespace={namespace},pod={pod}}}")),
        now_s() - 10,
        now_s()
    )
}

/// Sends `count` profiles from 8 clients at once, each naming the series
/// `(namespace, pod)` for its index; returns each one's status and reply.
fn burst(
    suite: &Suite,
    count: usize,
    series: impl Fn(usize) -> (String, String) + Sync,
) -> Vec<(String, String, u16, String)> {
    let clients = 8;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|client| {
                let series = &series;
                scope.spawn(move || {
                    (client..count)
                        .step_by(clients)
                        .map(|i| {
                            let (namespace, pod) = series(i);
                            let (status, text) =
                                suite.post(&burst_target(&namespace, &pod), &[], b"main;work 1\n");
                            (namespace, pod, status, text)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("burst client"))
            .collect()
    })
}

/// Cardinality: new series past the namespace and store-wide limits are refused;
/// series that exist still ingest, and other namespaces keep their room.
pub fn cardinality_burst(suite: &mut Suite) {
    let results = burst(suite, 2 * SERIES_PER_NAMESPACE, |i| {
        ("churn".to_owned(), format!("pod-{i}"))
    });
    let accepted: Vec<_> = results.iter().filter(|r| r.2 == 200).collect();
    for (_, pod, status, text) in &results {
        assert!(
            *status == 200
                || (*status == 400
                    && text.contains("too_many_series_in_namespace")
                    && text.contains("churn")
                    && text.contains("existing series still ingest")),
            "{pod}: {status} {text}"
        );
    }
    // Checked before the WAL append under the head's read lock, so clients
    // racing past the check can overshoot by at most the 8 in flight.
    assert!(
        (SERIES_PER_NAMESPACE..=SERIES_PER_NAMESPACE + 8).contains(&accepted.len()),
        "{} of {} new series in one namespace accepted",
        accepted.len(),
        results.len()
    );
    for (namespace, pod, ..) in &accepted {
        let (status, text) = suite.post(&burst_target(namespace, pod), &[], b"main;work 1\n");
        assert_eq!(status, 200, "existing series {pod}: {text}");
    }
    let (status, text) = suite.post(&burst_target("quiet", "pod-0"), &[], b"main;work 1\n");
    assert_eq!(status, 200, "another namespace still adds series: {text}");
    eprintln!(
        "cardinality: {} of {} new series in namespace churn accepted (limit {SERIES_PER_NAMESPACE})",
        accepted.len(),
        results.len()
    );
    suite.check_after("cardinality: 128 new series in one namespace limited to 64");

    // One new namespace per profile: only the store-wide limit applies.
    let results = burst(suite, SERIES_IN_ALL, |i| {
        (format!("wide-{i}"), "pod".to_owned())
    });
    let accepted: Vec<_> = results.iter().filter(|r| r.2 == 200).collect();
    let refused = results
        .iter()
        .filter(|r| r.2 == 400 && r.3.contains("too_many_series_in_store"))
        .count();
    assert_eq!(
        accepted.len() + refused,
        results.len(),
        "only the store-wide limit refuses: {results:?}"
    );
    assert!(
        !accepted.is_empty() && refused > 0,
        "{} accepted",
        accepted.len()
    );
    for (namespace, pod, ..) in &accepted {
        let (status, text) = suite.post(&burst_target(namespace, pod), &[], b"main;work 1\n");
        assert_eq!(status, 200, "existing series in {namespace}: {text}");
    }
    eprintln!(
        "cardinality: {} of {} new namespaces accepted before the store-wide limit of {SERIES_IN_ALL} series",
        accepted.len(),
        results.len()
    );
    suite.check_after("cardinality: new series past the store-wide limit");
}

/// Query cost: 256 heavy regex queries at once. Queries have their own slots, so
/// those over them are refused at once (429) and ingest is never starved;
/// each admitted one compiles its pattern once, not per head and block.
pub fn heavy_regex_queries(suite: &mut Suite) {
    let query = format!(
        "/api/v1/flamegraph?query={}&from=now-1h",
        enc(&format!(
            "process_cpu{{pod=~\"{}\"}}",
            HEAVY_REGEX.replace('\\', "\\\\")
        ))
    );
    let addr = suite.addr;
    let (statuses, during) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..256)
            .map(|_| scope.spawn(|| http(addr, "GET", &query, &[], b"")))
            .collect();
        // Meanwhile, a good ingest is served from the ingest slots.
        let during = suite.post(
            &format!(
                "/ingest?name=good.cpu&format=folded&from={}&until={}",
                now_s() - 10,
                now_s()
            ),
            &[],
            b"main;work 7\n",
        );
        let statuses: Vec<(u16, String)> = handles
            .into_iter()
            .map(|h| {
                let response = h.join().expect("query thread").expect("query answered");
                (response.status, response.text())
            })
            .collect();
        (statuses, during)
    });
    assert_eq!(during.0, 200, "ingest during the queries: {}", during.1);
    suite.good_ingests += 1;
    let answered = statuses.iter().filter(|s| s.0 == 200).count();
    for (status, text) in &statuses {
        assert!(
            *status == 200 || (*status == 429 && text.contains("query requests already in flight")),
            "{status}: {text}"
        );
    }
    assert!(answered > 0, "no heavy query was answered");
    eprintln!(
        "query cost: 256 heavy regex queries: {answered} answered, {} refused as overload",
        statuses.len() - answered
    );
    suite.check_after("query cost: 256 concurrent flame graphs with a heavy =~ pattern");
}

/// The value of an unlabelled gauge or counter line in `/metrics`.
fn metric(addr: SocketAddr, name: &str) -> u64 {
    let text = http(addr, "GET", "/metrics", &[], b"")
        .expect("metrics")
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Polls `/metrics` (100 ms apart, at most a minute) until `name` satisfies `ok`.
#[track_caller]
fn wait_for_metric(addr: SocketAddr, name: &str, ok: impl Fn(u64) -> bool) {
    for _ in 0..600 {
        if ok(metric(addr, name)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "{name} never reached the expected value (last {})",
        metric(addr, name)
    );
}

/// True once the server has closed `stream` (EOF or reset).
fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    stream
        .set_read_timeout(Some(Duration::from_millis(10)))
        .expect("read timeout");
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Slowloris: 300 connections hold partial requests: half an HTTP/1 head, half
/// three bytes (too few to tell HTTP/1 from HTTP/2). A good client is
/// served meanwhile; the store closes them all after its header timeout.
pub fn slowloris(suite: &mut Suite) {
    let open_before = metric(suite.addr, "kiln_open_connections");
    let mut attackers: Vec<TcpStream> = (0..300)
        .map(|i| {
            let mut stream = TcpStream::connect(suite.addr).expect("connect");
            let partial: &[u8] = if i % 2 == 0 {
                b"POST /ingest?name=slow.cpu HTTP/1.1\r\nHost: localhost\r\n"
            } else {
                b"POS"
            };
            stream.write_all(partial).expect("partial request");
            stream
        })
        .collect();
    let addr = suite.addr;
    wait_for_metric(addr, "kiln_open_connections", |open| open >= 300);
    suite.check_after("slowloris: during 300 slowloris connections");
    assert!(
        metric(addr, "kiln_open_connections") >= 300,
        "the attack was still on while the good client was served"
    );
    // The default --header-read-timeout is 10 s; bounded at a minute.
    for _ in 0..600 {
        attackers.retain_mut(|stream| !closed_by_server(stream));
        if attackers.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        attackers.is_empty(),
        "{} slowloris connections still open",
        attackers.len()
    );
    wait_for_metric(addr, "kiln_open_connections", |open| {
        open <= open_before + 1
    });
    suite.check_after("slowloris: after the store closed 300 slowloris connections");
}

/// Slowloris: slow bodies holding every ingest slot (--max-inflight, 256) make
/// ingest answer 429 at once, never queue; queries have their own slots.
pub fn ingest_flood_leaves_queries_alone(suite: &mut Suite) {
    let addr = suite.addr;
    let slow: Vec<TcpStream> = (0..256)
        .map(|_| {
            let mut stream = TcpStream::connect(addr).expect("connect");
            stream
                .write_all(
                    b"POST /ingest?name=slow.cpu&format=folded HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\nmain 1",
                )
                .expect("slow body");
            stream
        })
        .collect();
    wait_for_metric(addr, "kiln_inflight_requests", |n| n >= 256);
    let query = format!(
        "/api/v1/flamegraph?query={}&from=now-1h",
        enc("process_cpu{service_name=\"good\"}")
    );
    let response = http(addr, "GET", &query, &[], b"").expect("query");
    assert_eq!(
        response.status,
        200,
        "query during the flood: {}",
        response.text()
    );
    let (status, text) = suite.post("/ingest?name=good.cpu&format=folded", &[], b"main;work 7\n");
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("ingest requests already in flight"), "{text}");
    drop(slow);
    wait_for_metric(addr, "kiln_inflight_requests", |n| n == 0);
    suite.check_after("slowloris: 256 slow ingest bodies, then closed");
}
