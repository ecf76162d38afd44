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

use std::sync::Arc;

use kiln_storage::WriterScope;

use super::routes::{self, Access};
use crate::config::NamespaceToken;
use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::content_type::{content_type, is_grpc};

/// The token `header_value` presents: `Bearer <token>`, or
/// `Basic base64(<any user>:<token>)` for clients that only speak basic auth
/// (`pyroscope-io` 1.x, Grafana Alloy's `basic_auth`).
fn presented_token(header_value: Option<&str>) -> Option<Vec<u8>> {
    let value = header_value?;
    if let Some(token) = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
    {
        return Some(token.trim().as_bytes().to_vec());
    }
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let decoded = crate::wire::base64::decode(encoded.trim())?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some(decoded[colon + 1..].to_vec())
}

/// True when `header_value` carries one of `tokens`.
pub fn bearer_matches(header_value: Option<&str>, tokens: &[String]) -> bool {
    presented_token(header_value).is_some_and(|token| {
        tokens
            .iter()
            .any(|t| constant_time_eq(t.as_bytes(), &token))
    })
}

/// The write tokens: those that may write any namespace, and those bound
/// to some namespaces. With neither, writes are open.
#[derive(Debug, Clone, Default)]
pub struct WriteTokens {
    any_namespace: Vec<String>,
    bound: Vec<(String, WriterScope)>,
}

impl WriteTokens {
    /// The tokens of the configuration.
    pub fn new(any_namespace: Vec<String>, bound: &[NamespaceToken]) -> Self {
        let bound = bound
            .iter()
            .map(|t| {
                let namespaces = t.namespaces.iter().cloned().collect();
                (
                    t.token.clone(),
                    WriterScope::Namespaces(Arc::new(namespaces)),
                )
            })
            .collect();
        Self {
            any_namespace,
            bound,
        }
    }

    /// True when writes need no token.
    pub fn is_open(&self) -> bool {
        self.any_namespace.is_empty() && self.bound.is_empty()
    }

    /// What the writer presenting `header_value` may write; `None`: no
    /// write token. Every token is compared, so timing tells nothing of
    /// which list holds it.
    pub fn scope_of(&self, header_value: Option<&str>) -> Option<WriterScope> {
        if self.is_open() {
            return Some(WriterScope::AnyNamespace);
        }
        let token = presented_token(header_value)?;
        let mut scope = None;
        for t in &self.any_namespace {
            if constant_time_eq(t.as_bytes(), &token) {
                scope = Some(WriterScope::AnyNamespace);
            }
        }
        for (t, bound) in &self.bound {
            if constant_time_eq(t.as_bytes(), &token) && scope.is_none() {
                scope = Some(bound.clone());
            }
        }
        scope
    }
}

/// The scope the auth layer gave a write request (every write route passes
/// it); refused as a server error when missing, so a route that bypassed
/// the layer never writes unchecked.
pub fn writer_scope(extensions: &axum::http::Extensions) -> Result<WriterScope, ApiError> {
    extensions
        .get::<WriterScope>()
        .cloned()
        .ok_or(ApiError::Worker {
            work: "authorizing a write",
            message: "the request reached a write handler without its writer scope".to_owned(),
        })
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
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let access_name = match access {
        Access::Open => return next.run(request).await,
        Access::Read => {
            let tokens = state.read_tokens();
            if tokens.is_empty() || bearer_matches(authorization, tokens) {
                return next.run(request).await;
            }
            "reads"
        }
        Access::Write => {
            if let Some(scope) = state.write_tokens().scope_of(authorization) {
                let mut request = request;
                request.extensions_mut().insert(scope);
                return next.run(request).await;
            }
            "writes"
        }
    };
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

    #[test]
    fn a_write_token_brings_its_namespaces() {
        let bound = [NamespaceToken {
            token: "shop-token".to_owned(),
            namespaces: vec!["checkout".to_owned(), "shop".to_owned()],
        }];
        let tokens = WriteTokens::new(vec!["agents".to_owned()], &bound);
        assert!(!tokens.is_open());
        assert_eq!(
            tokens.scope_of(Some("Bearer agents")),
            Some(WriterScope::AnyNamespace)
        );
        let Some(WriterScope::Namespaces(namespaces)) = tokens.scope_of(Some("Bearer shop-token"))
        else {
            panic!("the bound token has a scope");
        };
        assert_eq!(
            namespaces.iter().map(String::as_str).collect::<Vec<_>>(),
            ["checkout", "shop"]
        );
        assert_eq!(tokens.scope_of(Some("Bearer other")), None);
        assert_eq!(tokens.scope_of(None), None);
        // Open writes: every writer may write any namespace.
        let open = WriteTokens::new(Vec::new(), &[]);
        assert_eq!(open.scope_of(None), Some(WriterScope::AnyNamespace));
    }
}
