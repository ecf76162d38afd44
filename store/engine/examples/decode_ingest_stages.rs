//! Single-core cost of the two CPU stages of the store's write path, on
//! distinct, realistically shaped profiles: pprof decode (gunzip + protobuf +
//! validate, crate kiln-pprof), through prost and straight from the wire
//! (`decode_flat`), and head ingest (kiln-engine) of each.
//!
//! Run: `cargo run --release -p kiln-engine --example decode_ingest_stages [profiles] [samples]`
//! Data: `../shared/testdata/profiles`. Each payload is rebuilt from a
//! fixture's stacks: `samples` (default 300) stacks drawn at random, each with
//! its mappings, functions and inlined lines, so every payload has its own
//! string table and ids, as profiles from different processes do. 120
//! distinct payloads are sent by 500 pods.

#![allow(clippy::print_stdout)] // Printing results is this example's job.

use std::collections::HashMap;
use std::path::PathBuf;

use kiln_engine::{CheckedIngest, Head, IngestLimits, Label, LabelSet};
use kiln_pprof::{
    DecodeLimits, FunctionSpec, MappingSpec, Profile, ProfileBuilder, decode, decode_flat,
    encode_gzip,
};

const FIXTURES: [&str; 4] = [
    "google-pprof/large.cpu.pb.gz",
    "google-pprof/sample.cpu.pb.gz",
    "parca/profile-with-labels.pb.gz",
    "grafana-pyroscope/cpu-unknown.pb.gz",
];
const PAYLOADS: usize = 120;
const PODS: usize = 500;

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
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

/// A frame resolved out of its profile: mapping, address and lines.
struct Frame {
    mapping: Option<MappingSpec>,
    address: u64,
    lines: Vec<(FunctionSpec, i64)>,
}

fn resolved_stacks(profile: &Profile) -> Vec<Vec<Frame>> {
    let mut stacks = Vec::new();
    for sample in profile.samples() {
        let frames: Vec<Frame> = sample
            .location_id
            .iter()
            .filter_map(|&id| profile.location(id))
            .map(|loc| Frame {
                mapping: profile.mapping(loc.mapping_id).map(|m| MappingSpec {
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename: profile.string(m.filename).to_owned(),
                    build_id: profile.string(m.build_id).to_owned(),
                    has_functions: m.has_functions,
                }),
                address: loc.address,
                lines: loc
                    .line
                    .iter()
                    .filter_map(|line| {
                        let f = profile.function(line.function_id)?;
                        let spec = FunctionSpec {
                            name: profile.string(f.name).to_owned(),
                            system_name: profile.string(f.system_name).to_owned(),
                            filename: profile.string(f.filename).to_owned(),
                            start_line: f.start_line,
                        };
                        Some((spec, line.line))
                    })
                    .collect(),
            })
            .collect();
        if !frames.is_empty() {
            stacks.push(frames);
        }
    }
    stacks
}

/// xorshift: deterministic payloads without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn payload(stacks: &[Vec<Frame>], samples: usize, rng: &mut u64) -> Vec<u8> {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    b.time(0, 10_000_000_000);
    let mut mappings: HashMap<MappingSpec, u64> = HashMap::new();
    for _ in 0..samples {
        let stack = &stacks[next(rng) as usize % stacks.len()];
        let mut locations = Vec::with_capacity(stack.len());
        for frame in stack {
            let mapping = frame.mapping.as_ref().map_or(0, |spec| {
                *mappings
                    .entry(spec.clone())
                    .or_insert_with(|| b.mapping(spec))
            });
            let lines: Vec<(u64, i64)> = frame
                .lines
                .iter()
                .map(|(f, line)| (b.function(f), *line))
                .collect();
            locations.push(b.location(mapping, frame.address, &lines));
        }
        let count = 1 + (next(rng) % 5) as i64;
        b.sample(&locations, &[count, count * 10_000_000], &[]);
    }
    encode_gzip(&b.finish())
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/profiles");
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let samples: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let limits = DecodeLimits::default();
    let mut stacks = Vec::new();
    for name in FIXTURES {
        let Ok(bytes) = std::fs::read(dir.join(name)) else {
            println!("skipped: {} not found", dir.join(name).display());
            return;
        };
        stacks.push(resolved_stacks(
            &decode(&bytes, &limits).expect("fixture decodes"),
        ));
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let payloads: Vec<Vec<u8>> = (0..PAYLOADS)
        .map(|i| payload(&stacks[i % stacks.len()], samples, &mut rng))
        .collect();
    let mean_bytes = payloads.iter().map(Vec::len).sum::<usize>() / PAYLOADS;
    println!(
        "payloads: {PAYLOADS} distinct, {samples} samples each, mean {mean_bytes} gzipped bytes"
    );

    // Each decode is kept only for the first round of payloads and freed
    // otherwise, as the store frees a profile once it is in the head.
    let start = cpu_seconds();
    let mut decoded = Vec::with_capacity(PAYLOADS);
    for i in 0..total {
        let profile = decode(&payloads[i % PAYLOADS], &limits).expect("payload decodes");
        if i < PAYLOADS {
            decoded.push(profile);
        }
    }
    let decode_s = cpu_seconds() - start;
    println!(
        "decode (prost message): {total} profiles in {decode_s:.2} s CPU: {:.0} profiles/s",
        total as f64 / decode_s
    );
    let start = cpu_seconds();
    let mut flat = Vec::with_capacity(PAYLOADS);
    for i in 0..total {
        let profile = decode_flat(&payloads[i % PAYLOADS], &limits).expect("payload decodes");
        if i < PAYLOADS {
            flat.push(profile);
        }
    }
    let flat_decode_s = cpu_seconds() - start;
    println!(
        "decode (flat, from the wire): {total} profiles in {flat_decode_s:.2} s CPU: {:.0} profiles/s",
        total as f64 / flat_decode_s
    );

    let pod_labels: Vec<LabelSet> = (0..PODS)
        .map(|pod| {
            LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("service_name", format!("svc-{:02}", pod % 20)),
                Label::new("pod", format!("checkout-{pod:04}")),
                Label::new("node", format!("node-{}", pod % 25)),
            ])
        })
        .collect();
    let ingest_limits = IngestLimits::default();
    let ingest_all = |profiles: &[&dyn ProfileViewed]| {
        let mut head = Head::new();
        let mut values = 0u64;
        let start = cpu_seconds();
        for i in 0..total {
            let time_ms = 1_700_000_000_000 + (i / PODS) as i64 * 10_000;
            values += profiles[i % profiles.len()]
                .ingest_into(&mut head, &pod_labels[i % PODS], time_ms, &ingest_limits)
                .samples;
        }
        (head, values, cpu_seconds() - start)
    };
    let (_, values, ingest_s) = ingest_all(
        &decoded
            .iter()
            .map(|p| p as &dyn ProfileViewed)
            .collect::<Vec<_>>(),
    );
    println!(
        "ingest (prost message): {total} profiles in {ingest_s:.2} s CPU: {:.0} profiles/s, {:.0} pprof samples/s, {:.0} values/s",
        total as f64 / ingest_s,
        (total * samples) as f64 / ingest_s,
        values as f64 / ingest_s
    );
    let (head, flat_values, flat_ingest_s) = ingest_all(
        &flat
            .iter()
            .map(|p| p as &dyn ProfileViewed)
            .collect::<Vec<_>>(),
    );
    assert_eq!(flat_values, values, "both decodes store the same values");
    println!(
        "ingest (flat): {total} profiles in {flat_ingest_s:.2} s CPU: {:.0} profiles/s, {:.0} values/s",
        total as f64 / flat_ingest_s,
        flat_values as f64 / flat_ingest_s
    );
    println!(
        "head: {} series, {} stack nodes, {} locations, {} strings, ~{} MiB",
        head.series_count(),
        head.symbols().node_count(),
        head.symbols().location_count(),
        head.symbols().string_count(),
        head.approx_bytes() >> 20
    );
    println!(
        "decode + ingest: {:.0} profiles/s per core (prost message), {:.0} (flat)",
        total as f64 / (decode_s + ingest_s),
        total as f64 / (flat_decode_s + flat_ingest_s)
    );
    lock_split(&payloads, &pod_labels, total, &ingest_limits);
}

