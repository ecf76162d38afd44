//! The router: gRPC and HTTP on one port, and serving it until shutdown.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any, any_service, get, post};
use kiln_contract::endpoints::METRICS_PATH;

use crate::ingest::grpc::{PushServer, WriteRawServer, ingest_servers};
use crate::ingest::{grpc_admission, http as http_ingest, otlp};
use crate::query::grpc::QueryServer;
use crate::query::{http as http_query, pyroscope, recorded};
use crate::state::AppState;
use auth::require_token;
use routes::{Endpoint, ROUTES};

mod accept;
pub mod auth;
mod health;
pub mod routes;
pub mod web_guard;

pub use accept::{MAX_HEADER_BUFFER_BYTES, serve};

/// The tonic services some routes hand their requests to.
struct Services {
    write_raw: WriteRawServer,
    push: PushServer,
    query: QueryServer,
}

/// Every route of the main port: [`ROUTES`], then the web UI off the
/// table, behind the auth and web guard layers.
pub fn router(state: AppState) -> Router {
    let (write_raw, push) = ingest_servers(&state);
    let services = Services {
        write_raw,
        push,
        query: crate::query::grpc::query_server(&state),
    };
    let mut router = Router::new();
    for route in ROUTES {
        router = router.route(route.path, handler(route.endpoint, &services, &state));
    }
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(mark_partial))
        // Sees the route the router matched (`MatchedPath`), to refuse a
        // path in no route and to ask for the route's tokens.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        // Outermost: a browser's cross-site request is refused before
        // anything else, and every response gets the security headers.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            web_guard::guard,
        ))
        // Bodies are read with explicit limits in the handlers.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// The handler of `endpoint`, with the methods it answers.
fn handler(endpoint: Endpoint, services: &Services, state: &AppState) -> MethodRouter<AppState> {
    match endpoint {
        Endpoint::Healthz => get(health::healthz),
        Endpoint::Readyz => get(health::readyz),
        Endpoint::Metrics => get(metrics),
        Endpoint::PyroscopeIngest => post(http_ingest::pyroscope_ingest),
        Endpoint::Push => {
            let (state, push) = (state.clone(), services.push.clone());
            post(move |request: Request| http_ingest::push(state.clone(), push.clone(), request))
        }
        Endpoint::WriteRaw => {
            let (state, write_raw) = (state.clone(), services.write_raw.clone());
            any(move |request: Request| {
                let (state, write_raw) = (state.clone(), write_raw.clone());
                async move {
                    grpc_admission::serve_admitted(&state, "write_raw", write_raw, request).await
                }
            })
        }
        Endpoint::OtlpGrpc => {
            let state = state.clone();
            post(move |request: Request| otlp::service::export_grpc(state.clone(), request))
        }
        Endpoint::OtlpHttp => post(otlp::service::export_http),
        Endpoint::QueryGrpc => any_service(services.query.clone()),
        Endpoint::Querier => post(pyroscope::connect::querier),
        Endpoint::PyroscopeRender => get(pyroscope::render::render),
        Endpoint::PyroscopeLabelValues => get(pyroscope::render::label_values),
        Endpoint::ProfileTypes => get(http_query::profile_types),
        Endpoint::LabelNames => get(http_query::label_names),
        Endpoint::LabelValues => get(http_query::label_values),
        Endpoint::Series => get(http_query::series),
        Endpoint::Flamegraph => get(http_query::flamegraph),
        Endpoint::Pprof => get(http_query::pprof),
        Endpoint::Folded => get(http_query::folded),
        Endpoint::Top => get(http_query::top),
        Endpoint::Timeline => get(http_query::timeline),
        Endpoint::Diff => get(http_query::diff),
        Endpoint::RecordedMetrics => get(recorded::metrics),
        Endpoint::RecordedQuery => get(recorded::query).post(recorded::query),
        Endpoint::RecordedQueryRange => get(recorded::query_range).post(recorded::query_range),
        Endpoint::RecordedSeries => get(recorded::series).post(recorded::series),
        Endpoint::RecordedLabels => get(recorded::labels).post(recorded::labels),
        Endpoint::RecordedLabelValues => get(recorded::label_values),
        Endpoint::RecordedBuildInfo => get(recorded::buildinfo),
        Endpoint::PeerHead => post(crate::query::peers::peer_head),
        Endpoint::PeerKeys => post(crate::ingest::peer_keys::peer_keys),
        Endpoint::DebugInfoUpload => post(crate::symbolize::upload::upload),
    }
}

/// Only `/metrics`, for the optional separate metrics port.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route(METRICS_PATH, get(metrics))
        .with_state(state)
}

/// The header (and gRPC response metadata) naming what a query answer
/// lacks; absent when it is complete.
pub use kiln_contract::query_json::PARTIAL_HEADER;

/// Marks an answer that lacks data the store holds (a block compacted
/// away under a running query, a bucket that could not be listed): every
/// query the request runs notes the blocks it could not read, and the
/// response says so in `Kiln-Partial` instead of passing a short answer off
/// as whole. gRPC clients see the header as response metadata.
async fn mark_partial(request: Request, next: axum::middleware::Next) -> Response {
    let (mut response, incomplete) =
        kiln_storage::store::record_incomplete(next.run(request)).await;
    if !incomplete.is_complete() && response.status().is_success() {
        let mut reasons = Vec::new();
        if !incomplete.skipped_blocks.is_empty() {
            reasons.push(format!(
                "skipped_blocks={}",
                incomplete.skipped_blocks.len()
            ));
        }
        if incomplete.bucket_not_listed {
            reasons.push("bucket_not_listed".to_owned());
        }
        if incomplete.held_wal_ranges > 0 {
            reasons.push(format!("wal_held={}", incomplete.held_wal_ranges));
        }
        if !incomplete.unanswered_peers.is_empty() {
            let peers: Vec<&str> = incomplete
                .unanswered_peers
                .iter()
                .map(|p| p.peer.as_str())
                .collect();
            reasons.push(format!("peers_unanswered={}", peers.join(" ")));
        }
        if incomplete.symbols_pending > 0 {
            reasons.push(format!("symbols_pending={}", incomplete.symbols_pending));
        }
        if let Ok(value) = axum::http::HeaderValue::from_str(&reasons.join(", ")) {
            response.headers_mut().insert(PARTIAL_HEADER, value);
        }
    }
    response
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics().render(&state.storage_gauges());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    let body = serde_json::json!({
        "error": format!("method {} is not allowed on {}", request.method(), request.uri().path()),
        "reason": "method_not_allowed",
    });
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(body)).into_response()
}

/// Serves the embedded web UI for GETs it knows; the auth layer refused
/// every other path that matched no route, so anything else is a 404.
async fn not_found(request: Request) -> Response {
    if request.method() == Method::GET
        && let Some(asset) = kiln_ui::asset(request.uri().path())
    {
        return (
            [
                (axum::http::header::CONTENT_TYPE, asset.content_type),
                (axum::http::header::CACHE_CONTROL, asset.cache_control),
            ],
            asset.bytes,
        )
            .into_response();
    }
    no_such_endpoint(request.method(), request.uri().path())
}

/// The JSON 404 of a path that no route serves.
pub(crate) fn no_such_endpoint(method: &Method, path: &str) -> Response {
    let body = serde_json::json!({
        "error": format!("no such endpoint: {method} {path}"),
        "reason": "not_found",
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// Binds `addr`, with a message that names it on failure.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}
