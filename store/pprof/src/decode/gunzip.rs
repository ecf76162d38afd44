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

/// Deflate expands its input at most about 1032 times (a run of one byte,
/// 258 bytes per code of a bit or two): a trailer announcing more for an
/// input of its length lies, and is believed only this far.
const MAX_DEFLATE_RATIO: usize = 1032;

/// Output buffers grow by at least this much at a time.
const MIN_GROWTH_BYTES: usize = 64 << 10;

/// Inflates `gzip` (already sniffed as gzip), refusing to inflate past
/// `max_decompressed_bytes`.
pub(super) fn gunzip(gzip: &[u8], max_decompressed_bytes: usize) -> Result<Vec<u8>, PprofError> {
    match gunzip_reserving(gzip, max_decompressed_bytes, &mut |_| {
        Ok::<(), std::convert::Infallible>(())
    }) {
        Ok(result) => result,
        Err(never) => match never {},
    }
}

/// [`gunzip`], asking `reserve` for every byte of output buffer before it
/// is allocated, so that what a request holds of the memory budget is what
/// its inflate holds, never less: the size the trailer announces (believed
/// only up to what the input could inflate to, and up to the limit) before
/// the one-shot inflate, then each growth of the streaming decoder's
/// buffer. A trailer that announces too little (zero, say) used to let the
/// stream inflate up to the limit against that small reservation, so a
/// handful of 64 KiB uploads in parallel held several times the budget; one
/// that announces too much reserved up to the limit for a body of a few
/// bytes. When `reserve` refuses, inflating stops there with its error
/// (the outer `Err`).
pub(super) fn gunzip_reserving<E>(
    gzip: &[u8],
    max_decompressed_bytes: usize,
    reserve: &mut impl FnMut(usize) -> Result<(), E>,
) -> Result<Result<Vec<u8>, PprofError>, E> {
    let announced = inflated_size_hint(gzip)
        .min(gzip.len().saturating_mul(MAX_DEFLATE_RATIO))
        .min(max_decompressed_bytes);
    if announced > 0 {
        reserve(announced)?;
        if let Some(out) = whole_member(gzip, announced) {
            return Ok(Ok(out));
        }
    }
    // The one-shot buffer is freed: the stream reuses its reservation.
    streaming_reserving(gzip, max_decompressed_bytes, announced, reserve)
}

/// The size `gzip`'s trailer records (ISIZE, exact for the usual
/// single-member file). The trailer is untrusted: [`gunzip_reserving`]
/// believes it only up to the limit and to what the input could inflate
/// to, and the stream's buffer grows past it only reserved.
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

/// The streaming decoder: every member, refused one step past the limit.
#[cfg(test)]
fn streaming(gzip: &[u8], max_decompressed_bytes: usize) -> Result<Vec<u8>, PprofError> {
    match streaming_reserving(gzip, max_decompressed_bytes, 0, &mut |_| {
        Ok::<(), std::convert::Infallible>(())
    }) {
        Ok(result) => result,
        Err(never) => match never {},
    }
}