/// The store's ingest in its three steps, each timed over batches (CPU
/// time, /proc ticks): `CheckedIngest::prepare` (no lock), `count_series`
/// (every head shard's read lock, briefly) and `apply_checked` (one shard's
/// write lock). Before the head was sharded, the checks ran under the
/// head's read lock and the apply under its one write lock, so the apply
/// bounds how many uploads per second one lock lets through.
fn lock_split(payloads: &[Vec<u8>], pod_labels: &[LabelSet], total: usize, limits: &IngestLimits) {
    const BATCH: usize = 250;
    let decode_limits = DecodeLimits::default();
    let mut head = Head::new();
    let (mut prepare_s, mut count_s, mut apply_s) = (0.0, 0.0, 0.0);
    let mut done = 0;
    while done < total {
        let batch: Vec<usize> = (done..(done + BATCH).min(total)).collect();
        let decoded: Vec<_> = batch
            .iter()
            .map(|&i| decode_flat(&payloads[i % PAYLOADS], &decode_limits).expect("decodes"))
            .collect();
        let start = cpu_seconds();
        let checked: Vec<CheckedIngest> = decoded
            .into_iter()
            .zip(&batch)
            .map(|(profile, &i)| {
                CheckedIngest::prepare(profile, &pod_labels[i % PODS], 10_000_000_000, limits)
                    .expect("checks")
            })
            .collect();
        let counted = cpu_seconds();
        for c in &checked {
            c.count_series(&head, limits).expect("within limits");
        }
        let applying = cpu_seconds();
        for (c, &i) in checked.into_iter().zip(&batch) {
            head.apply_checked(c, 1_700_000_000_000 + (i / PODS) as i64 * 10_000);
        }
        let end = cpu_seconds();
        prepare_s += counted - start;
        count_s += applying - counted;
        apply_s += end - applying;
        done += batch.len();
    }
    let per = |s: f64| s * 1e6 / total as f64;
    println!(
        "store ingest steps per profile: prepare {:.0} µs (no lock), count_series {:.0} µs (shards' read locks), apply {:.0} µs (one shard's write lock)",
        per(prepare_s),
        per(count_s),
        per(apply_s)
    );
    println!(
        "one write lock lets through at most {:.0} applies/s; with S shards, S times that",
        total as f64 / apply_s.max(f64::MIN_POSITIVE)
    );
}

/// One ingest, whichever decoder made the profile.
trait ProfileViewed {
    fn ingest_into(
        &self,
        head: &mut Head,
        labels: &LabelSet,
        time_ms: i64,
        limits: &IngestLimits,
    ) -> kiln_engine::IngestStats;
}

impl<P: kiln_pprof::ProfileView> ProfileViewed for P {
    fn ingest_into(
        &self,
        head: &mut Head,
        labels: &LabelSet,
        time_ms: i64,
        limits: &IngestLimits,
    ) -> kiln_engine::IngestStats {
        head.ingest(self, labels, time_ms, 10_000_000_000, limits)
            .expect("payload ingests")
    }
}
