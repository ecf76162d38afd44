//! A request body: read whole within its size and time limits, then its
//! `Content-Encoding` (gzip or identity) undone within the same size limit.
//!
//! The `_reserving` forms ask a memory budget for every byte before they
//! keep it: the body as it arrives, and its inflated form as the output
//! grows. Reserving a multiple of the declared (compressed) length instead
//! let a 33 KB gzip body inflate to 32 MiB against a 66 KB reservation, and
//! a body without a length held the largest reservation for as long as it
//! trickled in.

use std::io::Read;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use http_body_util::BodyExt as _;

use crate::error::ApiError;

/// Bodies are reserved and inflated in steps of this size: small enough
/// that a refusal comes early, large enough that the budget's rounding
/// (it counts whole KiB) costs little.
const STEP_BYTES: usize = 64 << 10;

/// Appends `data` to `out`, which holds `held` bytes of a budget: when
/// `out` must grow, the growth (double its capacity, at least a step, at
/// most `cap` or what `data` needs) is asked of `reserve` before it is
/// allocated. A `Vec` left to grow by itself doubles past what was
/// reserved, so a buffer reserved by the bytes it holds could take twice
/// its reservation; here its capacity never passes `held`.
pub fn append_reserved<E>(
    out: &mut Vec<u8>,
    data: &[u8],
    cap: usize,
    held: &mut usize,
    reserve: &mut dyn FnMut(usize) -> Result<(), E>,
) -> Result<(), E> {
    let len = out.len().saturating_add(data.len());
    if len > out.capacity() {
        let capacity = out
            .capacity()
            .saturating_mul(2)
            .max(STEP_BYTES)
            .min(cap)
            .max(len);
        if capacity > *held {
            reserve(capacity - *held)?;
            *held = capacity;
        }
        out.reserve_exact(capacity - out.len());
    }
    out.extend_from_slice(data);
    Ok(())
}

/// [`read_body`], asking `reserve` for the bytes before they are kept, so
/// that a request holds of the budget only what it has sent.
pub async fn read_body_reserving<E: Into<ApiError>>(
    body: Body,
    limit: usize,
    timeout: Duration,
    reserve: &mut (dyn FnMut(usize) -> Result<(), E> + Send),
) -> Result<Vec<u8>, ApiError> {
    let mut held = 0;
    let read = async {
        let mut body = body;
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ApiError::TooLarge { limit })?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let len = out.len().saturating_add(data.len());
            if len > limit {
                return Err(ApiError::TooLarge { limit });
            }
            append_reserved(&mut out, &data, limit, &mut held, reserve).map_err(Into::into)?;
        }
        Ok(out)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(ApiError::BodyTimeout { timeout }),
    }
}

/// [`decode_content_encoding`], asking `reserve` for the inflated bytes as
/// they come out, before they are kept; the input was reserved as it was
/// read.
pub fn decode_content_encoding_reserving<E: Into<ApiError>>(
    headers: &HeaderMap,
    body: Vec<u8>,
    limit: usize,
    reserve: &mut dyn FnMut(usize) -> Result<(), E>,
) -> Result<Vec<u8>, ApiError> {
    match encoding(headers)? {
        Encoding::Gzip if kiln_pprof::is_gzip(&body) => {
            Ok(inflate_reserving(&body, limit, reserve)?)
        }
        Encoding::Identity | Encoding::Gzip => Ok(body),
    }
}

/// Why [`inflate_reserving`] stopped.
#[derive(Debug)]
pub enum InflateError<E> {
    /// The budget refused the next step.
    Reserve(E),
    /// The output passed the limit.
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The input is not valid gzip.
    Corrupt(std::io::Error),
}

impl<E: Into<ApiError>> From<InflateError<E>> for ApiError {
    fn from(error: InflateError<E>) -> Self {
        match error {
            InflateError::Reserve(error) => error.into(),
            InflateError::TooLarge { limit } => ApiError::TooLarge { limit },
            InflateError::Corrupt(error) => ApiError::BadGzip {
                message: error.to_string(),
            },
        }
    }
}

