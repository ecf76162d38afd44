//! `/metrics` and `/healthz` on the metrics address, served by axum over
//! hyper like the store's ports, under limits that keep a scraper, a probe
//! or a hostile client from holding the agent's memory or tasks:
//!
//! - at most [`MetricsServerLimits::max_connections`] connections are open;
//!   the accept loop waits at the cap, so further clients wait in the
//!   kernel's accept queue instead of costing memory here;
//! - one request per connection (no keep-alive), whose head must arrive
//!   within `header_read_timeout` and fit hyper's smallest read buffer
//!   (8 KiB; larger heads get 431);
//! - a whole connection, request and response, ends within `connection_timeout`.
//!
//! The agent serves it from a thread of its own ([`spawn_metrics_thread`]):
//! a kubelet's liveness probe must reflect the collector's progress, which
//! `/healthz` reports, not how busy the runtime that ships profiles and
//! watches the CRI is. On a loaded node that runtime's turn can come late,
//! and a probe answered late gets a healthy agent restarted.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kiln_contract::endpoints::{HEALTHZ_PATH, METRICS_PATH};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use super::{AgentMetrics, CONTENT_TYPE, parse_rss, unix_ms};

/// How much one client may take of the metrics endpoint.
#[derive(Debug, Clone, Copy)]
pub struct MetricsServerLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time for a connection's request head to arrive.
    pub header_read_timeout: Duration,
    /// Time for a whole connection, response included.
    pub connection_timeout: Duration,
}

impl Default for MetricsServerLimits {
    /// A scraper and a probe hold one connection each; a scrape takes
    /// milliseconds.
    fn default() -> Self {
        MetricsServerLimits {
            max_connections: 32,
            header_read_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(10),
        }
    }
}

/// hyper's smallest read buffer, and so the largest request head accepted.
const MAX_REQUEST_HEAD_BYTES: usize = 8192;

/// The endpoint's routes; other paths get 404, other methods 405.
pub fn router(metrics: Arc<AgentMetrics>) -> Router {
    Router::new()
        .route(METRICS_PATH, get(scrape))
        .route(HEALTHZ_PATH, get(health))
        .with_state(metrics)
}

async fn scrape(State(metrics): State<Arc<AgentMetrics>>) -> Response {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| parse_rss(&status));
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.render(rss)).into_response()
}

/// The collector's liveness: 503 once it has made no progress for longer
/// than its stall threshold, so the kubelet restarts a stuck agent.
async fn health(State(metrics): State<Arc<AgentMetrics>>) -> Response {
    match metrics.collector_health(unix_ms()) {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(age_ms) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("collector stalled: no progress for {} s\n", age_ms / 1000),
        )
            .into_response(),
    }
}

/// The endpoint running on its own thread and runtime.
#[derive(Debug)]
pub struct MetricsThread {
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl MetricsThread {
    /// Stops serving and waits for the thread to end.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        if self.thread.join().is_err() {
            tracing::error!("the metrics thread panicked");
        }
    }
}

/// Serves `/metrics` and `/healthz` on `listener` with the default limits,
/// from a new thread with a single-threaded runtime of its own, so no other
/// task of the agent can delay an answer.
pub fn spawn_metrics_thread(
    listener: std::net::TcpListener,
    metrics: Arc<AgentMetrics>,
) -> std::io::Result<MetricsThread> {
    listener.set_nonblocking(true)?;
    // Built here, not on the thread, so that a failure is the caller's.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("kiln-metrics".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => serve_metrics(listener, metrics, stopped).await,
                    Err(error) => tracing::error!(%error, "serving /metrics failed"),
                }
            });
        })?;
    Ok(MetricsThread { stop, thread })
}

/// Serves `/metrics` and `/healthz` with the default limits until
/// `shutdown` fires.
pub async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<AgentMetrics>,
    shutdown: watch::Receiver<bool>,
) {
    serve_metrics_with(listener, metrics, MetricsServerLimits::default(), shutdown).await;
}

