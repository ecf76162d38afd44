//! A Connect request body, read into the query memory budget as it
//! arrives.
//!
//! Reads are open by default, so the threats are any pod's: a small
//! gzipped body that inflates without end, a large body, and many slow
//! bodies each holding memory (or a query slot) while they trickle in.
//! Here a body is capped at [`MAX_QUERY_BODY_BYTES`] as sent and again as
//! inflated (inflating stops at the cap); each chunk, and each step of
//! inflated output, is reserved from the query budget before it is kept;
//! and the time a body may take grows with what has arrived, so a sender
//! that stalls is cut off after a few seconds, however long the server's
//! general body timeout. No query slot is held meanwhile: the caller takes
//! one once the body is in.

use std::io::Read as _;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use http_body_util::BodyExt as _;
use tokio::time::Instant;

use crate::error::ApiError;
use crate::wire::body::append_reserved;

/// The largest Connect request body, as sent and after decompression.
/// A real query (a selector, a few label names and times) is well under a
/// KiB; 1 MiB leaves room for long selectors while keeping what each body
/// holds small next to the query memory budget.
pub const MAX_QUERY_BODY_BYTES: usize = 1 << 20;

/// Time any body gets to arrive, however small.
const BODY_GRACE: Duration = Duration::from_secs(5);
/// Time added for each KiB received: a body must keep coming at about
/// 50 KiB/s on average once past the grace, so the largest body may take
/// about 25 s.
const BODY_TIME_PER_KIB: Duration = Duration::from_millis(20);
/// Inflated in steps of this size, each reserved before it is kept.
const INFLATE_STEP_BYTES: usize = 16 << 10;

/// How the body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentEncoding {
    /// As is.
    Identity,
    /// gzip.
    Gzip,
}

/// The body's `Content-Encoding`: gzip or identity.
pub fn content_encoding(headers: &HeaderMap) -> Result<ContentEncoding, ApiError> {
    let value = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    match value.as_str() {
        "" | "identity" => Ok(ContentEncoding::Identity),
        "gzip" | "x-gzip" => Ok(ContentEncoding::Gzip),
        other => Err(ApiError::UnsupportedEncoding {
            encoding: other.chars().take(40).collect(),
        }),
    }
}

/// How long a body that has delivered `received` bytes may have taken in
/// all, within `limit` (the server's body read timeout).
fn allowed(received: usize, limit: Duration) -> Duration {
    let kib = u32::try_from(received / 1024).unwrap_or(u32::MAX);
    BODY_GRACE
        .saturating_add(BODY_TIME_PER_KIB.saturating_mul(kib))
        .min(limit)
}

