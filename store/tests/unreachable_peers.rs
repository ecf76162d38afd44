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

use kiln_testkit::http::{HttpResponse, enc, free_port, get, ingest_folded};
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
    ingest_folded(store, app, b"main;work 7");
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

/// With the only writer's replica away, a replica that took no writes
/// knows no profile type of its data: a short type is answered empty and
/// partial, not refused as unknown.
#[test]
fn a_short_type_only_an_unanswered_peer_may_hold_is_answered_partial_not_refused() {
    let dead = SilentAddress::new();
    let addr = free_port();
    let _store = replica("r0", addr, &[("r1", dead.addr)]);
    for selector in ["process_cpu:cpu", r#"process_cpu{service_name="writer"}"#] {
        let (response, took) = flamegraph(addr, selector);
        eprintln!("{selector} with r1 silent: {:.2} s", took.as_secs_f64());
        assert_eq!(response.status, 200, "{selector}: {}", response.text());
        assert_eq!(response.json()["total"], 0, "{selector}");
        assert_eq!(
            response.header("kiln-partial"),
            Some("peers_unanswered=r1"),
            "{selector}"
        );
    }
    // Listings resolve the type the same way.
    let labels = get(
        addr,
        &format!("/api/v1/labels?query={}&from=now-1h", enc("process_cpu")),
    );
    assert_eq!(labels.status, 200, "{}", labels.text());
    assert_eq!(labels.header("kiln-partial"), Some("peers_unanswered=r1"));
}

/// With every peer answering, a short type is resolved from the peer's
/// data, and a type no replica holds is a clear 400; once the writer's
/// replica is gone, neither is refused, both are partial.
#[test]
fn a_short_type_is_resolved_by_a_peer_and_a_type_none_holds_is_refused_while_all_answer() {
    let (addr_0, addr_1) = (free_port(), free_port());
    let r0 = replica("r0", addr_0, &[("r1", addr_1)]);
    let r1 = replica("r1", addr_1, &[("r0", addr_0)]);
    ingest(r1.addr, "writer");

    let (resolved, _) = flamegraph(r0.addr, r#"process_cpu{service_name="writer"}"#);
    assert_eq!(resolved.status, 200, "{}", resolved.text());
    assert_eq!(resolved.json()["total"], 70_000_000);
    assert_eq!(resolved.header("kiln-partial"), None);
    let (unknown, _) = flamegraph(r0.addr, "memory:alloc_space");
    assert_eq!(unknown.status, 400, "{}", unknown.text());
    assert_eq!(unknown.json()["reason"], "selector_unknown_profile_type");
    assert!(
        unknown.text().contains("process_cpu:cpu:nanoseconds"),
        "the known types are listed: {}",
        unknown.text()
    );

    // r1 is gone, its head unflushed: its port now refuses.
    drop(r1);
    for selector in [
        r#"process_cpu{service_name="writer"}"#,
        "memory:alloc_space",
    ] {
        let (response, took) = flamegraph(r0.addr, selector);
        assert_eq!(response.status, 200, "{selector}: {}", response.text());
        assert_eq!(response.json()["total"], 0, "{selector}");
        assert_eq!(
            response.header("kiln-partial"),
            Some("peers_unanswered=r1"),
            "{selector}"
        );
        assert!(
            took < CONNECT_TIMEOUT,
            "{selector}: a refused connect took {took:?}"
        );
    }
}
