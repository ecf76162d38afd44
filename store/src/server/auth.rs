//! Optional bearer-token auth: one token list for writes, one for reads.
//! An empty list leaves that side open (the default). Which side a request
//! is on is its route's [`Access`] in the route table; health, readiness,
//! metrics and the web UI are always open, and a path that no route serves
//! is refused here, before any token is asked for or any handler runs.

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::routes::{self, Access};
use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::content_type::{content_type, is_grpc};

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
        let Some(decoded) = crate::wire::base64::decode(encoded.trim()) else {
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

/// The access the request's route needs, from the route the router
/// matched; `None` when no route serves it.
pub fn access_for(request: &Request) -> Option<Access> {
    match request.extensions().get::<MatchedPath>() {
        Some(matched) => routes::access_of(matched.as_str()),
        None => routes::fallback_access(request.method(), request.uri().path()),
    }
}

/// The middleware: refuses a path that no route serves, then asks for the
/// route's tokens, if any are configured.
pub async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(access) = access_for(&request) else {
        return super::no_such_endpoint(request.method(), request.uri().path());
    };
    let (tokens, access_name) = match access {
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
    if is_grpc(&content_type(request.headers())) {
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
