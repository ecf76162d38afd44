//! gRPC ingest admitted before tonic decodes it, so many streams cannot
//! take unbounded memory before any limit is applied. tonic buffers
//! and decodes a whole message (up to `--max-request-bytes`, inflated if
//! gzipped) before a handler runs, so a handler's admission came after the
//! memory was spent, and many streams could add up to anything.
//!
//! Here, before tonic sees the request, it takes an ingest slot, then reads
//! the body within the body read timeout, reserving twice every chunk from
//! the ingest memory budget as it arrives (the bytes, and tonic's copy or
//! the decoded message), and inflates gzip messages itself, reserving as
//! the output grows. tonic then gets one bounded, uncompressed body. The
//! slot and reservation are held until the handler has answered.

use std::convert::Infallible;
use std::io::Read as _;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use crate::error::ApiError;
use crate::state::{AppState, SharedPermit, WritePermit};
use crate::wire::body::append_reserved;

/// The length-prefixed message framing: a compressed flag and a u32 length.
const FRAME_HEADER_BYTES: usize = 5;
/// The stage named when an inflated message is over the limit.
const INFLATED: &str = "after decompressing";
/// Inflated in steps of this size, each reserved before it is written.
const INFLATE_STEP_BYTES: usize = 64 << 10;

/// Admits `request` and hands it to the tonic `service`; refusals answer
/// as gRPC statuses and are counted under `endpoint`.
pub async fn serve_admitted<S, B>(
    state: &AppState,
    endpoint: &'static str,
    service: S,
    request: Request,
) -> Response
where
    S: tower::Service<Request, Response = http::Response<B>, Error = Infallible>,
    B: axum::body::HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    match admit(state, request).await {
        Ok((permit, mut request)) => {
            // The handler may reserve more for what it decodes (OTLP).
            let permit = SharedPermit::new(permit);
            request.extensions_mut().insert(permit.clone());
            let response = match service.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            // Held until the handler has stored the upload.
            drop(permit);
            response.map(Body::new)
        }
        Err(err) => {
            state.metrics().record_rejection(endpoint, err.reason());
            tracing::debug!(error = %err, endpoint, "grpc ingest refused before decoding");
            err.to_status().into_http()
        }
    }
}

async fn admit(state: &AppState, request: Request) -> Result<(WritePermit, Request), ApiError> {
    let mut permit = state.admit_write_unsized()?;
    let limit = state.limits().max_request_bytes;
    let timeout = state.body_read_timeout();
    let (mut parts, body) = request.into_parts();
    let wire = tokio::time::timeout(timeout, read_reserving(body, limit, &mut permit))
        .await
        .map_err(|_| ApiError::BodyTimeout { timeout })??;
    let gzip = parts
        .headers
        .get("grpc-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let body = if gzip {
        parts.headers.remove("grpc-encoding");
        // Inflating takes up to ~100 ms: off the async workers. The permit
        // travels with it, to reserve as the output grows, and comes back.
        let turn = state.ingest_turn().await?;
        let (inflated, returned) = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let inflated = inflate_frames(&wire, limit, &mut |bytes| {
                permit.reserve_more(bytes.saturating_mul(2))
            });
            (inflated, permit)
        })
        .await
        .map_err(|e| ApiError::Worker {
            work: "inflating a gRPC message",
            message: e.to_string(),
        })?;
        permit = returned;
        inflated?
    } else {
        wire
    };
    Ok((permit, Request::from_parts(parts, Body::from(body))))
}

