//! `Content-Type`, as ingest and query handlers compare it.

use axum::http::{HeaderMap, header};

/// The whole `Content-Type`, parameters included, trimmed and lowercased
/// (empty when the header is absent or not text).
pub fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The media type of `Content-Type` without its parameters, lowercased
/// (empty when the header is absent or not text).
pub fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// True for gRPC (`application/grpc`, `application/grpc+proto`, ...).
pub fn is_grpc(content_type: &str) -> bool {
    content_type.starts_with("application/grpc")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
        headers
    }

    #[test]
    fn media_type_drops_parameters_and_case() {
        let json = headers(" Application/JSON; charset=utf-8");
        assert_eq!(media_type(&json), "application/json");
        assert_eq!(content_type(&json), "application/json; charset=utf-8");
        assert_eq!(media_type(&HeaderMap::new()), "");
        assert!(is_grpc(&content_type(&headers("application/grpc+proto"))));
        assert!(!is_grpc("application/json"));
    }
}