/// Inflates gzip `input` (several members, as `gzip` writes them when
/// concatenated), at most `limit` bytes, asking `reserve` for each step of
/// output before it is kept: a bomb stops at the budget or the limit,
/// whichever comes first, having held only what it inflated.
pub fn inflate_reserving<E>(
    input: &[u8],
    limit: usize,
    reserve: &mut dyn FnMut(usize) -> Result<(), E>,
) -> Result<Vec<u8>, InflateError<E>> {
    let mut decoder = flate2::read::MultiGzDecoder::new(input);
    let mut out = Vec::new();
    let mut held = 0usize;
    let mut step = vec![0u8; STEP_BYTES];
    loop {
        let read = decoder.read(&mut step).map_err(InflateError::Corrupt)?;
        if read == 0 {
            return Ok(out);
        }
        if out.len().saturating_add(read) > limit {
            return Err(InflateError::TooLarge { limit });
        }
        append_reserved(&mut out, &step[..read], limit, &mut held, reserve)
            .map_err(InflateError::Reserve)?;
    }
}

/// The `Content-Encoding`s a body may have.
enum Encoding {
    Identity,
    Gzip,
}

fn encoding(headers: &HeaderMap) -> Result<Encoding, ApiError> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    match encoding.as_str() {
        "" | "identity" => Ok(Encoding::Identity),
        // Some clients label an already-gzipped pprof with this header
        // and some gzip the body for transport; only real gzip is inflated.
        "gzip" | "x-gzip" => Ok(Encoding::Gzip),
        other => Err(ApiError::UnsupportedEncoding {
            encoding: other.chars().take(40).collect(),
        }),
    }
}

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
    match encoding(headers)? {
        Encoding::Gzip if kiln_pprof::is_gzip(&body) => gunzip_bounded(&body, limit),
        Encoding::Identity | Encoding::Gzip => Ok(body),
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
    fn inflating_reserves_the_output_as_it_grows_and_stops_at_the_budget() {
        let data = vec![7u8; 1 << 20];
        let mut reserved = 0usize;
        let out = decode_content_encoding_reserving(
            &headers("gzip"),
            gzip(&data),
            2 << 20,
            &mut |bytes| {
                reserved += bytes;
                Ok::<(), ApiError>(())
            },
        )
        .unwrap();
        assert_eq!(out, data);
        assert!(
            reserved >= data.len() && reserved < data.len() + 2 * STEP_BYTES,
            "{reserved}"
        );
        assert!(
            out.capacity() <= reserved,
            "the buffer never outgrows its reservation: {} of {reserved}",
            out.capacity()
        );
        // A bomb against a small budget stops at the budget, not the limit.
        let mut budget = 256usize << 10;
        let err = decode_content_encoding_reserving(
            &headers("gzip"),
            gzip(&vec![0u8; 32 << 20]),
            32 << 20,
            &mut |bytes| {
                budget = budget.checked_sub(bytes).ok_or(ApiError::Overloaded {
                    kind: "ingest",
                    limit: 0,
                })?;
                Ok::<(), ApiError>(())
            },
        )
        .unwrap_err();
        assert_eq!(err.reason(), "overloaded", "{err}");
    }

    #[tokio::test]
    async fn reading_reserves_what_arrived() {
        let mut reserved = 0usize;
        let body = read_body_reserving(
            Body::from(vec![1u8; 100_000]),
            1 << 20,
            Duration::from_secs(5),
            &mut |bytes| {
                reserved += bytes;
                Ok::<(), ApiError>(())
            },
        )
        .await
        .unwrap();
        assert_eq!(body.len(), 100_000);
        assert!(
            (100_000..100_000 + STEP_BYTES).contains(&reserved),
            "{reserved}"
        );
        let err = read_body_reserving(
            Body::from(vec![1u8; 100_000]),
            1000,
            Duration::from_secs(5),
            &mut |_| Ok::<(), ApiError>(()),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ApiError::TooLarge { limit: 1000 }), "{err}");
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
