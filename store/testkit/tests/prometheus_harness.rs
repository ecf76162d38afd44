//! The Prometheus harness on its own, without a store: a real Prometheus
//! scrapes a counter this test serves (with a bearer token it checks), and
//! after each change a scrape that started later has stored the new value.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kiln_testkit::clock::now_ms;
use kiln_testkit::prometheus::{PrometheusProcess, ScrapeTarget, prometheus_binary};

const TOKEN: &str = "scrape-secret";

/// Serves `# TYPE harness_total counter` with `value`'s current value to
/// requests that carry [`TOKEN`], 401 to the rest.
fn serve_counter(listener: TcpListener, value: Arc<AtomicU64>) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let mut authorized = false;
        let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
            authorized |= line
                .to_ascii_lowercase()
                .starts_with(&format!("authorization: bearer {TOKEN}"));
            line.clear();
        }
        let (status, body) = if authorized {
            let v = value.load(Ordering::SeqCst);
            let body =
                format!("# TYPE harness_total counter\nharness_total{{service_name=\"a\"}} {v}\n");
            ("200 OK", body)
        } else {
            ("401 Unauthorized", String::new())
        };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

#[test]
fn prometheus_stores_what_it_scraped_after_each_change() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let value = Arc::new(AtomicU64::new(5));
    let served = Arc::clone(&value);
    std::thread::spawn(move || serve_counter(listener, served));

    let prometheus = PrometheusProcess::start(
        &binary,
        &ScrapeTarget {
            addr,
            metrics_path: "/metrics",
            bearer_token: Some(TOKEN),
        },
    );
    for expected in [5, 7_000_000_000_u64] {
        value.store(expected, Ordering::SeqCst);
        let changed = now_ms() as f64 / 1000.0;
        prometheus.wait_for_scrape_after(changed, Duration::from_secs(30));
        let scraped = prometheus.query_one("harness_total{service_name=\"a\"}");
        assert_eq!(scraped, expected as f64);
    }
    assert!(prometheus.scrapes() >= 2);
}
