//! Turning untrusted bytes into a validated [`Profile`].

use std::borrow::Cow;
use std::io::Read;

use prost::Message;

use crate::error::PprofError;
use crate::profile::Profile;
use crate::proto;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Bounds on what one profile may cost to decode. Every bound is checked
/// before the memory it guards is committed, so hostile input fails fast.
#[derive(Debug, Clone)]
pub struct DecodeLimits {
    /// Largest accepted input, compressed or not.
    pub max_input_bytes: usize,
    /// Largest accepted protobuf after decompression.
    pub max_decompressed_bytes: usize,
    /// Most samples in one profile.
    pub max_samples: usize,
    /// Most sample types (values per sample).
    pub max_sample_types: usize,
    /// Most frames in one sample's stack.
    pub max_stack_depth: usize,
    /// Most labels on one sample.
    pub max_labels_per_sample: usize,
    /// Longest single string in the string table.
    pub max_string_bytes: usize,
    /// Most entries in each of the location, function, mapping and string tables.
    pub max_table_entries: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_input_bytes: 32 << 20,
            max_decompressed_bytes: 64 << 20,
            max_samples: 2_000_000,
            max_sample_types: 32,
            max_stack_depth: 4096,
            max_labels_per_sample: 64,
            max_string_bytes: 64 << 10,
            max_table_entries: 4_000_000,
        }
    }
}

/// Returns true when `input` starts with the gzip magic bytes.
pub fn is_gzip(input: &[u8]) -> bool {
    input.starts_with(&GZIP_MAGIC)
}

/// Decompresses `input` if it is gzip (sniffed from its magic bytes, never a
/// file name), refusing to inflate past `max_decompressed_bytes`.
pub fn maybe_gunzip(
    input: &[u8],
    max_decompressed_bytes: usize,
) -> Result<Cow<'_, [u8]>, PprofError> {
    if !is_gzip(input) {
        return Ok(Cow::Borrowed(input));
    }
    let mut decoder = flate2::read::MultiGzDecoder::new(input);
    let mut out = Vec::with_capacity(inflated_size_hint(input).min(max_decompressed_bytes));
    // Read one byte past the limit so that "exactly at the limit" and "over it" differ.
    let cap = u64::try_from(max_decompressed_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    (&mut decoder)
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|source| PprofError::Gzip { source })?;
    if out.len() > max_decompressed_bytes {
        return Err(PprofError::DecompressedTooLarge {
            limit: max_decompressed_bytes,
        });
    }
    Ok(Cow::Owned(out))
}

/// How much to reserve for inflating `gzip`: the size its trailer records
/// (ISIZE, exact for the usual single-member file), but never more than 64
/// times the input, since the trailer is untrusted.
///
/// NB: pprof protobuf typically inflates 5 to 10 times, so guessing a fixed
/// ratio made most profiles regrow (and copy) the buffer once or twice.
fn inflated_size_hint(gzip: &[u8]) -> usize {
    let recorded = gzip
        .len()
        .checked_sub(4)
        .and_then(|at| gzip.get(at..))
        .and_then(|tail| <[u8; 4]>::try_from(tail).ok())
        .map_or(0, |trailer| u32::from_le_bytes(trailer) as usize);
    recorded.min(gzip.len().saturating_mul(64))
}

/// Decodes a pprof profile (gzipped or plain protobuf) and validates it.
pub fn decode(input: &[u8], limits: &DecodeLimits) -> Result<Profile, PprofError> {
    if input.len() > limits.max_input_bytes {
        return Err(PprofError::InputTooLarge {
            size: input.len(),
            limit: limits.max_input_bytes,
        });
    }
    let protobuf = maybe_gunzip(input, limits.max_decompressed_bytes)?;
    check_table_sizes(protobuf.as_ref(), limits)?;
    let raw = proto::Profile::decode(protobuf.as_ref())
        .map_err(|source| PprofError::Protobuf { source })?;
    Profile::validate(raw, limits)
}

/// Counts the entries of the profile's repeated top-level fields straight
/// from the wire, before prost allocates anything for them.
///
/// NB: an empty `Sample` costs two bytes on the wire but about 72 bytes once
/// decoded, so without this pre-scan a small input could still allocate
/// gigabytes. Malformed framing is left for prost to report.
fn check_table_sizes(protobuf: &[u8], limits: &DecodeLimits) -> Result<(), PprofError> {
    let mut counts = [0usize; 7];
    let mut rest = protobuf;
    while !rest.is_empty() {
        let Some((key, after_key)) = read_varint(rest) else {
            return Ok(());
        };
        let field = key >> 3;
        let skipped = match key & 7 {
            0 => read_varint(after_key).map(|(_, r)| r),
            1 => after_key.get(8..),
            2 => read_varint(after_key).and_then(|(len, r)| r.get(usize::try_from(len).ok()?..)),
            5 => after_key.get(4..),
            _ => None,
        };
        let Some(after_field) = skipped else {
            return Ok(());
        };
        if let Some(count) = usize::try_from(field).ok().and_then(|f| counts.get_mut(f)) {
            *count += 1;
        }
        rest = after_field;
    }
    let checks = [
        ("samples", counts[2], limits.max_samples),
        ("mappings", counts[3], limits.max_table_entries),
        ("locations", counts[4], limits.max_table_entries),
        ("functions", counts[5], limits.max_table_entries),
        ("strings", counts[6], limits.max_table_entries),
    ];
    for (what, count, limit) in checks {
        if count > limit {
            return Err(PprofError::LimitExceeded { what, count, limit });
        }
    }
    Ok(())
}

fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(plain: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(2));
        encoder
            .write_all(plain)
            .expect("writing to a Vec cannot fail");
        encoder.finish().expect("writing to a Vec cannot fail")
    }

    #[test]
    fn size_hint_is_the_trailer_size_but_never_above_64_times_the_input() {
        let plain: Vec<u8> = (0..5000u32).map(|i| (i * i % 251) as u8).collect();
        let packed = gzip(&plain);
        assert_eq!(inflated_size_hint(&packed), 5000);
        let mut lying = packed.clone();
        let at = lying.len() - 4;
        lying[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(inflated_size_hint(&lying), lying.len() * 64);
        assert_eq!(inflated_size_hint(&[0x1f, 0x8b]), 0);
        // A lying trailer is reported as a gzip error, never trusted.
        assert!(matches!(
            maybe_gunzip(&lying, 1 << 20),
            Err(PprofError::Gzip { .. })
        ));
        assert_eq!(
            maybe_gunzip(&packed, 1 << 20).expect("valid gzip").as_ref(),
            plain.as_slice()
        );
    }
}
