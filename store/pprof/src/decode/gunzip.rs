//! Inflating a gzipped upload within a limit.
//!
//! Two decoders, one verdict. libdeflate inflates a whole single-member
//! gzip file into a buffer of the size its trailer announces, about 30 %
//! faster than a streaming inflate on the store's profiles (inflate was
//! half of decode's CPU). It only ever answers "here is the output" for
//! input that is a valid gzip member, whose CRC and length it checked, and
//! that ends where the input ends. Everything else (a lying trailer, a
//! corrupt or truncated stream, several members, an empty output, output
//! over the limit) goes to the streaming decoder, whose errors and limit
//! are the ones callers and tests have always seen. So libdeflate changes
//! how fast a good upload inflates, never what is accepted or refused. A
//! hostile input costs at most two inflates up to the cap, one buffer at a
//! time: the first is freed before the stream starts.

use std::io::Read;

use crate::error::PprofError;

/// Inflates `gzip` (already sniffed as gzip), refusing to inflate past
/// `max_decompressed_bytes`.
pub(super) fn gunzip(gzip: &[u8], max_decompressed_bytes: usize) -> Result<Vec<u8>, PprofError> {
    let announced = inflated_size_hint(gzip);
    if announced > 0
        && announced <= max_decompressed_bytes
        && let Some(out) = whole_member(gzip, announced)
    {
        return Ok(out);
    }
    streaming(gzip, max_decompressed_bytes)
}

/// How much to reserve for inflating `gzip`: the size its trailer records
/// (ISIZE, exact for the usual single-member file). Callers cap it at the
/// inflate limit; the trailer is untrusted, but a lie only costs address
/// space (untouched capacity is not resident) up to that cap.
///
/// NB: pprof protobuf typically inflates 5 to 10 times, and hostile input
/// a thousand times, so guessing from the input size made the buffer regrow
/// (and copy) until the peak was three times the inflated size: 96 MiB for
/// a hostile 32 MiB profile (one sample with millions of empty labels).
pub(super) fn inflated_size_hint(gzip: &[u8]) -> usize {
    gzip.len()
        .checked_sub(4)
        .and_then(|at| gzip.get(at..))
        .and_then(|tail| <[u8; 4]>::try_from(tail).ok())
        .map_or(0, |trailer| u32::from_le_bytes(trailer) as usize)
}

/// The streaming decoder: every member, read one byte past the limit so
/// that "exactly at the limit" and "over it" differ.
fn streaming(gzip: &[u8], max_decompressed_bytes: usize) -> Result<Vec<u8>, PprofError> {
    let mut decoder = flate2::read::MultiGzDecoder::new(gzip);
    let mut out =
        Vec::with_capacity(inflated_size_hint(gzip).min(max_decompressed_bytes.saturating_add(1)));
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
    Ok(out)
}

/// The output of `gzip` when it is exactly one valid member that inflates
/// to `announced` bytes; `None` for anything else.
fn whole_member(gzip: &[u8], announced: usize) -> Option<Vec<u8>> {
    DECOMPRESSOR.with(|decompressor| {
        let decompressor = decompressor.as_ref()?;
        let mut out = Vec::<u8>::with_capacity(announced);
        let (mut read, mut written) = (0usize, 0usize);
        // SAFETY: the decompressor is live and used by this thread only; the
        // input pointer and length are those of a slice; the output is the
        // vector's own capacity, `announced` bytes, which libdeflate never
        // writes past; the two result pointers are valid locals.
        let result = unsafe {
            libdeflate_sys::libdeflate_gzip_decompress_ex(
                decompressor.0.as_ptr(),
                gzip.as_ptr().cast(),
                gzip.len(),
                out.as_mut_ptr().cast(),
                announced,
                &raw mut read,
                &raw mut written,
            )
        };
        let whole = result == libdeflate_sys::libdeflate_result_LIBDEFLATE_SUCCESS
            && read == gzip.len()
            && written == announced;
        if !whole {
            return None;
        }
        // SAFETY: on success libdeflate wrote `written` bytes from the start
        // of the capacity, and `written == announced <= capacity`.
        unsafe { out.set_len(written) };
        Some(out)
    })
}

/// One libdeflate decompressor (about 11 KiB of tables) per thread,
/// allocated on first use; `None` if libdeflate could not allocate it.
struct Decompressor(std::ptr::NonNull<libdeflate_sys::libdeflate_decompressor>);