/// Reads `body` (at most `cap` bytes), calling `reserve` with each chunk's
/// size before keeping it; refused with 413 past the cap, 408 when it
/// comes too slowly (see [`allowed`]).
pub async fn read(
    mut body: Body,
    cap: usize,
    limit: Duration,
    reserve: &mut impl FnMut(usize) -> Result<(), ApiError>,
) -> Result<Vec<u8>, ApiError> {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut held = 0;
    loop {
        let wait = allowed(out.len(), limit);
        let frame = match tokio::time::timeout_at(started + wait, body.frame()).await {
            Ok(Some(frame)) => frame.map_err(|e| ApiError::BadMessage {
                message_type: "Connect request body",
                message: e.to_string(),
            })?,
            Ok(None) => return Ok(out),
            Err(_) => return Err(ApiError::BodyTimeout { timeout: wait }),
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if out.len().saturating_add(data.len()) > cap {
            return Err(ApiError::TooLarge { limit: cap });
        }
        append_reserved(&mut out, &data, cap, &mut held, reserve)?;
    }
}

/// Inflates the gzip `body` to at most `cap` bytes, calling `reserve`
/// before each step of output is kept. A body labelled gzip that is not
/// gzip is taken as it is, as some clients label plain bodies.
pub fn inflate(
    body: Vec<u8>,
    cap: usize,
    reserve: &mut impl FnMut(usize) -> Result<(), ApiError>,
) -> Result<Vec<u8>, ApiError> {
    if !kiln_pprof::is_gzip(&body) {
        return Ok(body);
    }
    let mut decoder = flate2::read::MultiGzDecoder::new(body.as_slice());
    let mut out = Vec::new();
    let mut held = 0;
    let mut step = vec![0u8; INFLATE_STEP_BYTES];
    loop {
        let read = decoder.read(&mut step).map_err(|e| ApiError::BadGzip {
            message: e.to_string(),
        })?;
        if read == 0 {
            return Ok(out);
        }
        if out.len() + read > cap {
            return Err(ApiError::TooLarge { limit: cap });
        }
        append_reserved(&mut out, &step[..read], cap, &mut held, reserve)?;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_cap_having_reserved_what_it_kept() {
        // The shape of a hostile LabelNames body: 16 million `0,` in a list.
        let mut json = b"{\"x\":[".to_vec();
        json.extend(b"0,".repeat(16_000_000));
        json.extend(b"0]}");
        let bomb = gzip(&json);
        println!("{} bytes gzipped to {}", json.len(), bomb.len());
        let mut reserved = 0usize;
        let err = inflate(bomb, MAX_QUERY_BODY_BYTES, &mut |bytes| {
            reserved += bytes;
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(err, ApiError::TooLarge { .. }), "{err}");
        assert_eq!(err.http_status(), 413);
        assert!(reserved <= MAX_QUERY_BODY_BYTES, "{reserved}");
    }

    #[test]
    fn inflating_is_refused_when_the_budget_is_spent() {
        let body = gzip(&vec![b'a'; 200 << 10]);
        let mut left = 64usize << 10;
        let err = inflate(body, MAX_QUERY_BODY_BYTES, &mut |bytes| {
            left = left.checked_sub(bytes).ok_or(ApiError::QueryMemoryBusy {
                bytes: bytes as u64,
                budget: 64 << 10,
            })?;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.http_status(), 429, "{err}");
        let plain = inflate(b"{}".to_vec(), 10, &mut |_| Ok(())).unwrap();
        assert_eq!(plain, b"{}", "not gzip: taken as it is");
        let small = inflate(gzip(b"{\"a\":1}"), 100, &mut |_| Ok(())).unwrap();
        assert_eq!(small, b"{\"a\":1}");
    }

    #[tokio::test]
    async fn bodies_are_reserved_as_they_arrive_and_capped() {
        let mut reserved = 0usize;
        let body = read(
            Body::from(vec![1u8; 1000]),
            1000,
            Duration::from_secs(60),
            &mut |bytes| {
                reserved += bytes;
                Ok(())
            },
        )
        .await
        .unwrap();
        assert_eq!((body.len(), reserved), (1000, 1000));
        let err = read(
            Body::from(vec![1u8; 1001]),
            1000,
            Duration::from_secs(60),
            &mut |_| Ok(()),
        )
        .await
        .unwrap_err();
        assert_eq!(err.http_status(), 413, "{err}");
    }

    #[test]
    fn the_time_a_body_may_take_grows_with_what_arrived() {
        let limit = Duration::from_secs(60);
        assert_eq!(allowed(0, limit), BODY_GRACE);
        assert_eq!(allowed(100 << 10, limit), Duration::from_secs(7));
        assert_eq!(allowed(usize::MAX, limit), limit);
        assert_eq!(allowed(0, Duration::from_secs(1)), Duration::from_secs(1));
        assert!(allowed(MAX_QUERY_BODY_BYTES, limit) < Duration::from_secs(30));
    }

    #[test]
    fn only_gzip_and_identity_are_read() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            content_encoding(&headers).unwrap(),
            ContentEncoding::Identity
        );
        headers.insert(header::CONTENT_ENCODING, "GZIP".parse().unwrap());
        assert_eq!(content_encoding(&headers).unwrap(), ContentEncoding::Gzip);
        headers.insert(header::CONTENT_ENCODING, "br".parse().unwrap());
        assert_eq!(content_encoding(&headers).unwrap_err().http_status(), 415);
    }
}
