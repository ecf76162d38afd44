//! How much memory one compaction holds relative to its sources' encoded
//! size: the figure the storage planner budgets a compaction group with.
//!
//! Run: `cargo run --release -p kiln-engine --example compaction_memory [pods] [hours] [streaming|whole] [budget MiB]`
//!
//! Builds `hours` hour blocks of `pods` pods each sending a real profile
//! every 10 s (fixtures from `../shared`, rotated per pod and time), writes
//! them to files, then merges them. `streaming` (the default, what the store
//! does) reads the sources by range from their files with
//! `compact_streaming_within` (64 KiB windows) under the budget given (none
//! by default), smallest source first, and writes the output to a file,
//! printing the merge's own projection next to what was measured;
//! `whole` reads and decodes every source, merges them with
//! `compact_blocks` and keeps the output in memory (the store before). A counting allocator records the heap in use
//! and its peak (reserved capacity counts, touched or not), and the kernel's
//! VmHWM, restarted before the merge, gives its resident peak; all are
//! reported as multiples of the sources' size.

#![allow(clippy::print_stdout)] // Printing results is this example's job.

use std::alloc::{GlobalAlloc, Layout, System};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_engine::{
    Block, BlockCompression, BlockRanges, Head, IngestLimits, Label, LabelSet, MergeLimits,
    MergeOutput, compact_blocks, compact_streaming_within, encode_block,
};
use kiln_pprof::{DecodeLimits, decode};

/// Counts live heap bytes and their high-water mark.
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

