//! A request body: read whole within its size and time limits, then its
//! `Content-Encoding` (gzip or identity) undone within the same size limit.

use std::io::Read;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, header};

use crate::error::ApiError;

/// Reads the whole body, refusing more than `limit` bytes or a body that
/// takes longer than `timeout` to arrive: a slow sender holds its ingest
/// slot and reservation only that long, and many slow senders cannot
/// hold every slot.
pub async fn read_body(body: Body, limit: usize, timeout: Duration) -> Result<Vec<u8>, ApiError> {
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes.to_vec()),
        Ok(Err(_)) => Err(ApiError::TooLarge { limit }),
        Err(_) => Err(ApiError::BodyTimeout { timeout }),
    }
}

/// Undoes `Content-Encoding` (gzip or identity), bounded by `limit`.
pub fn decode_content_encoding(
    headers: &HeaderMap,
    body: Vec<u8>,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    match encoding.as_str() {
        "" | "identity" => Ok(body),
        "gzip" | "x-gzip" => {
            // Some clients label an already-gzipped pprof with this header
            // and some gzip the body for transport; only inflate real gzip.
            if !kiln_pprof::is_gzip(&body) {
                return Ok(body);
            }
            gunzip_bounded(&body, limit)
        }
        other => Err(ApiError::UnsupportedEncoding {
            encoding: other.chars().take(40).collect(),
        }),
    }
}

fn gunzip_bounded(body: &[u8], limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
    flate2::read::MultiGzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ApiError::BadGzip {
            message: e.to_string(),
        })?;
    if out.len() > limit {
        return Err(ApiError::TooLarge { limit });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn headers(encoding: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_ENCODING, encoding.parse().unwrap());
        headers
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn gzip_encoding_is_undone_only_for_real_gzip() {
        let body = decode_content_encoding(&headers("gzip"), gzip(b"hello"), 100).unwrap();
        assert_eq!(body, b"hello");
        let body = decode_content_encoding(&headers("gzip"), b"plain".to_vec(), 100).unwrap();
        assert_eq!(body, b"plain");
        let body = decode_content_encoding(&HeaderMap::new(), gzip(b"x"), 100).unwrap();
        assert!(
            kiln_pprof::is_gzip(&body),
            "no header: left for the pprof decoder"
        );
    }

    #[test]
    fn bad_encodings_and_bombs_are_refused() {
        let err = decode_content_encoding(&headers("br"), vec![1], 100).unwrap_err();
        assert_eq!(err.reason(), "unsupported_encoding");
        let err = decode_content_encoding(&headers("gzip"), gzip(&[0u8; 1000]), 100).unwrap_err();
        assert!(matches!(err, ApiError::TooLarge { limit: 100 }));
        let mut corrupt = gzip(b"hello world");
        let len = corrupt.len();
        corrupt.truncate(len - 6);
        let err = decode_content_encoding(&headers("gzip"), corrupt, 100).unwrap_err();
        assert_eq!(err.reason(), "bad_gzip");
    }
}
