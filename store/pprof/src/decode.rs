//! Turning untrusted bytes into a validated [`Profile`].

mod gunzip;

use std::borrow::Cow;

use prost::Message;

use crate::error::PprofError;
use crate::flat::FlatProfile;
use crate::limits::DecodeLimits;
use crate::prescan::TableCounts;
use crate::profile::Profile;
use crate::proto;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

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
    gunzip::gunzip(input, max_decompressed_bytes).map(Cow::Owned)
}

/// Decodes a pprof profile (gzipped or plain protobuf) and validates it.
pub fn decode(input: &[u8], limits: &DecodeLimits) -> Result<Profile, PprofError> {
    match decode_reserving(input, limits, |_| Ok::<(), std::convert::Infallible>(())) {
        Ok(result) => result,
        Err(never) => match never {},
    }
}

/// [`decode`], asking `reserve` for memory before each step that allocates
/// in proportion to the input: the inflate's buffer before it is allocated
/// and before each time it grows, and the decoded
/// size estimated from the wire before prost decodes. When `reserve`
/// refuses, decoding stops there with its error (the outer `Err`); the
/// inner result is the decoder's own verdict. The caller keeps what it
/// reserved until the returned profile is dropped.
pub fn decode_reserving<E>(
    input: &[u8],
    limits: &DecodeLimits,
    reserve: impl FnMut(usize) -> Result<(), E>,
) -> Result<Result<Profile, PprofError>, E> {
    Ok(
        inflate_and_scan(input, limits, reserve)?.and_then(|(protobuf, _)| {
            proto::Profile::decode(protobuf.as_ref())
                .map_err(|source| PprofError::Protobuf { source })
                .and_then(|raw| Profile::validate(raw, limits))
        }),
    )
}

/// [`decode`] into a [`FlatProfile`]: the same limits, checks and errors
/// (malformed framing is [`PprofError::Wire`] rather than prost's
/// [`PprofError::Protobuf`]; both are `not_protobuf`), without building a
/// prost message tree.
pub fn decode_flat(input: &[u8], limits: &DecodeLimits) -> Result<FlatProfile, PprofError> {
    match decode_flat_reserving(input, limits, |_| Ok::<(), std::convert::Infallible>(())) {
        Ok(result) => result,
        Err(never) => match never {},
    }
}

/// [`decode_reserving`] into a [`FlatProfile`]; reserves the same amounts
/// (the flat tables take less than the prost estimate it reserves).
pub fn decode_flat_reserving<E>(
    input: &[u8],
    limits: &DecodeLimits,
    reserve: impl FnMut(usize) -> Result<(), E>,
) -> Result<Result<FlatProfile, PprofError>, E> {
    Ok(inflate_and_scan(input, limits, reserve)?
        .and_then(|(protobuf, tables)| crate::flat::parse(protobuf.as_ref(), limits, tables)))
}

/// An inflated protobuf that passed the wire scan, with its tables' counts.
type Scanned<'i> = (Cow<'i, [u8]>, TableCounts);

/// The steps both decoders share: the input's size, inflating within the
/// limit and the wire scan, reserving before each. Returns the protobuf
/// and its tables' counts.
fn inflate_and_scan<'i, E>(
    input: &'i [u8],
    limits: &DecodeLimits,
    mut reserve: impl FnMut(usize) -> Result<(), E>,
) -> Result<Result<Scanned<'i>, PprofError>, E> {
    if input.len() > limits.max_input_bytes {
        return Ok(Err(PprofError::InputTooLarge {
            size: input.len(),
            limit: limits.max_input_bytes,
        }));
    }
    let protobuf = if is_gzip(input) {
        match gunzip::gunzip_reserving(input, limits.max_decompressed_bytes, &mut reserve)? {
            Ok(inflated) => Cow::Owned(inflated),
            Err(err) => return Ok(Err(err)),
        }
    } else {
        Cow::Borrowed(input)
    };
    let (decoded_bytes, tables) =
        match crate::prescan::check_profile_wire_counted(protobuf.as_ref(), limits) {
            Ok(scan) => scan,
            Err(err) => return Ok(Err(err)),
        };
    reserve(decoded_bytes)?;
    Ok(Ok((protobuf, tables)))
}

/// Checks a profile built in memory rather than decoded from bytes (folded
/// text, an upload the server edited) by every limit [`decode`] applies
/// while reading bytes, then validates it. Returns it with its estimated
/// decoded size, the figure [`decode_reserving`] would have reserved. Its
/// encoding, when no longer than `max_input_bytes`, decodes to the same
/// profile under the same limits.
pub fn validate_message(
    raw: proto::Profile,
    limits: &DecodeLimits,
) -> Result<(Profile, usize), PprofError> {
    let decoded_bytes = crate::prescan::check_profile_message(&raw, limits)?;
    Ok((Profile::validate(raw, limits)?, decoded_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoded profile handed back as a message, edited and checked
    /// again, encodes to bytes that decode to the same profile: what the
    /// store logs for an upload the server decoded once and edited.
    #[test]
    fn a_profile_back_as_a_message_validates_to_what_its_encoding_decodes_to() {
        let mut builder = crate::ProfileBuilder::new(&[("alloc_space", "bytes")]);
        let f = builder.function(&crate::FunctionSpec {
            name: "grow".into(),
            ..Default::default()
        });
        let loc = builder.location(0, 0x10, &[(f, 3)]);
        builder.sample(&[loc], &[64], &[("k", crate::LabelValue::Str("v".into()))]);
        let limits = DecodeLimits::default();
        let decoded = decode(&crate::encode_gzip(&builder.finish()), &limits).expect("decodes");
        let strings = decoded.strings().to_vec();
        let mut raw = decoded.into_raw();
        raw.sample[0].value[0] = 8;
        let encoded = raw.encode_to_vec();
        let (edited, estimate) = validate_message(raw, &limits).expect("still valid");
        let read_back = decode(&encoded, &limits).expect("its encoding decodes");
        assert_eq!(edited.strings(), strings.as_slice());
        assert_eq!(read_back.strings(), edited.strings());
        assert_eq!(read_back.raw(), edited.raw());
        assert_eq!(edited.samples()[0].value, [8]);
        let wire = crate::prescan::check_profile_wire(&encoded, &limits).expect("fits");
        assert_eq!(estimate, wire);
    }
}
