//! A small upload must not make the decoder allocate gigabytes. Measured:
//! nested repeated fields amplify when prost decodes
//! them (an empty `Label` is 2 bytes on the wire, 32 decoded). A confirmed
//! case, one sample with 16M empty labels in a 32 KB gzip, raised
//! a store's RSS from 12 MB to 586 MB before validation refused it. The
//! wire pre-scan now refuses it before prost allocates, so the peak heap of
//! the whole decode is the inflated buffer. This binary counts its heap with
//! a global allocator, which is why the test lives alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_pprof::{DecodeLimits, PprofError, decode};

struct PeakCounting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are only bookkeeping.
unsafe impl GlobalAlloc for PeakCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: PeakCounting = PeakCounting;

/// A valid header (one sample type, strings) and one sample whose `label`
/// field (3, length-delimited, empty) repeats `labels` times.
fn one_sample_with_empty_labels(labels: usize) -> Vec<u8> {
    let mut sample = vec![0x10, 0x01]; // value = 1
    sample.reserve(labels * 2);
    for _ in 0..labels {
        sample.extend_from_slice(&[0x1a, 0x00]);
    }
    let mut plain = vec![0x0a, 0x04, 0x08, 0x01, 0x10, 0x02]; // sample_type {1, 2}
    plain.push(0x12);
    let mut len = sample.len();
    while len >= 0x80 {
        plain.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    plain.push(len as u8);
    plain.extend_from_slice(&sample);
    for s in [&b""[..], b"cpu", b"ns"] {
        plain.push(0x32);
        plain.push(s.len() as u8);
        plain.extend_from_slice(s);
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(&plain).expect("gzip into a Vec");
    encoder.finish().expect("gzip into a Vec")
}

#[test]
fn sixteen_million_empty_labels_are_refused_with_a_peak_heap_near_the_inflated_size() {
    let input = one_sample_with_empty_labels(16 << 20);
    assert!(
        input.len() < 64 << 10,
        "the reproduction is small: {}",
        input.len()
    );
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let err = decode(&input, &DecodeLimits::default()).expect_err("refused");
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        matches!(
            err,
            PprofError::LimitExceeded {
                what: "labels in one sample",
                ..
            }
        ),
        "{err}"
    );
    // The inflated protobuf is 32 MiB; decoding the labels would add 512 MiB.
    eprintln!(
        "nested labels: {} byte gzip, peak heap during decode {} MiB",
        input.len(),
        peak >> 20
    );
    assert!(peak < 48 << 20, "peak heap {} MiB", peak >> 20);
}