/// Serves `/metrics` and `/healthz` under `limits` until `shutdown` fires.
pub async fn serve_metrics_with(
    listener: TcpListener,
    metrics: Arc<AgentMetrics>,
    limits: MetricsServerLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let router = router(metrics);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                // Never closed; stop serving if it ever is.
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors, say: pause instead of spinning.
                    tracing::debug!(%error, "accepting a metrics connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(MAX_REQUEST_HEAD_BYTES)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_timeout, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::debug!(%error, "metrics connection failed"),
                Err(_) => tracing::debug!("metrics connection timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Starts the endpoint on a free loopback port.
    async fn start(
        metrics: Arc<AgentMetrics>,
        limits: MetricsServerLimits,
    ) -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve_metrics_with(listener, metrics, limits, stopped));
        (address, stop)
    }

    /// Sends `request` as is and reads until the server closes: (status, whole response).
    async fn exchange(address: std::net::SocketAddr, request: &[u8]) -> (u16, String) {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream.write_all(request).await.expect("send");
        let mut response = Vec::new();
        // A reset after a refused head still leaves what was read.
        let _ = stream.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response).into_owned();
        let status = response
            .split_ascii_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        (status, response)
    }

    #[tokio::test]
    async fn metrics_health_and_other_paths_answer_one_request_per_connection() {
        let metrics = Arc::new(AgentMetrics::default());
        metrics.samples.add(7);
        let (address, _stop) = start(Arc::clone(&metrics), MetricsServerLimits::default()).await;

        // No `Connection: close`: the server still closes after answering,
        // as scrapers that read to the end expect.
        let (status, response) =
            exchange(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(status, 200, "{response}");
        assert!(
            response
                .to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{response}"
        );
        assert!(response.contains("\r\n\r\n# HELP "), "{response}");
        assert!(
            response.contains("\nkiln_agent_samples_total 7\n"),
            "{response}"
        );

        let (status, response) =
            exchange(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(
            (status, response.ends_with("\r\n\r\nok\n")),
            (200, true),
            "{response}"
        );

        metrics.collector_stall_after_ms.set(1);
        metrics.collector_progress_unix_ms.set(1);
        let (status, response) =
            exchange(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(status, 503, "{response}");
        assert!(response.contains("collector stalled"), "{response}");

        let (status, _) = exchange(address, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(status, 404);
        let (status, _) = exchange(
            address,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert_eq!(status, 405);
    }

    /// The old agent served the endpoint on the runtime that ships and
    /// discovers: a task holding that runtime's thread held every probe.
    #[test]
    fn healthz_answers_while_the_agent_runtime_is_held() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let server =
            spawn_metrics_thread(listener, Arc::new(AgentMetrics::default())).expect("spawn");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // This runtime's one thread is held by blocking IO for the whole
        // exchange, as a stuck task would hold it.
        let response = runtime.block_on(async {
            let mut stream = std::net::TcpStream::connect(address).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .expect("send");
            let mut response = String::new();
            let _ = stream.read_to_string(&mut response);
            response
        });
        assert!(
            response.starts_with("HTTP/1.1 200") && response.ends_with("\r\n\r\nok\n"),
            "{response:?}"
        );
        server.stop();
    }

    #[tokio::test]
    async fn an_oversized_request_head_is_refused() {
        let metrics = Arc::new(AgentMetrics::default());
        let (address, _stop) = start(metrics, MetricsServerLimits::default()).await;
        let mut request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', 2 * MAX_REQUEST_HEAD_BYTES));
        request.extend_from_slice(b"\r\n\r\n");
        let (status, response) = exchange(address, &request).await;
        assert_eq!(status, 431, "Request Header Fields Too Large: {response}");
        assert!(!response.contains("kiln_agent_samples_total"), "{response}");
    }

    #[tokio::test]
    async fn silent_connections_at_the_cap_are_closed_and_a_scrape_still_gets_through() {
        let metrics = Arc::new(AgentMetrics::default());
        let limits = MetricsServerLimits {
            max_connections: 2,
            header_read_timeout: Duration::from_millis(200),
            connection_timeout: Duration::from_secs(5),
        };
        let (address, _stop) = start(metrics, limits).await;
        let mut silent = Vec::new();
        for _ in 0..limits.max_connections {
            silent.push(TcpStream::connect(address).await.expect("connect"));
        }
        // Both slots are held by clients that send nothing: this scrape
        // waits in the accept queue until the header timeout frees a slot.
        let (status, response) =
            exchange(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(status, 200, "{response}");
        for mut stream in silent {
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest).await;
            assert!(
                !String::from_utf8_lossy(&rest).contains("kiln_agent"),
                "a client that sent nothing got no metrics"
            );
        }
    }
}
