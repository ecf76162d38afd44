//! The router: gRPC and HTTP on one port, and serving it until shutdown.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use kiln_api::{OTLP_PROFILES_EXPORT_PATH, PUSH_PATH, WRITE_RAW_PATH};
use kiln_contract::endpoints::{HEALTHZ_PATH, METRICS_PATH, READYZ_PATH};

use crate::auth::require_token;
use crate::grpc_ingest::ingest_servers;
use crate::state::AppState;
use crate::{http_ingest, http_query};

mod accept;

pub use accept::{MAX_HEADER_BUFFER_BYTES, serve};

/// Every route of the main port.
pub fn router(state: AppState) -> Router {
    let (write_raw, push_grpc) = ingest_servers(&state);
    let query_grpc = crate::grpc_query::query_server(&state);
    let push_state = state.clone();
    let write_raw_state = state.clone();
    let otlp_state = state.clone();
    Router::new()
        .route(HEALTHZ_PATH, get(|| async { "ok\n" }))
        .route(READYZ_PATH, get(readyz))
        .route(METRICS_PATH, get(metrics))
        .route("/ingest", post(http_ingest::pyroscope_ingest))
        .route("/pyroscope/ingest", post(http_ingest::pyroscope_ingest))
        .route(
            PUSH_PATH,
            post(move |request: Request| {
                http_ingest::push(push_state.clone(), push_grpc.clone(), request)
            }),
        )
        .route(
            WRITE_RAW_PATH,
            any(move |request: Request| {
                let (state, write_raw) = (write_raw_state.clone(), write_raw.clone());
                async move {
                    crate::grpc_admission::serve_admitted(&state, "write_raw", write_raw, request)
                        .await
                }
            }),
        )
        .route(
            OTLP_PROFILES_EXPORT_PATH,
            post(move |request: Request| {
                crate::otlp::service::export_grpc(otlp_state.clone(), request)
            }),
        )
        .route(
            "/v1development/profiles",
            post(crate::otlp::service::export_http),
        )
        .route_service("/kiln.query.v1.QueryService/{*method}", query_grpc)
        .route(
            "/querier.v1.QuerierService/{method}",
            post(crate::pyroscope_query::connect::querier),
        )
        .route(
            "/pyroscope/render",
            get(crate::pyroscope_query::render::render),
        )
        .route(
            "/pyroscope/label-values",
            get(crate::pyroscope_query::render::label_values),
        )
        .route("/api/v1/profile-types", get(http_query::profile_types))
        .route("/api/v1/labels", get(http_query::label_names))
        .route(
            "/api/v1/labels/{name}/values",
            get(http_query::label_values),
        )
        .route("/api/v1/series", get(http_query::series))
        .route("/api/v1/flamegraph", get(http_query::flamegraph))
        .route("/api/v1/pprof", get(http_query::pprof))
        .route("/api/v1/folded", get(http_query::folded))
        .route("/api/v1/top", get(http_query::top))
        .route("/api/v1/timeline", get(http_query::timeline))
        .route("/api/v1/diff", get(http_query::diff))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(mark_partial))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        // Outermost: a browser's cross-site request is refused before
        // anything else, and every response gets the security headers.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::web_guard::guard,
        ))
        // Bodies are read with explicit limits in the handlers.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// Only `/metrics`, for the optional separate metrics port.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route(METRICS_PATH, get(metrics))
        .with_state(state)
}

/// 200 only when the store is open, its write-ahead log takes writes and
/// its bucket answers; else 503 with one `<reason>: <message>` line per
/// problem. Liveness (`/healthz`) stays 200 either way: a store waiting for
/// its bucket keeps serving what it has, and restarting it would not help.
async fn readyz(State(state): State<AppState>) -> Response {
    let Ok(store) = state.store() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "recovering\n").into_response();
    };
    let health = store.health();
    let mut text = String::from(if health.is_ready() {
        "ready\n"
    } else {
        "not ready\n"
    });
    // The records set aside do not block serving, but an operator probing
    // readiness should see that some exist.
    text.push_str(&format!(
        "wal_quarantined_records {}\nunuploaded_bytes {} of {}\n",
        health.wal_quarantined_records, health.unuploaded_bytes, health.unuploaded_budget_bytes
    ));
    for problem in &health.problems {
        text.push_str(&format!("{}: {}\n", problem.reason, problem.message));
    }
    let status = if health.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text).into_response()
}

/// The header (and gRPC response metadata) naming what a query answer
/// lacks; absent when it is complete.
pub const PARTIAL_HEADER: &str = "kiln-partial";

/// Marks an answer that lacks data the store holds (audit D5): every query
/// the request runs notes the blocks it could not read, and the response
/// says so in `Kiln-Partial` instead of passing a short answer off as
/// whole. gRPC clients see the header as response metadata.
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

/// Serves the embedded web UI for GETs it knows, else a JSON 404.
async fn not_found(request: Request) -> Response {
    if request.method() == axum::http::Method::GET
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
    let body = serde_json::json!({
        "error": format!("no such endpoint: {} {}", request.method(), request.uri().path()),
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
