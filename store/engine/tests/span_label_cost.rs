//! What span labels cost on disk. A span-tagged SDK (Go's
//! `otel-profiling-go`) labels each sample with its root span's
//! `span_id`, `span_name` and `trace_id`; the store keeps them per sample,
//! as a label set shared by the stacks of one span. The same profiles with
//! and without those labels are cut into blocks, and the difference,
//! divided by the labelled samples, is the cost per span-labelled sample.
//! Profiles without span labels pay nothing for the feature: their samples
//! keep the empty label set, which no block stores.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use kiln_engine::{Head, IngestLimits, Label, LabelSet, encode_block};
use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, Profile, ProfileBuilder};

const PROFILES: u64 = 120;
const SPANS_PER_PROFILE: u64 = 8;
const STACKS: u64 = 24;
/// Measured 2026-12-05 on 1fc4a80: 2.0 bytes per labelled sample, 48 per
/// span (its three ids, unique across the block, kept once). The bounds
/// leave room for layout changes, not for a per-sample copy of the ids.
const MAX_BYTES_PER_LABELLED_SAMPLE: f64 = 4.0;
const MAX_BYTES_PER_SPAN: f64 = 80.0;

/// One profile of a service handling `SPANS_PER_PROFILE` requests: every
/// span runs every stack once, so each sample is one (stack, span).
fn profile(seed: u64, spans: bool) -> Profile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    let locations: Vec<u64> = (0..STACKS + 4)
        .map(|i| {
            let function = b.function(&FunctionSpec {
                name: format!("main.handler{i}"),
                system_name: format!("main.handler{i}"),
                filename: "main.go".into(),
                start_line: i as i64,
            });
            b.location(0, 0x1000 + i * 16, &[(function, i as i64)])
        })
        .collect();
    for span in 0..SPANS_PER_PROFILE {
        let id = seed * SPANS_PER_PROFILE + span;
        let labels = if spans {
            vec![
                (
                    "span_id",
                    LabelValue::Str(format!("{:016x}", id * 0x9e37_79b9)),
                ),
                (
                    "span_name",
                    LabelValue::Str(format!("GET /api/{}", span % 3)),
                ),
                (
                    "trace_id",
                    LabelValue::Str(format!("{:032x}", u128::from(id) * 0x9e37_79b9_7f4a)),
                ),
            ]
        } else {
            Vec::new()
        };
        for stack in 0..STACKS {
            let frames = [
                locations[stack as usize],
                locations[(stack % 4) as usize + STACKS as usize],
            ];
            b.sample(
                &frames,
                &[10_000_000 * (1 + (stack + span) % 5) as i64],
                &labels,
            );
        }
    }
    Profile::validate(b.finish(), &DecodeLimits::default()).unwrap()
}

fn block_bytes(spans: bool) -> usize {
    let labels = LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("service_name", "checkout"),
    ]);
    let mut head = Head::new();
    for seed in 0..PROFILES {
        head.ingest(
            &profile(seed, spans),
            &labels,
            1_800_000_000_000 + seed as i64 * 15_000,
            15_000_000_000,
            &IngestLimits::default(),
        )
        .unwrap();
    }
    assert_eq!(head.series_count(), 1, "span labels make no series");
    encode_block(&head, "01SPANS", "r").unwrap().1.len()
}

#[test]
fn a_span_labelled_sample_costs_a_bounded_few_bytes_on_disk() {
    let plain = block_bytes(false);
    let labelled = block_bytes(true);
    let samples = (PROFILES * SPANS_PER_PROFILE * STACKS) as f64;
    let spans = (PROFILES * SPANS_PER_PROFILE) as f64;
    let extra = (labelled - plain) as f64;
    let (per_sample, per_span) = (extra / samples, extra / spans);
    println!(
        "block without span labels {plain} B, with {labelled} B: {per_sample:.1} B per span-labelled sample, {per_span:.1} B per span ({samples} samples, {spans} spans)"
    );
    assert!(labelled > plain, "the ids are stored");
    assert!(
        per_sample <= MAX_BYTES_PER_LABELLED_SAMPLE && per_span <= MAX_BYTES_PER_SPAN,
        "{per_sample:.1} B per labelled sample, {per_span:.1} B per span"
    );
}
