//! HTTP ingest: Pyroscope's `POST /ingest` and `push.v1.PusherService/Push`
//! over the Connect protocol (binary or JSON, gzip or identity). gRPC calls
//! to the same Push path are handed to the tonic service.

use std::io::Read;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Multipart, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_api::push::v1::PushRequest;
use prost::Message;

use crate::error::ApiError;
use crate::grpc_ingest::PushServer;
use crate::ingest::{check_label_limits, uploads_from_push};
use crate::push_json::push_request_from_json;
use crate::pyroscope::{BodyFormat, IngestBody, MultipartParts, build_upload, parse_ingest_params};
use crate::state::AppState;
use crate::timespec::now_ms;

/// Reads the whole body, refusing more than `limit` bytes or a body that
/// takes longer than `timeout` to arrive: a slow sender holds its ingest
/// slot and reservation only that long (audit R4).
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

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The media type of `Content-Type` without its parameters, lowercased
/// (empty when the header is absent or not text).
pub(crate) fn media_type(headers: &HeaderMap) -> String {
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

/// `POST /ingest`.
pub async fn pyroscope_ingest(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    match pyroscope_ingest_inner(&state, query.as_deref().unwrap_or(""), request).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(err) => {
            state.metrics().record_rejection("ingest", err.reason());
            tracing::debug!(error = %err, "ingest refused");
            err.into_response()
        }
    }
}

async fn pyroscope_ingest_inner(
    state: &AppState,
    query: &str,
    request: Request,
) -> Result<(), ApiError> {
    let mut permit = state.admit_write(request.headers())?;
    let limit = state.limits().max_request_bytes;
    let content_type = content_type(request.headers());
    let params = parse_ingest_params(query, Some(&content_type), now_ms())?;
    let body = if params.format == BodyFormat::Multipart {
        IngestBody::Multipart(read_multipart(state, request).await?)
    } else {
        let headers = request.headers().clone();
        let raw = read_body(request.into_body(), limit, state.body_read_timeout()).await?;
        IngestBody::Raw(decode_content_encoding(&headers, raw, limit)?)
    };
    let decode_limits = state.decode_limits().clone();
    // The permit travels with the conversion, which reserves what it
    // decodes, and comes back to be held until the store has the upload.
    let turn = state.ingest_turn().await?;
    let (upload, permit) = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let upload = build_upload(&params, body, &decode_limits, &mut |bytes| {
            permit.reserve_more(bytes)
        });
        (upload, permit)
    })
    .await
    .map_err(|e| ApiError::Worker {
        work: "converting the upload",
        message: e.to_string(),
    })?;
    let upload = upload?;
    // Its series labels come from `name`: checked here, once, as every
    // protocol checks them where its uploads are built.
    check_label_limits(&upload.labels, state.limits())?;
    let result = state.ingest("ingest", vec![upload]).await;
    drop(permit);
    result
}

async fn read_multipart(state: &AppState, request: Request) -> Result<MultipartParts, ApiError> {
    let limit = state.limits().max_request_bytes;
    let bad = |message: String| ApiError::Ingest {
        source: crate::pyroscope::IngestError::BadMultipart { message },
    };
    let (parts, body) = request.into_parts();
    let body = read_body(body, limit, state.body_read_timeout()).await?;
    let request = Request::from_parts(parts, Body::from(body));
    let mut multipart = <Multipart as axum::extract::FromRequest<()>>::from_request(request, &())
        .await
        .map_err(|e| bad(e.body_text()))?;
    let mut parts = MultipartParts::default();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| bad(e.body_text()))?
    {
        let name = field.name().unwrap_or("").to_owned();
        let data = field
            .bytes()
            .await
            .map_err(|e| bad(e.body_text()))?
            .to_vec();
        match name.as_str() {
            "profile" => parts.profile = data,
            "prev_profile" => parts.prev_profile = Some(data),
            "sample_type_config" => parts.sample_type_config = Some(data),
            // Unknown fields are ignored, as Pyroscope does.
            _ => {}
        }
    }
    Ok(parts)
}

/// `POST /push.v1.PusherService/Push`: Connect unary, or gRPC (forwarded).
pub async fn push(state: AppState, grpc: PushServer, request: Request) -> Response {
    let content_type = content_type(request.headers());
    if content_type.starts_with("application/grpc") {
        return crate::grpc_admission::serve_admitted(&state, "push_grpc", grpc, request).await;
    }
    match push_connect(&state, &content_type, request).await {
        Ok(response) => response,
        Err(err) => {
            state.metrics().record_rejection("push", err.reason());
            tracing::debug!(error = %err, "push refused");
            err.into_connect_response()
        }
    }
}

async fn push_connect(
    state: &AppState,
    content_type: &str,
    request: Request,
) -> Result<Response, ApiError> {
    let _permit = state.admit_write(request.headers())?;
    let limit = state.limits().max_request_bytes;
    let headers = request.headers().clone();
    let raw = read_body(request.into_body(), limit, state.body_read_timeout()).await?;
    let body = decode_content_encoding(&headers, raw, limit)?;
    let (push_request, reply_json) = match content_type.split(';').next().unwrap_or("").trim() {
        "application/proto" | "application/protobuf" | "application/x-protobuf" => {
            let request =
                PushRequest::decode(body.as_slice()).map_err(|e| ApiError::BadMessage {
                    message_type: "push.v1.PushRequest protobuf",
                    message: e.to_string(),
                })?;
            (request, false)
        }
        "application/json" => (push_request_from_json(&body)?, true),
        other => {
            return Err(ApiError::UnsupportedMediaType {
                content_type: other.chars().take(60).collect(),
                expected: "application/proto, application/json or application/grpc",
            });
        }
    };
    let uploads = uploads_from_push(push_request, state.limits())?;
    state.ingest("push", uploads).await?;
    Ok(if reply_json {
        ([(header::CONTENT_TYPE, "application/json")], "{}").into_response()
    } else {
        // An empty PushResponse encodes to zero bytes.
        (
            [(header::CONTENT_TYPE, "application/proto")],
            Vec::<u8>::new(),
        )
            .into_response()
    })
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