/// The streaming decoder, its buffer's capacity never past what was
/// reserved: `held` bytes already, more asked of `reserve` before each
/// growth (doubling, so the copies stay linear), never past the limit.
fn streaming_reserving<E>(
    gzip: &[u8],
    max_decompressed_bytes: usize,
    mut held: usize,
    reserve: &mut impl FnMut(usize) -> Result<(), E>,
) -> Result<Result<Vec<u8>, PprofError>, E> {
    let mut decoder = flate2::read::MultiGzDecoder::new(gzip);
    let mut out: Vec<u8> = Vec::new();
    let mut step = vec![0u8; MIN_GROWTH_BYTES];
    loop {
        let read = match decoder.read(&mut step) {
            Ok(0) => return Ok(Ok(out)),
            Ok(read) => read,
            Err(source) => return Ok(Err(PprofError::Gzip { source })),
        };
        let len = out.len().saturating_add(read);
        if len > max_decompressed_bytes {
            return Ok(Err(PprofError::DecompressedTooLarge {
                limit: max_decompressed_bytes,
            }));
        }
        if len > out.capacity() {
            let capacity = out
                .capacity()
                .saturating_mul(2)
                .max(len)
                .max(MIN_GROWTH_BYTES)
                .min(max_decompressed_bytes);
            if capacity > held {
                reserve(capacity - held)?;
                held = capacity;
            }
            out.reserve_exact(capacity - out.len());
        }
        out.extend_from_slice(&step[..read]);
    }
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

    /// Adds up what is reserved, refusing past `budget`; records each ask.
    struct Budget {
        budget: usize,
        reserved: usize,
        asks: Vec<usize>,
    }

    impl Budget {
        fn new(budget: usize) -> Self {
            Self {
                budget,
                reserved: 0,
                asks: Vec::new(),
            }
        }

        fn reserve(&mut self, bytes: usize) -> Result<(), usize> {
            self.asks.push(bytes);
            if self.reserved + bytes > self.budget {
                return Err(self.reserved + bytes);
            }
            self.reserved += bytes;
            Ok(())
        }
    }

    fn with_trailer(mut packed: Vec<u8>, announced: u32) -> Vec<u8> {
        let at = packed.len() - 4;
        packed[at..].copy_from_slice(&announced.to_le_bytes());
        packed
    }

    /// A trailer that announces too little cannot make the stream inflate
    /// past the budget: each growth is asked for before it is made, so a
    /// bomb is refused part way, having held no more than its reservation.
    #[test]
    fn a_trailer_announcing_too_little_is_reserved_for_as_the_stream_grows() {
        let plain = vec![7u8; 4 << 20];
        let lying = with_trailer(gzip(&plain), 0);
        let mut budget = Budget::new(1 << 20);
        let refused = gunzip_reserving(&lying, 64 << 20, &mut |b| budget.reserve(b));
        assert!(refused.is_err(), "refused by the budget");
        assert!(budget.reserved <= 1 << 20, "{}", budget.reserved);
        assert!(
            budget.asks.iter().all(|&ask| ask <= 1 << 20),
            "no single ask for the whole output: {:?}",
            budget.asks
        );
        // Within a budget that holds it, the stream's verdict on the lie.
        let mut budget = Budget::new(64 << 20);
        let verdict = gunzip_reserving(&lying, 64 << 20, &mut |b| budget.reserve(b));
        assert!(matches!(verdict, Ok(Err(PprofError::Gzip { .. }))));
        assert!(budget.reserved <= 8 << 20, "{}", budget.reserved);
    }

    /// A trailer that announces more than the input could inflate to
    /// reserves no more than it could, whatever it claims; an honest one
    /// reserves exactly the output.
    #[test]
    fn a_trailer_is_believed_only_as_far_as_the_input_could_inflate() {
        let plain = plain();
        let packed = gzip(&plain);
        let mut budget = Budget::new(usize::MAX);
        let out = gunzip_reserving(&packed, 64 << 20, &mut |b| budget.reserve(b))
            .expect("within budget")
            .expect("valid");
        assert_eq!(out, plain);
        assert_eq!(budget.reserved, plain.len(), "exact for one honest member");
        let lying = with_trailer(packed.clone(), 60 << 20);
        let mut budget = Budget::new(usize::MAX);
        let verdict =
            gunzip_reserving(&lying, 64 << 20, &mut |b| budget.reserve(b)).expect("within budget");
        assert!(verdict.is_err(), "the stream finds the lie");
        assert!(
            budget.asks[0] <= lying.len() * MAX_DEFLATE_RATIO,
            "{} for {} bytes of input",
            budget.asks[0],
            lying.len()
        );
        assert!(budget.reserved < 60 << 20);
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