/// Reads `body`, a message of at most `limit` bytes in its frame, reserving
/// twice each chunk first.
async fn read_reserving(
    mut body: Body,
    limit: usize,
    permit: &mut WritePermit,
) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::BadMessage {
            message_type: "gRPC request body",
            message: e.to_string(),
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if out.len() + data.len() > limit + FRAME_HEADER_BYTES {
            return Err(ApiError::GrpcMessageTooLarge {
                stage: "as sent",
                limit,
            });
        }
        permit.reserve_more(data.len().saturating_mul(2))?;
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// Rewrites gzip-compressed length-prefixed messages as uncompressed ones,
/// each at most `limit` bytes inflated, calling `reserve` before each step
/// of output. Anything that does not parse as frames is left to tonic.
fn inflate_frames(
    wire: &[u8],
    limit: usize,
    reserve: &mut impl FnMut(usize) -> Result<(), kiln_storage::StorageError>,
) -> Result<Vec<u8>, ApiError> {
    // The wire's length was reserved as it was read (twice over): the
    // frames copied as they are fit that. What inflating adds past it is
    // reserved before the buffer grows.
    let mut out = Vec::with_capacity(wire.len());
    let mut held = out.capacity();
    let mut rest = wire;
    while rest.len() >= FRAME_HEADER_BYTES {
        let compressed = rest[0] == 1;
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let Some(message) = rest.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len) else {
            break; // truncated: tonic reports it
        };
        if !compressed {
            append_reserved(
                &mut out,
                &rest[..FRAME_HEADER_BYTES + len],
                usize::MAX,
                &mut held,
                reserve,
            )?;
        } else {
            let header_at = out.len();
            append_reserved(
                &mut out,
                &[0; FRAME_HEADER_BYTES],
                usize::MAX,
                &mut held,
                reserve,
            )?;
            let inflated = inflate_into(message, limit, &mut out, &mut held, reserve)?;
            let len = u32::try_from(inflated).map_err(|_| ApiError::GrpcMessageTooLarge {
                stage: INFLATED,
                limit,
            })?;
            out[header_at + 1..header_at + FRAME_HEADER_BYTES].copy_from_slice(&len.to_be_bytes());
        }
        rest = &rest[FRAME_HEADER_BYTES + len..];
    }
    append_reserved(&mut out, rest, usize::MAX, &mut held, reserve)?;
    Ok(out)
}

/// Appends the gzip `message` inflated to `out`; returns its length.
fn inflate_into(
    message: &[u8],
    limit: usize,
    out: &mut Vec<u8>,
    held: &mut usize,
    reserve: &mut impl FnMut(usize) -> Result<(), kiln_storage::StorageError>,
) -> Result<usize, ApiError> {
    let mut decoder = flate2::read::GzDecoder::new(message);
    let mut inflated = 0usize;
    let mut step = vec![0u8; INFLATE_STEP_BYTES];
    loop {
        let read = decoder.read(&mut step).map_err(|e| ApiError::BadGzip {
            message: e.to_string(),
        })?;
        if read == 0 {
            return Ok(inflated);
        }
        inflated += read;
        if inflated > limit {
            return Err(ApiError::GrpcMessageTooLarge {
                stage: INFLATED,
                limit,
            });
        }
        append_reserved(out, &step[..read], usize::MAX, held, reserve)?;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn frame(compressed: bool, message: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::from(compressed)];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn gzip_frames_become_plain_frames_reserved_as_they_grow() {
        let message = b"a WriteRaw request".repeat(10_000);
        let mut wire = frame(true, &gzip(&message));
        wire.extend(frame(false, b"next"));
        let mut reserved = 0;
        let out = inflate_frames(&wire, 1 << 20, &mut |bytes| {
            reserved += bytes;
            Ok(())
        })
        .unwrap();
        let mut expected = frame(false, &message);
        expected.extend(frame(false, b"next"));
        assert_eq!(out, expected);
        // Every byte the buffer grows by past the wire (reserved as it was
        // read) is reserved before it is allocated: the buffer's capacity,
        // not only its length, doubling at most.
        assert!(
            out.capacity() <= wire.len() + reserved,
            "capacity {} against {} reserved",
            out.capacity(),
            wire.len() + reserved
        );
        assert!(
            reserved >= message.len() - wire.len() && reserved <= 2 * message.len(),
            "{reserved}"
        );
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_limit_or_the_budget() {
        let wire = frame(true, &gzip(&vec![0; 8 << 20]));
        let err = inflate_frames(&wire, 1 << 20, &mut |_| Ok(())).unwrap_err();
        assert!(
            matches!(err, ApiError::GrpcMessageTooLarge { limit, .. } if limit == 1 << 20),
            "{err}"
        );
        let mut budget: usize = 256 << 10;
        let err = inflate_frames(&wire, 32 << 20, &mut |bytes| {
            budget = budget
                .checked_sub(bytes)
                .ok_or(kiln_storage::StorageError::MemoryBusy {
                    bytes: bytes as u64,
                    budget: 256 << 10,
                })?;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.reason(), "memory_busy", "{err}");
    }

    #[test]
    fn truncated_or_plain_bodies_are_passed_through_for_tonic_to_judge() {
        let plain = frame(false, b"plain");
        assert_eq!(inflate_frames(&plain, 100, &mut |_| Ok(())).unwrap(), plain);
        let mut truncated = frame(true, &gzip(b"x"));
        truncated.truncate(8);
        assert_eq!(
            inflate_frames(&truncated, 100, &mut |_| Ok(())).unwrap(),
            truncated
        );
    }
}
