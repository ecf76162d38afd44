//! Compressed (timestamp ms, value) columns for one (series, stack key).
//!
//! Two codecs, chosen per column by size: `tsz-compress` (delta coding of
//! both columns, the Gorilla idea) and plain zigzag varints of timestamp
//! deltas and values. tsz writes a 4-byte row count and the first rows at
//! full width, so for the short columns that dominate profiling data (a
//! stack seen in a handful of profiles) varints are smaller; tsz wins on
//! long, regular columns.

use tsz_compress::prelude::*;

use crate::wire::{Reader, Writer};

const CODEC_VARINT: u8 = 0;
const CODEC_TSZ: u8 = 1;
/// Shorter columns are not worth trying tsz on.
const TSZ_MIN_POINTS: usize = 16;
/// tsz deltas are `i64`; keeping inputs within ±2^62 keeps every delta in range.
const TSZ_SAFE: i64 = 1 << 62;

mod tsz_row {
    // The derives generate code we do not control; keep our lints off it.
    #![allow(missing_debug_implementations, missing_docs, clippy::all)]
    use tsz_compress::prelude::*;

    /// One (time offset, value) row as tsz sees it.
    #[derive(Copy, Clone, CompressV2, DecompressV2)]
    pub struct PointRow {
        pub ts: i64,
        pub value: i64,
    }

    pub use compress::PointRowCompressorImpl;
    pub use decompress::PointRowDecompressorImpl;
}

use tsz_row::{PointRow, PointRowCompressorImpl, PointRowDecompressorImpl};

/// Why a column could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColumnCorrupt;

/// Appends `points` (sorted by time, unique times) to `out`, times relative to `base_ms`.
pub(crate) fn encode_points(points: &[(i64, i64)], base_ms: i64, out: &mut Writer) {
    let mut varint = Writer::new();
    encode_varint(points, base_ms, &mut varint);
    let tsz = if points.len() >= TSZ_MIN_POINTS {
        encode_tsz(points, base_ms)
    } else {
        None
    };
    out.varint(points.len() as u64);
    match tsz {
        Some(bytes) if bytes.len() < varint.len() => {
            out.byte(CODEC_TSZ);
            out.bytes(&bytes);
        }
        _ => {
            out.byte(CODEC_VARINT);
            out.bytes(varint.as_slice());
        }
    }
}

fn encode_varint(points: &[(i64, i64)], base_ms: i64, out: &mut Writer) {
    let mut previous = base_ms;
    for &(ts, value) in points {
        out.signed(ts.wrapping_sub(previous));
        out.signed(value);
        previous = ts;
    }
}

fn encode_tsz(points: &[(i64, i64)], base_ms: i64) -> Option<Vec<u8>> {
    let safe = |v: i64| (-TSZ_SAFE..TSZ_SAFE).contains(&v);
    let mut compressor = PointRowCompressorImpl::new(points.len());
    for &(ts, value) in points {
        let offset = ts.checked_sub(base_ms)?;
        if !safe(offset) || !safe(value) {
            return None;
        }
        compressor.compress(PointRow { ts: offset, value });
    }
    Some(compressor.finish())
}

/// Reads a column written by [`encode_points`], calling `each(ts, value)`.
pub(crate) fn decode_points(
    reader: &mut Reader<'_>,
    base_ms: i64,
    mut each: impl FnMut(i64, i64),
) -> Result<(), ColumnCorrupt> {
    let count = reader.varint().map_err(|_| ColumnCorrupt)?;
    let codec = reader.byte().map_err(|_| ColumnCorrupt)?;
    let payload = reader.bytes().map_err(|_| ColumnCorrupt)?;
    match codec {
        CODEC_VARINT => {
            let mut r = Reader::new(payload);
            let mut previous = base_ms;
            for _ in 0..count {
                let ts = previous.wrapping_add(r.signed().map_err(|_| ColumnCorrupt)?);
                let value = r.signed().map_err(|_| ColumnCorrupt)?;
                each(ts, value);
                previous = ts;
            }
            if !r.is_empty() {
                return Err(ColumnCorrupt);
            }
        }
        CODEC_TSZ => {
            let mut decompressor = PointRowDecompressorImpl::new();
            decompressor
                .decompress(payload)
                .map_err(|_| ColumnCorrupt)?;
            let (ts, values) = (decompressor.col_ts(), decompressor.col_value());
            if ts.len() as u64 != count || values.len() != ts.len() {
                return Err(ColumnCorrupt);
            }
            for (&offset, &value) in ts.iter().zip(values) {
                each(base_ms.wrapping_add(offset), value);
            }
        }
        _ => return Err(ColumnCorrupt),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn round_trip(points: &[(i64, i64)], base: i64) -> Vec<(i64, i64)> {
        let mut w = Writer::new();
        encode_points(points, base, &mut w);
        let bytes = w.into_vec();
        let mut r = Reader::new(&bytes);
        let mut out = Vec::new();
        decode_points(&mut r, base, |t, v| out.push((t, v))).unwrap();
        assert!(r.is_empty());
        out
    }

    #[test]
    fn long_regular_column_uses_tsz_and_is_smaller_than_varints() {
        let points: Vec<(i64, i64)> = (0..1000)
            .map(|i| (1_700_000_000_000 + i * 10_000, 10_000_000 + (i % 7) * 3))
            .collect();
        let base = 1_700_000_000_000;
        let mut w = Writer::new();
        encode_points(&points, base, &mut w);
        let mut varint = Writer::new();
        encode_varint(&points, base, &mut varint);
        assert!(w.len() < varint.len(), "{} vs {}", w.len(), varint.len());
        assert_eq!(w.as_slice()[2], CODEC_TSZ);
        assert_eq!(round_trip(&points, base), points);
    }

    #[test]
    fn extreme_values_fall_back_to_varints() {
        let points: Vec<(i64, i64)> = (0..40)
            .map(|i| (i, if i % 2 == 0 { i64::MAX } else { i64::MIN }))
            .collect();
        assert_eq!(round_trip(&points, 0), points);
    }

    proptest! {
        #[test]
        fn columns_round_trip(
            base in -1_000_000_000_000i64..2_000_000_000_000,
            deltas in proptest::collection::vec(
                (1i64..100_000, prop_oneof![any::<i64>(), -1000i64..1000, 0i64..100_000_000]),
                0..200,
            ),
        ) {
            let mut ts = base;
            let points: Vec<(i64, i64)> = deltas
                .into_iter()
                .map(|(d, v)| { ts += d; (ts, v) })
                .collect();
            prop_assert_eq!(round_trip(&points, base), points);
        }

        #[test]
        fn corrupt_columns_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes);
            let _ = decode_points(&mut r, 0, |_, _| {});
        }
    }
}