impl Decompressor {
    fn new() -> Option<Self> {
        // SAFETY: allocates a fresh decompressor; NULL means out of memory.
        std::ptr::NonNull::new(unsafe { libdeflate_sys::libdeflate_alloc_decompressor() }).map(Self)
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: the pointer came from libdeflate_alloc_decompressor and is
        // freed once, here.
        unsafe { libdeflate_sys::libdeflate_free_decompressor(self.0.as_ptr()) }
    }
}

thread_local! {
    static DECOMPRESSOR: Option<Decompressor> = Decompressor::new();
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

    fn plain() -> Vec<u8> {
        (0..50_000u32).map(|i| (i * i % 251) as u8).collect()
    }

    #[test]
    fn size_hint_is_the_trailer_size() {
        let plain: Vec<u8> = (0..5000u32).map(|i| (i * i % 251) as u8).collect();
        let packed = gzip(&plain);
        assert_eq!(inflated_size_hint(&packed), 5000);
        let mut lying = packed.clone();
        let at = lying.len() - 4;
        lying[at..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(inflated_size_hint(&lying), u32::MAX as usize);
        assert_eq!(inflated_size_hint(&[0x1f, 0x8b]), 0);
        // A lying trailer is reported as a gzip error, never trusted.
        assert!(matches!(
            gunzip(&lying, 1 << 20),
            Err(PprofError::Gzip { .. })
        ));
        assert_eq!(
            gunzip(&packed, 1 << 20).expect("valid gzip"),
            plain.as_slice()
        );
    }

    #[test]
    fn one_member_inflates_whole_and_matches_the_stream() {
        let plain = plain();
        let packed = gzip(&plain);
        assert_eq!(
            whole_member(&packed, plain.len()).as_deref(),
            Some(&plain[..])
        );
        assert_eq!(streaming(&packed, usize::MAX).expect("valid"), plain);
        assert_eq!(gunzip(&packed, plain.len()).expect("at the limit"), plain);
        assert!(matches!(
            gunzip(&packed, plain.len() - 1),
            Err(PprofError::DecompressedTooLarge { .. })
        ));
    }

    /// Anything but one whole valid member is the stream's to judge.
    #[test]
    fn what_is_not_one_whole_member_is_left_to_the_stream() {
        let plain = plain();
        let packed = gzip(&plain);
        // Two members: libdeflate would stop after the first.
        let mut two = packed.clone();
        two.extend_from_slice(&gzip(b"second"));
        assert_eq!(whole_member(&two, plain.len()), None);
        let mut both = plain.clone();
        both.extend_from_slice(b"second");
        assert_eq!(gunzip(&two, 1 << 20).expect("both members"), both);
        // A trailer announcing less than the output, or more.
        assert_eq!(whole_member(&packed, plain.len() - 1), None);
        assert_eq!(whole_member(&packed, plain.len() + 1), None);
        // A flipped byte inside the stream, and a cut one.
        let mut corrupt = packed.clone();
        corrupt[packed.len() / 2] ^= 0x55;
        assert_eq!(whole_member(&corrupt, plain.len()), None);
        assert!(matches!(
            gunzip(&corrupt, 1 << 20),
            Err(PprofError::Gzip { .. })
        ));
        let cut = &packed[..packed.len() - 9];
        assert_eq!(whole_member(cut, plain.len()), None);
        assert!(gunzip(cut, 1 << 20).is_err());
        // Trailing garbage after a member.
        let mut trailing = packed.clone();
        trailing.extend_from_slice(b"junk");
        assert_eq!(whole_member(&trailing, plain.len()), None);
    }

    proptest::proptest! {
        /// Whatever bytes are flipped, cut or appended, the two-decoder path
        /// gives the stream's own verdict: the same output, or an error
        /// where the stream errs.
        #[test]
        fn damaged_gzip_gets_the_streams_verdict(
            flips in proptest::collection::vec((0usize..1 << 16, 1u8..), 0..4),
            cut in 0usize..64,
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12),
            limit in 40_000usize..60_000,
        ) {
            let mut packed = gzip(&plain());
            for (at, mask) in flips {
                let at = at % packed.len();
                packed[at] ^= mask;
            }
            packed.truncate(packed.len().saturating_sub(cut));
            packed.extend_from_slice(&tail);
            match (gunzip(&packed, limit), streaming(&packed, limit)) {
                (Ok(fast), Ok(stream)) => proptest::prop_assert_eq!(fast, stream),
                (Err(_), Err(_)) => {}
                (fast, stream) => proptest::prop_assert!(
                    false,
                    "two-decoder path {:?} against the stream's {:?}",
                    fast.map(|out| out.len()),
                    stream.map(|out| out.len())
                ),
            }
        }
    }
}
