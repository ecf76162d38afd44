//! One bounded HTTP GET of a pprof endpoint (IO): plain HTTP/1.1 on one
//! connection, a deadline over the whole exchange, a cap on the body read,
//! and no redirect ever followed. Endpoints are other people's programs: a
//! hostile or broken one costs one slot for at most the timeout and the
//! cap's worth of memory.

use std::time::Duration;

use hyper::body::Body as _;
use hyper::{Request, StatusCode, Uri, header};
use hyper_util::rt::TokioIo;

use super::ScrapeError;

/// Bounds of one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimits {
    /// Connecting, sending, and reading the whole body.
    pub timeout: Duration,
    /// Largest body read off the wire (compressed, as served).
    pub max_body_bytes: usize,
}

/// Media types a pprof endpoint serves (Go's `net/http/pprof` sends
/// `application/octet-stream`); a missing type is accepted, since the bytes
/// are checked as pprof anyway.
pub fn is_pprof_content_type(value: Option<&str>) -> bool {
    let Some(value) = value else {
        return true;
    };
    let media = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    matches!(
        media.as_str(),
        "application/octet-stream"
            | "application/x-protobuf"
            | "application/protobuf"
            | "application/vnd.google.protobuf"
            | "application/gzip"
            | "application/x-gzip"
    )
}

/// GETs `url` (plain `http://`) within `limits`.
pub async fn fetch(url: &str, limits: FetchLimits) -> Result<Vec<u8>, ScrapeError> {
    match tokio::time::timeout(limits.timeout, fetch_unbounded(url, limits.max_body_bytes)).await {
        Ok(result) => result,
        Err(_) => Err(ScrapeError::Timeout {
            after: limits.timeout,
        }),
    }
}

/// Aborts the connection's driver task when the exchange ends, however it
/// ends (a timeout drops the future mid-way).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn fetch_unbounded(url: &str, max_body_bytes: usize) -> Result<Vec<u8>, ScrapeError> {
    let bad_url = || ScrapeError::Url {
        url: url.to_owned(),
    };
    let uri: Uri = url.parse().map_err(|_| bad_url())?;
    if uri.scheme_str() != Some("http") {
        return Err(bad_url());
    }
    let host = uri.host().ok_or_else(bad_url)?;
    // An IPv6 literal comes bracketed in the URL, bare to connect.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|source| ScrapeError::Connect { source })?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|source| ScrapeError::Http { source })?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let authority = uri.authority().map_or(host, |a| a.as_str()).to_owned();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let request = Request::get(path)
        .header(header::HOST, authority)
        .header(
            header::USER_AGENT,
            concat!("kiln-agent/", env!("CARGO_PKG_VERSION")),
        )
        .body(String::new())
        .map_err(|_| bad_url())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|source| ScrapeError::Http { source })?;
    let status = response.status();
    // Never followed: a redirect could point the agent, which runs on every
    // node, anywhere (the API server, a metadata service).
    if status.is_redirection() {
        return Err(ScrapeError::Redirect {
            status: status.as_u16(),
        });
    }
    if status != StatusCode::OK {
        return Err(ScrapeError::Status {
            status: status.as_u16(),
        });
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    if !is_pprof_content_type(content_type) {
        return Err(ScrapeError::ContentType {
            content_type: content_type.unwrap_or_default().chars().take(64).collect(),
        });
    }
    let too_large = ScrapeError::TooLarge {
        limit: max_body_bytes,
    };
    let mut body = response.into_body();
    if body
        .size_hint()
        .exact()
        .is_some_and(|n| n > max_body_bytes as u64)
    {
        return Err(too_large);
    }
    let mut bytes = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        let frame = frame.map_err(|source| ScrapeError::Http { source })?;
        if let Ok(data) = frame.into_data() {
            if bytes.len().saturating_add(data.len()) > max_body_bytes {
                return Err(too_large);
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pprof_media_types_pass() {
        assert!(is_pprof_content_type(None));
        assert!(is_pprof_content_type(Some("application/octet-stream")));
        assert!(is_pprof_content_type(Some(
            "Application/Octet-Stream; charset=x"
        )));
        assert!(!is_pprof_content_type(Some("text/html; charset=utf-8")));
        assert!(!is_pprof_content_type(Some("text/plain")));
        assert!(!is_pprof_content_type(Some("application/json")));
    }
}