const FIXTURES: &[&str] = &[
    "grafana-pyroscope/go.cpu.labels.pb.gz",
    "grafana-pyroscope/profile_java.pb.gz",
    "grafana-pyroscope/profile_python.pb.gz",
    "grafana-pyroscope/profile_rust.pb.gz",
    "parca/labels.pb.gz",
    "google-pprof/sample.cpu.pb.gz",
    "google-pprof/cppbench.heap.pb.gz",
];
const HOUR: i64 = 3_600_000;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/profiles");
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().ok());
    let pods = args.next().flatten().unwrap_or(20);
    let hours = args.next().flatten().unwrap_or(6);
    let whole = std::env::args().nth(3).is_some_and(|mode| mode == "whole");
    let budget = std::env::args()
        .nth(4)
        .and_then(|mib| mib.parse::<u64>().ok())
        .map_or(u64::MAX, |mib| mib << 20);
    let mut profiles = Vec::new();
    for name in FIXTURES {
        let Ok(bytes) = std::fs::read(dir.join(name)) else {
            println!("skipped: {} not found", dir.join(name).display());
            return;
        };
        profiles.push(decode(&bytes, &DecodeLimits::default()).expect("fixture decodes"));
    }
    let files = tempfile::tempdir().expect("a temp dir");
    let start = 20_000 * 24 * HOUR;
    let mut paths = Vec::new();
    let mut source_bytes = 0usize;
    for hour in 0..hours {
        let mut head = Head::new();
        let hour_start = start + hour as i64 * HOUR;
        for (step, t) in (hour_start..hour_start + HOUR).step_by(10_000).enumerate() {
            for pod in 0..pods {
                let labels = LabelSet::new(vec![
                    Label::new("__name__", "process_cpu"),
                    Label::new("namespace", format!("ns-{}", pod % 7)),
                    Label::new("pod", format!("pod-{pod}")),
                ]);
                let profile = &profiles[(step + pod) % profiles.len()];
                head.ingest(
                    profile,
                    &labels,
                    t,
                    10_000_000_000,
                    &IngestLimits::default(),
                )
                .expect("fixture ingests");
            }
        }
        let (_, bytes) = encode_block(&head, &format!("hour-{hour}"), "bench").expect("encodes");
        source_bytes += bytes.len();
        let path = files.path().join(format!("hour-{hour}"));
        std::fs::write(&path, &bytes).expect("block written");
        paths.push(path);
    }
    // Hand the ingest phase's freed memory back so that it does not absorb
    // the merge's, then restart the kernel's high-water mark (VmHWM) from here.
    // SAFETY: glibc's malloc_trim only releases free memory.
    unsafe { malloc_trim(0) };
    let rss_before = status_kib("VmRSS:");
    let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let baseline = IN_USE.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let (sources_held, output_len, output_held, peak, hwm) = if whole {
        // As the store did: fetch, decode, drop the fetched bytes.
        let blocks: Vec<Block> = paths
            .iter()
            .map(|path| Block::decode(&std::fs::read(path).expect("block read")).expect("decodes"))
            .collect();
        let sources_held = IN_USE.load(Ordering::Relaxed) - baseline;
        let refs: Vec<&Block> = blocks.iter().collect();
        let (_, output) = compact_blocks(&refs, "merged", "bench").expect("compacts");
        let peak = PEAK.load(Ordering::Relaxed) - baseline;
        let hwm = status_kib("VmHWM:");
        drop(blocks);
        let output_held = IN_USE.load(Ordering::Relaxed) - baseline;
        (sources_held, output.len(), output_held, peak, hwm)
    } else {
        let mut sources: Vec<FileRanges> = paths.iter().map(FileRanges::open).collect();
        sources.sort_by_key(|source| source.1);
        let out_path = files.path().join("merged");
        let mut out = std::fs::File::create(&out_path).expect("output file");
        let merge = compact_streaming_within(
            sources,
            &MergeOutput {
                id: "merged",
                replica: "bench",
                read_window: 64 << 10,
                compression: BlockCompression::Working,
            },
            MergeLimits {
                memory_bytes: budget,
                output_held_bytes: u64::MAX,
            },
            &mut out,
        )
        .expect("compacts");
        let peak = PEAK.load(Ordering::Relaxed) - baseline;
        let hwm = status_kib("VmHWM:");
        let Some(merge) = merge else {
            println!("not even two sources fit the budget; nothing merged");
            return;
        };
        println!(
            "merged {} of {} sources; symbol sections {:.2} MiB decoded to {:.2} MiB ({:.2}x); held after open {:.2} MiB; projected peak {:.2} MiB",
            merge.sources_merged,
            paths.len(),
            mib(merge.symbol_section_bytes as usize),
            mib(merge.decoded_symbol_bytes as usize),
            merge.decoded_symbol_bytes as f64 / merge.symbol_section_bytes.max(1) as f64,
            mib(merge.held_after_open as usize),
            mib(merge.projected_peak as usize),
        );
        (0, merge.meta.size_bytes as usize, 0, peak, hwm)
    };
    let s = source_bytes as f64;
    let mode = if whole { "whole" } else { "streaming" };
    println!("{pods} pods, {hours} hour blocks -> 1 block ({mode})");
    println!("sources encoded        {:9.2} MiB", mib(source_bytes));
    println!(
        "sources decoded        {:9.2} MiB ({:.2}x)",
        mib(sources_held),
        sources_held as f64 / s
    );
    println!(
        "output encoded         {:9.2} MiB ({:.2}x), {:.2} MiB held",
        mib(output_len),
        output_len as f64 / s,
        mib(output_held)
    );
    println!(
        "peak heap of the merge {:9.2} MiB ({:.2}x the sources)",
        mib(peak),
        peak as f64 / s
    );
    if hwm_reset {
        let rss_peak = hwm.saturating_sub(rss_before) << 10;
        println!(
            "peak RSS of the merge  {:9.2} MiB ({:.2}x the sources; VmHWM minus RSS before)",
            mib(rss_peak),
            rss_peak as f64 / s
        );
    } else {
        println!("peak RSS not measured: /proc/self/clear_refs is not writable");
    }
}

/// A block file read at offsets, as the store reads a local bucket.
struct FileRanges(std::fs::File, u64);

impl FileRanges {
    fn open(path: &PathBuf) -> Self {
        let file = std::fs::File::open(path).expect("block file");
        let size = file.metadata().expect("block metadata").len();
        Self(file, size)
    }
}

impl BlockRanges for FileRanges {
    fn size(&self) -> u64 {
        self.1
    }

    fn read_range(&mut self, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
        let start = buf.len();
        buf.resize(start + len, 0);
        self.0.read_exact_at(&mut buf[start..], offset)
    }
}

unsafe extern "C" {
    /// glibc: returns free heap memory to the OS.
    fn malloc_trim(pad: usize) -> i32;
}

/// A `/proc/self/status` field in KiB (0 when missing).
fn status_kib(field: &str) -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
