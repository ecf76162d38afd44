//! The operator's small HTTP endpoint: `/metrics`, `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::{CONTENT_TYPE, Metrics};

/// Answers one request; pure, so it is tested without sockets.
pub fn respond(method: &Method, path: &str, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (method, path) {
        (&Method::GET, "/metrics") => (StatusCode::OK, CONTENT_TYPE, metrics.render()),
        (&Method::GET, "/healthz" | "/readyz") => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET is supported\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    response
}

/// Serves until `shutdown` flips to true.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    loop {
        let (stream, peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = shutdown.changed() => return Ok(()),
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let response = respond(request.method(), request.uri().path(), &metrics);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, %error, "metrics connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_path_serves_prometheus_text() {
        let metrics = Metrics::default();
        let response = respond(&Method::GET, "/metrics", &metrics);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            respond(&Method::GET, "/healthz", &metrics).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond(&Method::GET, "/nope", &metrics).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            respond(&Method::POST, "/metrics", &metrics).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
}
