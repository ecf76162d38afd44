//! What recording rules cost: the time `CheckedIngest::recorded_values`
//! adds to one profile's ingest checks, for 1, 8 and 64 rules (each with a
//! selector, half of them with a function filter, a quarter a regex), and
//! the bytes a recorded-series file takes per point.
//!
//! Run: `cargo run --release -p kiln-engine --example recording_cost`
//! Input is made here: CPU profiles of 500 samples, stacks 8 to 40 deep
//! over 400 functions, as a busy Go service's 10 s profile.

#![allow(clippy::print_stdout)] // Printing results is this example's job.

use std::time::Instant;

use kiln_engine::model::{Label, LabelSet, MatchOp, Matcher, ProfileType};
use kiln_engine::recording::{FunctionFilter, RecordedPoints, RecordingRule, RecordingRules};
use kiln_engine::{CheckedIngest, IngestLimits};
use kiln_pprof::{DecodeLimits, FunctionSpec, Profile, ProfileBuilder};

const SAMPLES: usize = 500;
const FUNCTIONS: u64 = 400;
const ROUNDS: usize = 400;

fn profile(seed: u64) -> Profile {
    let mut builder = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    builder.time(0, 10_000_000_000);
    let locations: Vec<u64> = (0..FUNCTIONS)
        .map(|f| {
            let function = builder.function(&FunctionSpec {
                name: format!("main.function_{f}"),
                ..FunctionSpec::default()
            });
            builder.location(0, 0x1000 + f * 16, &[(function, 1)])
        })
        .collect();
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut next = |bound: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % bound
    };
    for _ in 0..SAMPLES {
        let depth = 8 + next(33) as usize;
        let stack: Vec<u64> = (0..depth)
            .map(|_| locations[next(FUNCTIONS) as usize])
            .collect();
        let count = 1 + next(5) as i64;
        builder.sample(&stack, &[count, count * 10_000_000], &[]);
    }
    let bytes = kiln_pprof::encode_gzip(&builder.finish());
    kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("a profile made here decodes")
}

fn rules(count: usize) -> RecordingRules {
    let cpu = ProfileType::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds").expect("a type");
    let rules = (0..count)
        .map(|i| {
            let function = match i % 4 {
                0 | 1 => FunctionFilter::Any,
                2 => FunctionFilter::Exact(format!("main.function_{i}")),
                _ => FunctionFilter::regex(&format!("main\\.function_{i}.*")).expect("a regex"),
            };
            let namespace = Matcher {
                name: "namespace".to_owned(),
                op: MatchOp::Equal,
                value: "shop".to_owned(),
            };
            RecordingRule::new(
                &format!("rule_{i}"),
                cpu.clone(),
                false,
                &[namespace],
                function,
                &["service_name".to_owned(), "pod".to_owned()],
            )
            .expect("a rule")
        })
        .collect::<Vec<RecordingRule>>();
    RecordingRules::new(rules).expect("64 rules at most")
}

fn main() {
    let labels = LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("namespace", "shop"),
        Label::new("service_name", "checkout"),
        Label::new("pod", "checkout-7d9f"),
    ]);
    let profiles: Vec<Profile> = (0..8).map(profile).collect();
    let limits = IngestLimits::default();
    let checked: Vec<CheckedIngest> = profiles
        .iter()
        .map(|p| {
            CheckedIngest::prepare(p.clone(), &labels, 10_000_000_000, &limits).expect("checks")
        })
        .collect();

    let started = Instant::now();
    for round in 0..ROUNDS {
        let profile = profiles[round % profiles.len()].clone();
        let _ = CheckedIngest::prepare(profile, &labels, 10_000_000_000, &limits);
    }
    let prepare_us = started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
    println!("checks (CheckedIngest::prepare, incl. a profile clone): {prepare_us:.1} us/profile");
    for count in [1, 8, 64] {
        let rules = rules(count);
        let started = Instant::now();
        let mut values = 0;
        for round in 0..ROUNDS {
            values += checked[round % checked.len()].recorded_values(&rules).len();
        }
        let us = started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
        println!(
            "{count:>2} rules: {us:.1} us/profile ({:.0} % of the checks), {} values/profile",
            100.0 * us / prepare_us,
            values / ROUNDS
        );
    }

    // A day of 10 s points for 100 series, as a merged day file holds them.
    let mut points = RecordedPoints::new();
    for series in 0..100 {
        let labels = LabelSet::new(vec![
            Label::new("__name__", "kiln_cpu_nanoseconds_total"),
            Label::new("service_name", format!("service-{series}")),
        ]);
        for step in 0..8_640i64 {
            points.add(
                &labels,
                step * 10_000,
                10_000_000 * (1 + (step + series) % 97),
            );
        }
    }
    let bytes = points.encode(&[]).len();
    println!(
        "day file, 100 series x 8640 points: {bytes} bytes, {:.2} bytes/point",
        bytes as f64 / points.point_count() as f64
    );
}
