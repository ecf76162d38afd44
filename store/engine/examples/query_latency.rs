//! Merge latency of the engine alone over 1 h, 24 h and 7 days of one pod
//! sending a 10 s CPU profile (real fixtures, rotated), stored as one
//! compacted block per day (as the storage layer's compaction produces).
//!
//! Run: `cargo run --release -p kiln-engine --example query_latency [pods] [step_s] [runs]`
//! Prints per-range CPU time for decode-free merge + flame graph (blocks are
//! decoded once, as a block cache would hold them), for one pod and for all
//! pods. `step_s` (10) is the cadence of each pod's profiles; a coarser one
//! keeps many pods quick to build. `runs` (20) repeats each merge.

#![allow(clippy::print_stdout)] // Printing results is this example's job.

use std::path::PathBuf;
use std::time::Instant;

use kiln_engine::{
    Block, Head, IngestLimits, Label, LabelSet, MatchOp, Matcher, MergedProfile, Queryable,
    Selector, TimeRange, encode_block,
};
use kiln_pprof::{DecodeLimits, decode};

const FIXTURES: &[&str] = &[
    "parca/labels.pb.gz",
    "google-pprof/sample.cpu.pb.gz",
    "grafana-pyroscope/profile_rust.pb.gz",
];
const DAY: i64 = 86_400_000;

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/profiles");
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().ok());
    let pods = args.next().flatten().unwrap_or(1);
    let step_ms = args.next().flatten().unwrap_or(10) as i64 * 1000;
    let runs = args.next().flatten().unwrap_or(20);
    let mut profiles = Vec::new();
    for name in FIXTURES {
        let Ok(bytes) = std::fs::read(dir.join(name)) else {
            println!("skipped: {} not found", dir.join(name).display());
            return;
        };
        profiles.push(decode(&bytes, &DecodeLimits::default()).expect("fixture decodes"));
    }
    let start = 20_000 * DAY;
    let mut blocks = Vec::new();
    let mut bytes_total = 0usize;
    for day in 0..7 {
        let mut head = Head::new();
        let day_start = start + day * DAY;
        let mut t = day_start;
        let mut i = 0usize;
        while t < day_start + DAY {
            for pod in 0..pods {
                let labels = LabelSet::new(vec![
                    Label::new("__name__", "process_cpu"),
                    Label::new("pod", format!("pod-{pod}")),
                ]);
                let profile = &profiles[(i + pod) % profiles.len()];
                head.ingest(
                    profile,
                    &labels,
                    t,
                    10_000_000_000,
                    &IngestLimits::default(),
                )
                .expect("fixture ingests");
            }
            i += 1;
            t += step_ms;
        }
        let (_, bytes) = encode_block(&head, &format!("day-{day}"), "bench").expect("encodes");
        bytes_total += bytes.len();
        blocks.push(Block::decode(&bytes).expect("decodes"));
    }
    println!(
        "{pods} pod(s), 7 daily blocks, {} bytes in total",
        bytes_total
    );
    let end = start + 7 * DAY - 1_234;
    let profile_type = blocks[0]
        .profile_types(TimeRange {
            start_ms: start,
            end_ms: end,
        })
        .into_iter()
        .find(|t| t.sample_type == "cpu" || t.sample_type == "samples")
        .expect("a cpu type");
    let one_pod = kiln_engine::CompiledSelector::new(&Selector {
        profile_type: profile_type.clone(),
        matchers: vec![Matcher {
            name: "pod".into(),
            op: MatchOp::Equal,
            value: "pod-0".into(),
        }],
    })
    .expect("an equality matcher compiles");
    let all_pods = kiln_engine::CompiledSelector::new(&Selector {
        profile_type,
        matchers: vec![],
    })
    .expect("no matchers compile");
    for (who, selector) in [("one pod", &one_pod), ("all pods", &all_pods)] {
        for (label, span) in [("1 h", 3_600_000), ("24 h", DAY), ("7 d", 7 * DAY - 60_000)] {
            let range = TimeRange {
                start_ms: end - span,
                end_ms: end,
            };
            let (ms, total, nodes) = time_merge(&blocks, selector, range, runs);
            let (cached_ms, cached_total, cached_nodes) =
                time_cached_merge(&blocks, selector, range, runs);
            assert_eq!((total, nodes), (cached_total, cached_nodes));
            println!(
                "merge {label:>5} {who:<8}: {ms:8.2} ms, from cached block partials {cached_ms:8.2} ms (total {total}, {nodes} flame graph nodes)"
            );
        }
    }
}

/// Mean wall time in ms of `runs` merges + flame graphs, with the last
/// merge's total and node count.
fn time_merge(
    blocks: &[Block],
    selector: &kiln_engine::CompiledSelector,
    range: TimeRange,
    runs: usize,
) -> (f64, i64, usize) {
    let started = Instant::now();
    let mut nodes = 0;
    let mut total = 0;
    for _ in 0..runs {
        let mut merged = MergedProfile::new();
        for block in blocks {
            block
                .merge_into(selector, range, &mut merged)
                .expect("merge works");
        }
        let graph = merged.flamegraph(1024);
        nodes = graph.node_count();
        total = merged.total();
    }
    let ms = started.elapsed().as_secs_f64() * 1000.0 / runs.max(1) as f64;
    (ms, total, nodes)
}

/// The same from each block's partial, computed once beforehand (as the
/// store's partial cache holds them after the first query): the warm cost.
fn time_cached_merge(
    blocks: &[Block],
    selector: &kiln_engine::CompiledSelector,
    range: TimeRange,
    runs: usize,
) -> (f64, i64, usize) {
    let partials: Vec<_> = blocks
        .iter()
        .map(|block| block.merge_partial(selector, range).expect("merge works"))
        .collect();
    let started = Instant::now();
    let mut nodes = 0;
    let mut total = 0;
    for _ in 0..runs {
        let mut merged = MergedProfile::new();
        for partial in &partials {
            merged.add_partial(partial);
        }
        let graph = merged.flamegraph(1024);
        nodes = graph.node_count();
        total = merged.total();
    }
    let ms = started.elapsed().as_secs_f64() * 1000.0 / runs.max(1) as f64;
    (ms, total, nodes)
}
