//! A replica whose peer cannot be reached answers partial, and soon: what
//! e2e check 8d found with the writer's pod deleted. While the replaced
//! pod's name still resolved to its dead address (30 s in that cluster),
//! every query at the others waited three quarters of the query timeout
//! on the connect (22.5 s of 30 s, twice for a query that resolves a short
//! profile type, 45 s in all), and a short type that only the writer's
//! data had was refused with 400, as if no replica held it.
//!
//! The dead address here is [`SilentAddress`]: connects to it hang, as they
//! do toward a pod that is gone, not refused.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kiln_testkit::http::{HttpResponse, enc, free_port, get, http};
use kiln_testkit::silent_address::SilentAddress;
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// Far below the query timeout (30 s by default), far above a loopback
/// connect, so the two cases cannot be mistaken for each other.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A store named `name` on `addr` whose peers are `peers` (`name=addr`).
fn replica(name: &str, addr: SocketAddr, peers: &[(&str, SocketAddr)]) -> StoreProcess {
    let peers: Vec<String> = std::iter::once((name, addr))
        .chain(peers.iter().copied())
        .map(|(name, addr)| format!("{name}=http://{addr}"))
        .collect();
    let connect_timeout = format!("{}s", CONNECT_TIMEOUT.as_secs());
    StoreProcess::start_on(
        KILN_STORE,
        addr,
        tempfile::tempdir().expect("data dir"),
        &[
            "--replica",
            name,
            "--peers",
            &peers.join(","),
            "--peer-connect-timeout",
            &connect_timeout,
        ],
        &[],
    )
}

fn ingest(store: SocketAddr, app: &str) {
    let response = http(
        store,
        "POST",
        &format!("/ingest?name={app}.cpu&from=now-10s&until=now&sampleRate=100"),
        &[],
        b"main;work 7",
    )
    .expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
}

/// A flame graph of `selector` over the last hour, and how long it took.
fn flamegraph(store: SocketAddr, selector: &str) -> (HttpResponse, Duration) {
    let started = Instant::now();
    let response = get(
        store,
        &format!("/api/v1/flamegraph?query={}&from=now-1h", enc(selector)),
    );
    (response, started.elapsed())
}

#[test]
fn a_peer_whose_address_swallows_connects_makes_answers_partial_within_the_connect_timeout() {
    let dead = SilentAddress::new();
    let addr = free_port();
    let store = replica("r0", addr, &[("r1", dead.addr)]);
    ingest(store.addr, "local");

    // A short type is resolved (asking the peers once) and merged (asking
    // again): the first ask waits out the connect timeout, the second
    // skips the address that just swallowed a connect.
    let (first, took) = flamegraph(addr, r#"process_cpu{service_name="local"}"#);
    eprintln!("first query with r1 silent: {:.2} s", took.as_secs_f64());
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["total"], 70_000_000);
    assert_eq!(first.header("kiln-partial"), Some("peers_unanswered=r1"));
    assert!(
        took >= CONNECT_TIMEOUT,
        "answered in {took:?}: did r1 answer?"
    );
    assert!(
        took < CONNECT_TIMEOUT * 2,
        "answered in {took:?}, the connect timeout is {CONNECT_TIMEOUT:?}"
    );

    // Within the window the address is not tried again.
    let (second, took) = flamegraph(addr, r#"process_cpu{service_name="local"}"#);
    eprintln!("second query with r1 silent: {:.2} s", took.as_secs_f64());
    assert_eq!(second.header("kiln-partial"), Some("peers_unanswered=r1"));
    assert_eq!(second.json()["total"], 70_000_000);
    assert!(took < CONNECT_TIMEOUT, "answered in {took:?}");
    assert!(
        store.log().contains("peer did not answer a query"),
        "{}",
        store.log()
    );
}
