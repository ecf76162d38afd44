//! A streaming compaction holds less than its sources: hour blocks of real
//! Go profiles from many pods, several times larger than the memory budget
//! asserted here, merge with a heap peak (every allocation counted, reserved
//! capacity included) under that budget; and a day merge holds an hour of
//! its largest series, not the day. These tests run one at a time and
//! alone in their binary, since the counting allocator sees every thread
//! of the process.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_engine::model::BlockMeta;
use kiln_engine::{BlockCompression, compact_streaming};
use kiln_testkit::blocks::streaming::{FileRanges, go_profiles, wide_profile, write_hour_blocks};

struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = IN_USE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters move.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Held by each test while it measures, so that they take turns.
static ALONE: Mutex<()> = Mutex::new(());

/// The budget the merge must stay under, for sources at least 1.5 times
/// larger (about 20 MB of sources; the merge peaked at 7.7 MiB when this
/// was written).
const BUDGET_BYTES: usize = 10 << 20;
const READ_WINDOW_BYTES: usize = 64 << 10;

/// Merges the block files `paths` into `dir/merged` as the store does;
/// returns the output's metadata and the heap peak above what was in use
/// before.
fn merge_measured(paths: &[std::path::PathBuf], dir: &std::path::Path) -> (BlockMeta, usize) {
    let sources: Vec<FileRanges> = paths.iter().map(|p| FileRanges::open(p)).collect();
    let mut out = std::fs::File::create(dir.join("merged")).unwrap();
    let baseline = IN_USE.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let meta = compact_streaming(
        sources,
        "merged",
        "test",
        READ_WINDOW_BYTES,
        BlockCompression::Working,
        &mut out,
    )
    .unwrap();
    (meta, PEAK.load(Ordering::Relaxed) - baseline)
}

#[test]
fn streaming_compaction_of_sources_larger_than_the_budget_stays_under_it() {
    let _alone = ALONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tmp = tempfile::tempdir().unwrap();
    let Some(profiles) = go_profiles(tmp.path()) else {
        return;
    };
    let pods = std::env::var("KILN_TEST_PODS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1500);
    let (paths, source_bytes) = write_hour_blocks(tmp.path(), &profiles, pods, 6, 300_000);
    drop(profiles);
    let (meta, peak) = merge_measured(&paths, tmp.path());
    let _ = writeln!(
        std::io::stderr(),
        "{} sources of {pods} pods: {source_bytes} bytes; merged {} bytes, {} series; heap peak {peak} bytes",
        paths.len(),
        meta.size_bytes,
        meta.series
    );
    assert!(
        2 * source_bytes >= 3 * BUDGET_BYTES as u64,
        "the sources ({source_bytes} bytes) must be well over the budget for this to mean anything"
    );
    assert!(
        peak <= BUDGET_BYTES,
        "the merge peaked at {peak} bytes of heap, over its {BUDGET_BYTES} byte budget, for {source_bytes} bytes of sources"
    );
}

/// Bytes a merge holding a series' points whole as `(time, value)` pairs
/// would need per point, before any vector slack.
const WHOLE_SERIES_BYTES_PER_POINT: u64 = 16;

#[test]
fn a_day_merge_holds_an_hour_of_its_largest_series_not_the_day() {
    let _alone = ALONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tmp = tempfile::tempdir().unwrap();
    // One pod sending a 3,000-stack profile every 2 minutes: one series of
    // about 90,000 points an hour, 2.2 million over the day.
    let profile = wide_profile(3000);
    let (paths, source_bytes) = write_hour_blocks(tmp.path(), &[profile], 1, 24, 120_000);
    let (meta, peak) = merge_measured(&paths, tmp.path());
    let whole = meta.samples * WHOLE_SERIES_BYTES_PER_POINT;
    let _ = writeln!(
        std::io::stderr(),
        "24 hour blocks of one series: {source_bytes} bytes, {} points ({whole} bytes held whole); heap peak {peak} bytes",
        meta.samples
    );
    assert_eq!(meta.series, 1);
    assert_eq!(meta.samples, 24 * 30 * 3000, "every point merged once");
    assert!(
        peak as u64 * 3 <= whole,
        "the merge peaked at {peak} bytes of heap: more than a third of the {whole} bytes its series' points take whole"
    );
}
