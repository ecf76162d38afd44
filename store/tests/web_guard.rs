//! A web page the user visits must not write into, or read from, a store
//! on the user's loopback, by a cross-site request or by rebinding a DNS
//! name to 127.0.0.1. Against the real binary on loopback: a cross-site
//! write is refused, a DNS-rebound name is refused, well-behaved clients
//! pass, and every response forbids framing and sniffing and carries the
//! UI's CSP.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kiln_testkit::http::http;
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// One raw HTTP/1.1 request with exactly these headers; returns the status
/// and the response text.
fn raw(
    store: &StoreProcess,
    method: &str,
    target: &str,
    headers: &[&str],
    body: &[u8],
) -> (u16, String) {
    let mut stream = TcpStream::connect(store.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut head = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\n");
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

const FOLDED: &[u8] = b"main;work 7\n";

#[test]
fn a_browser_page_of_another_site_cannot_write_and_a_rebound_name_cannot_read() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let host = format!("Host: {}", store.addr);
    let ingest = "/ingest?name=guard.cpu&format=folded";

    let (status, text) = raw(
        &store,
        "POST",
        ingest,
        &[&host, "Origin: https://evil.example"],
        FOLDED,
    );
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("cross_origin_write"), "{text}");

    let same_origin = format!("Origin: http://{}", store.addr);
    let (status, text) = raw(&store, "POST", ingest, &[&host, &same_origin], FOLDED);
    assert_eq!(status, 200, "the UI's own origin may write: {text}");
    let (status, text) = raw(&store, "POST", ingest, &[&host], FOLDED);
    assert_eq!(status, 200, "clients send no Origin: {text}");

    let rebound = format!("Host: rebound.evil.example:{}", store.addr.port());
    let (status, text) = raw(&store, "GET", "/api/v1/profile-types", &[&rebound], b"");
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("host_not_allowed"), "{text}");
    let localhost = format!("Host: localhost:{}", store.addr.port());
    let (status, text) = raw(&store, "GET", "/api/v1/profile-types", &[&localhost], b"");
    assert_eq!(status, 200, "{text}");

    // Both writes above were stored, and nothing of the refused one.
    let query = "/api/v1/flamegraph?query=process_cpu%7Bservice_name%3D%22guard%22%7D&from=now-1h";
    let response = http(store.addr, "GET", query, &[], b"").expect("query");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["total"].as_i64(), Some(2 * 70_000_000));
}

#[test]
fn every_response_forbids_framing_and_sniffing_and_the_ui_gets_a_csp() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    for path in ["/", "/api/v1/profile-types", "/no-such-path"] {
        let response = http(store.addr, "GET", path, &[], b"").expect("request");
        assert_eq!(response.header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(
            response.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        let csp = response
            .header("content-security-policy")
            .unwrap_or_default();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
            "{path}: {csp}"
        );
    }
}
