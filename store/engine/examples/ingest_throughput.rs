//! Single-core ingest throughput of the engine alone (no WAL, no decode):
//! real CPU fixtures replayed as 500 pods sending 10 s profiles.
//!
//! Run: `cargo run --release -p kiln-engine --example ingest_throughput [profiles]`
//! Data: `../shared/testdata/profiles` (Go/Rust/eBPF CPU profiles of tens to
//! hundreds of samples). Prints profiles/s, samples/s, block size per sample
//! and as a fraction of the gzipped input, and block encode/decode times.

#![allow(clippy::print_stdout)] // Printing results is this example's job.

use std::path::PathBuf;
use std::time::Instant;

use kiln_engine::{Block, Head, IngestLimits, Label, LabelSet, encode_block};
use kiln_pprof::{DecodeLimits, decode};

const CPU_FIXTURES: &[&str] = &[
    "parca/labels.pb.gz",
    "parca/profile-with-labels.pb.gz",
    "google-pprof/sample.cpu.pb.gz",
    "grafana-pyroscope/go.cpu.labels.pb.gz",
    "grafana-pyroscope/profile_rust.pb.gz",
    "grafana-pyroscope/cpu-unknown.pb.gz",
    "parca/fgprof.pb.gz",
];
const PODS: usize = 500;

/// CPU seconds this thread has used (user + system), from /proc; the
/// machine is shared, so wall time alone would over-state the cost.
fn thread_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/profiles");
    let total_profiles: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let mut fixtures = Vec::new();
    for name in CPU_FIXTURES {
        let Ok(bytes) = std::fs::read(dir.join(name)) else {
            println!("skipped: {} not found", dir.join(name).display());
            return;
        };
        let profile = decode(&bytes, &DecodeLimits::default()).expect("fixture decodes");
        fixtures.push((bytes.len(), profile));
    }
    let pod_labels: Vec<LabelSet> = (0..PODS)
        .map(|pod| {
            LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("namespace", format!("ns-{}", pod % 20)),
                Label::new("pod", format!("checkout-{pod:04}")),
                Label::new("container", "app"),
                Label::new("node", format!("node-{}", pod % 50)),
            ])
        })
        .collect();
    let limits = IngestLimits::default();
    let mut head = Head::new();
    let (mut samples, mut gzip_bytes, mut stored) = (0u64, 0u64, 0u64);
    let start_ms = 1_700_000_000_000i64;
    let started = Instant::now();
    let cpu_started = thread_cpu_seconds();
    for i in 0..total_profiles {
        let pod = i % PODS;
        let (size, profile) = &fixtures[(i / PODS + pod) % fixtures.len()];
        let time_ms = start_ms + (i / PODS) as i64 * 10_000 + pod as i64;
        let stats = head
            .ingest(profile, &pod_labels[pod], time_ms, 10_000_000_000, &limits)
            .expect("fixture ingests");
        samples += profile.samples().len() as u64;
        stored += stats.samples;
        gzip_bytes += *size as u64;
    }
    let wall = started.elapsed().as_secs_f64();
    let elapsed = thread_cpu_seconds() - cpu_started;
    println!(
        "ingest: {total_profiles} profiles, {samples} pprof samples ({stored} values stored) in {elapsed:.2} s CPU ({wall:.2} s wall)"
    );
    println!(
        "        {:.0} profiles/s, {:.0} samples/s (one core)",
        total_profiles as f64 / elapsed,
        samples as f64 / elapsed
    );
    println!(
        "head:   {} series, ~{} MiB",
        head.series_count(),
        head.approx_bytes() >> 20
    );
    let started = Instant::now();
    let (meta, bytes) = encode_block(&head, "01BENCH", "bench").expect("head encodes");
    let encode_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let block = Block::decode(&bytes).expect("block decodes");
    let decode_s = started.elapsed().as_secs_f64();
    println!(
        "block:  {} bytes, {:.2} bytes per stored value, {:.1} % of gzipped input; encode {encode_s:.3} s, decode {decode_s:.3} s, {} series",
        meta.size_bytes,
        meta.size_bytes as f64 / meta.samples as f64,
        100.0 * meta.size_bytes as f64 / gzip_bytes as f64,
        block.series_count()
    );
}
