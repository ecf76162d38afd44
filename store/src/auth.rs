//! Optional bearer-token auth: one token list for writes, one for reads.
//! An empty list leaves that side open (the default). Health, readiness and
//! metrics are always open.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// What a path needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Ingest endpoints.
    Write,
    /// Query endpoints.
    Read,
    /// Health, readiness, metrics.
    Open,
}

/// Classifies a request path.
pub fn access_for_path(path: &str) -> Access {
    if path == "/ingest"
        || path == "/pyroscope/ingest"
        || path.starts_with("/push.v1.PusherService/")
        || path.starts_with("/parca.profilestore.v1alpha1.ProfileStoreService/")
        || path.starts_with("/opentelemetry.proto.collector.profiles.")
        || path == "/v1development/profiles"
    {
        Access::Write
    } else if path.starts_with("/api/")
        || path.starts_with("/kiln.query.v1.QueryService/")
        || path.starts_with("/querier.v1.QuerierService/")
        || path.starts_with("/pyroscope/render")
        || path == "/pyroscope/label-values"
    {
        Access::Read
    } else {
        Access::Open
    }
}

/// True when `header_value` carries one of `tokens`: `Bearer <token>`, or
/// `Basic base64(<any user>:<token>)` for clients that only speak basic auth
/// (`pyroscope-io` 1.x, Grafana Alloy's `basic_auth`).
pub fn bearer_matches(header_value: Option<&str>, tokens: &[String]) -> bool {
    let Some(value) = header_value else {
        return false;
    };
    let token: Vec<u8> = if let Some(token) = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
    {
        token.trim().as_bytes().to_vec()
    } else if let Some(encoded) = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))
    {
        let Some(decoded) = crate::push_json::decode_base64(encoded.trim()) else {
            return false;
        };
        match decoded.iter().position(|&b| b == b':') {
            Some(colon) => decoded[colon + 1..].to_vec(),
            None => return false,
        }
    } else {
        return false;
    };
    tokens
        .iter()
        .any(|t| constant_time_eq(t.as_bytes(), &token))
}

/// Compares without an early exit, so timing does not reveal a prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware.
pub async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let (tokens, access_name) = match access_for_path(request.uri().path()) {
        Access::Write => (state.write_tokens(), "writes"),
        Access::Read => (state.read_tokens(), "reads"),
        Access::Open => return next.run(request).await,
    };
    if tokens.is_empty() {
        return next.run(request).await;
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if bearer_matches(authorization, tokens) {
        return next.run(request).await;
    }
    let err = ApiError::Unauthorized {
        access: access_name,
    };
    state.metrics().record_rejection("auth", err.reason());
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.starts_with("application/grpc") {
        err.to_status().into_http::<Body>().map(Body::new)
    } else if request.uri().path().starts_with("/push.v1.")
        || request.uri().path().starts_with("/querier.v1.")
    {
        err.into_connect_response()
    } else {
        err.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_classified() {
        assert_eq!(access_for_path("/ingest"), Access::Write);
        assert_eq!(
            access_for_path(kiln_api::OTLP_PROFILES_EXPORT_PATH),
            Access::Write
        );
        assert_eq!(access_for_path("/v1development/profiles"), Access::Write);
        assert_eq!(
            access_for_path("/querier.v1.QuerierService/LabelNames"),
            Access::Read
        );
        assert_eq!(access_for_path("/pyroscope/render"), Access::Read);
        assert_eq!(
            access_for_path("/push.v1.PusherService/Push"),
            Access::Write
        );
        assert_eq!(
            access_for_path("/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw"),
            Access::Write
        );
        assert_eq!(access_for_path("/api/v1/flamegraph"), Access::Read);
        assert_eq!(
            access_for_path("/kiln.query.v1.QueryService/SelectMergePprof"),
            Access::Read
        );
        assert_eq!(access_for_path("/metrics"), Access::Open);
        assert_eq!(access_for_path("/readyz"), Access::Open);
    }

    #[test]
    fn only_listed_bearer_tokens_pass() {
        let tokens = vec!["s3cret".to_owned()];
        assert!(bearer_matches(Some("Bearer s3cret"), &tokens));
        assert!(!bearer_matches(Some("Bearer s3cre"), &tokens));
        assert!(!bearer_matches(Some("Basic s3cret"), &tokens));
        // base64("user:s3cret") and base64("user:nope")
        assert!(bearer_matches(Some("Basic dXNlcjpzM2NyZXQ="), &tokens));
        assert!(!bearer_matches(Some("Basic dXNlcjpub3Bl"), &tokens));
        assert!(!bearer_matches(None, &tokens));
    }
}
