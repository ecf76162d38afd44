//! Per-upload CPU of head ingest as the head's series grow (issue 13: it
//! must stay flat from 10k to 1M series). Each upload is what the store does
//! under its head lock: `Head::ingest` of one decoded profile, then
//! `Head::approx_bytes` to decide whether to cut the head.
//!
//! Run: `cargo run --release -p kiln-engine --example ingest_series_growth [max series]`
//! Data: a synthetic 10 s CPU profile (50 stacks, 12-20 frames, one sample
//! type), built in memory, so no fixtures are needed. For each series count
//! the head is first filled with one profile per series, then 2,000 uploads
//! to existing series are timed in this thread's CPU time.

#![allow(clippy::print_stdout)] // Printing results is this example's job.

use kiln_engine::{Head, IngestLimits, Label, LabelSet};
use kiln_pprof::{DecodeLimits, FunctionSpec, ProfileBuilder, decode_flat, encode_gzip};

const TIMED_UPLOADS: usize = 2_000;

/// CPU seconds this thread has used (user + system), from /proc; the
/// machine is shared, so wall time would over-state the cost.
fn thread_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    (ticks(11) + ticks(12)) / 100.0
}

fn profile() -> kiln_pprof::FlatProfile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    b.time(0, 10_000_000_000);
    for s in 0..50u64 {
        let depth = 12 + (s % 9);
        let frames: Vec<u64> = (0..depth)
            .map(|d| {
                let f = (s * 7 + d * 13) % 300;
                let function = b.function(&FunctionSpec {
                    name: format!("app.handler{f}"),
                    system_name: String::new(),
                    filename: "app.go".into(),
                    start_line: f as i64,
                });
                b.location(0, 0x1000 + f * 16, &[(function, d as i64 + 1)])
            })
            .collect();
        b.sample(&frames, &[10_000_000 * (1 + s as i64 % 4)], &[]);
    }
    // Decoded as the store decodes what it ingests: straight from the wire.
    decode_flat(&encode_gzip(&b.finish()), &DecodeLimits::default()).expect("built profile decodes")
}

fn labels(pod: usize) -> LabelSet {
    LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("namespace", format!("ns-{}", pod % 50)),
        Label::new("pod", format!("pod-{pod:07}")),
    ])
}

fn main() {
    let max: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let profile = profile();
    let limits = IngestLimits {
        // The example measures growth, not the limits that stop it.
        max_series_per_profile_name: usize::MAX,
        max_series_per_namespace: usize::MAX,
        max_series: usize::MAX,
        ..IngestLimits::default()
    };
    let mut head = Head::new();
    let mut filled = 0usize;
    let mut time_ms = 0i64;
    let mut keep = 0usize;
    println!("series      CPU per upload   uploads/s per core   head approx MiB");
    for target in [10_000usize, 100_000, 300_000, 1_000_000] {
        if target > max {
            break;
        }
        while filled < target {
            head.ingest(&profile, &labels(filled), time_ms, 10_000_000_000, &limits)
                .expect("fill ingest");
            filled += 1;
        }
        let start = thread_cpu_seconds();
        for i in 0..TIMED_UPLOADS {
            time_ms += 10;
            let pod = (i * 7_919) % target;
            head.ingest(&profile, &labels(pod), time_ms, 10_000_000_000, &limits)
                .expect("timed ingest");
            // The store asks this after every ingest, under the head lock.
            keep = keep.wrapping_add(head.approx_bytes());
        }
        let cpu = thread_cpu_seconds() - start;
        let per = cpu / TIMED_UPLOADS as f64;
        println!(
            "{:>9}   {:>10.1} µs   {:>15.0}      {:>8}",
            head.series_count(),
            per * 1e6,
            1.0 / per.max(1e-9),
            head.approx_bytes() >> 20
        );
    }
    // Keeps the approx_bytes calls from being optimised away.
    std::hint::black_box(keep);
}
