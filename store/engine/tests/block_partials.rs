//! A merge assembled from cached block partials (`Block::merge_partial` +
//! `MergedProfile::add_partial`, what the store's partial cache does)
//! gives the same flame graph, stacks and total as the direct merge
//! (`Queryable::merge_into`) over the same blocks; and a partial depends on
//! the range only through its clip to the block, which is what the cache
//! keys it by.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use kiln_engine::{
    Block, BlockPartial, CompiledSelector, FlameGraph, FlameNode, Head, IngestLimits, Label,
    LabelSet, MatchOp, Matcher, MergedProfile, ProfileType, Queryable, Selector, TimeRange,
    compact_blocks, encode_block,
};
use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, MappingSpec, Profile, ProfileBuilder};

const DAY: i64 = 86_400_000;
const HOUR: i64 = 3_600_000;
/// A UTC midnight.
const T0: i64 = 19_700 * DAY;

/// Deterministic pseudo-random numbers.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound.max(1)
    }
}

/// A CPU profile of a service: its own functions plus shared ones, so
/// blocks and pods share some stacks and not others; inlined and
/// unsymbolized frames, and sample labels.
fn cpu_profile(service: u64, seed: u64) -> Profile {
    let mut rng = Lcg(seed);
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    let mapping = b.mapping(&MappingSpec {
        memory_start: 0x400000,
        memory_limit: 0x800000,
        file_offset: 0,
        filename: format!("/usr/bin/svc{service}"),
        build_id: format!("b{service}"),
        has_functions: true,
    });
    let functions: Vec<u64> = (0..10)
        .map(|i| {
            let owner = if i < 4 {
                "shared".to_owned()
            } else {
                format!("svc{service}")
            };
            b.function(&FunctionSpec {
                name: format!("{owner}::f{i}"),
                system_name: String::new(),
                filename: "src/lib.rs".into(),
                start_line: i,
            })
        })
        .collect();
    let locations: Vec<u64> = (0..20u64)
        .map(|i| match i % 5 {
            4 => b.location(mapping, 0x400000 + i * 16, &[]),
            3 => b.location(
                mapping,
                0x400000 + i * 16,
                &[
                    (functions[(i % 10) as usize], 10),
                    (functions[((i + 1) % 10) as usize], 20),
                ],
            ),
            _ => b.location(
                mapping,
                0x400000 + i * 16,
                &[(functions[(i % 10) as usize], i as i64)],
            ),
        })
        .collect();
    for _ in 0..(10 + rng.next(20)) {
        let depth = 2 + rng.next(6) as usize;
        let stack: Vec<u64> = (0..depth)
            .map(|_| locations[rng.next(20) as usize])
            .collect();
        let count = 1 + rng.next(5) as i64;
        let mut labels = Vec::new();
        if rng.next(3) == 0 {
            labels.push(("span_id", LabelValue::Str(format!("{:x}", rng.next(3)))));
        }
        b.sample(&stack, &[count, count * 10_000_000], &labels);
    }
    Profile::validate(b.finish(), &DecodeLimits::default()).unwrap()
}

fn pod_labels(pod: usize) -> LabelSet {
    LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("pod", format!("pod-{pod}")),
        Label::new("service", format!("svc{}", pod % 3)),
    ])
}

/// A head of 6 pods sending every `step` from `start` to `end`.
fn head_between(start: i64, end: i64, step: i64, seed: &mut u64) -> Head {
    let mut head = Head::new();
    let mut t = start;
    while t < end {
        for pod in 0..6 {
            *seed += 1;
            head.ingest(
                &cpu_profile((pod % 3) as u64, *seed),
                &pod_labels(pod),
                t + pod as i64 * 1_000,
                10_000_000_000,
                &IngestLimits::default(),
            )
            .unwrap();
        }
        t += step;
    }
    head
}

fn block(head: &Head, id: &str) -> Block {
    Block::decode(&encode_block(head, id, "test").unwrap().1).unwrap()
}

/// The layout a week of the store ends in, in small: two day blocks
/// compacted from hour blocks, the day so far as one block, and two recent
/// hour blocks.
fn blocks() -> Vec<Block> {
    let mut seed = 0;
    let mut out = Vec::new();
    for day in 0..2 {
        let hours: Vec<Block> = (0..24)
            .step_by(6)
            .map(|h| {
                let start = T0 + day * DAY + h * HOUR;
                block(
                    &head_between(start, start + 6 * HOUR, 47 * 60_000, &mut seed),
                    &format!("d{day}h{h}"),
                )
            })
            .collect();
        let refs: Vec<&Block> = hours.iter().collect();
        let (_, bytes) = compact_blocks(&refs, &format!("day{day}"), "test").unwrap();
        out.push(Block::decode(&bytes).unwrap());
    }
    let today = T0 + 2 * DAY;
    out.push(block(
        &head_between(today, today + 10 * HOUR, 23 * 60_000, &mut seed),
        "today",
    ));
    for h in 10..12 {
        let start = today + h * HOUR;
        out.push(block(
            &head_between(start, start + HOUR, 5 * 60_000, &mut seed),
            &format!("hour{h}"),
        ));
    }
    out
}

fn cpu_type() -> ProfileType {
    ProfileType {
        name: "process_cpu".into(),
        sample_type: "cpu".into(),
        sample_unit: "nanoseconds".into(),
        period_type: "cpu".into(),
        period_unit: "nanoseconds".into(),
        delta: true,
    }
}

fn selectors() -> Vec<CompiledSelector> {
    let m = |name: &str, op, value: &str| Matcher {
        name: name.into(),
        op,
        value: value.into(),
    };
    [
        vec![],
        vec![m("pod", MatchOp::Equal, "pod-1")],
        vec![m("service", MatchOp::Regex, "svc[02]")],
        vec![m("pod", MatchOp::Equal, "no-such-pod")],
    ]
    .into_iter()
    .map(|matchers| {
        CompiledSelector::new(&Selector {
            profile_type: cpu_type(),
            matchers,
        })
        .unwrap()
    })
    .collect()
}

/// Ranges ending at the last data, as the UI asks (1 h, 24 h, 7 d), plus
/// unaligned ones and one that misses every block.
fn ranges() -> Vec<TimeRange> {
    let end = T0 + 2 * DAY + 12 * HOUR;
    let mut out: Vec<TimeRange> = [HOUR, DAY, 7 * DAY]
        .into_iter()
        .map(|span| TimeRange {
            start_ms: end - span,
            end_ms: end,
        })
        .collect();
    out.push(TimeRange {
        start_ms: T0 + 5 * HOUR + 1_234,
        end_ms: T0 + DAY + 17 * HOUR + 999,
    });
    out.push(TimeRange {
        start_ms: T0 + 2 * DAY + 30 * 60_000,
        end_ms: T0 + 2 * DAY + 11 * HOUR + 7,
    });
    out.push(TimeRange {
        start_ms: T0 - 3 * DAY,
        end_ms: T0 - DAY,
    });
    out
}

/// Every node of a flame graph as (frame path from the root, total,
/// self), sorted: the graph's content without the order of its name table
/// or of siblings with equal totals, which follow hash order in either path.
fn flame_paths(graph: &FlameGraph) -> Vec<(String, i64, i64)> {
    let mut out = Vec::new();
    let mut pending: Vec<(&FlameNode, String)> = vec![(graph.root(), String::new())];
    while let Some((node, prefix)) = pending.pop() {
        let path = format!("{prefix};{}", graph.names[node.name as usize]);
        out.push((path.clone(), node.total, node.self_value));
        for child in graph.children(node) {
            pending.push((child, path.clone()));
        }
    }
    out.sort();
    out
}

#[test]
fn a_merge_from_block_partials_equals_the_direct_merge() {
    let blocks = blocks();
    let mut compared_nonempty = 0;
    for selector in selectors() {
        for range in ranges() {
            let mut direct = MergedProfile::new();
            let mut from_partials = MergedProfile::new();
            for block in &blocks {
                block.merge_into(&selector, range, &mut direct).unwrap();
                let partial = block.merge_partial(&selector, range).unwrap();
                from_partials.add_partial(&partial);
            }
            let what = format!("{selector:?} over {range:?}");
            assert_eq!(from_partials.total(), direct.total(), "{what}");
            assert_eq!(from_partials.stacks(), direct.stacks(), "{what}");
            for max_nodes in [1 << 20, 16] {
                // Trimmed graphs too: the same nodes fall into "other".
                assert_eq!(
                    flame_paths(&from_partials.flamegraph(max_nodes)),
                    flame_paths(&direct.flamegraph(max_nodes)),
                    "{what}, {max_nodes} nodes"
                );
            }
            compared_nonempty += usize::from(direct.total() != 0);
        }
    }
    assert!(
        compared_nonempty >= 10,
        "only {compared_nonempty} merges had data"
    );
}

#[test]
fn a_partial_depends_on_the_range_only_through_its_clip_to_the_block() {
    let blocks = blocks();
    let selector = &selectors()[0];
    let end = T0 + 2 * DAY + 12 * HOUR;
    // The day blocks lie whole inside both ranges: same clip, same partial.
    let week = TimeRange {
        start_ms: end - 7 * DAY,
        end_ms: end,
    };
    let shifted = TimeRange {
        start_ms: end - 7 * DAY + 5 * 60_000,
        end_ms: end + 5 * 60_000,
    };
    for block in &blocks[..2] {
        assert_eq!(block.clip_range(week), block.clip_range(shifted));
        let a: BlockPartial = block.merge_partial(selector, week).unwrap();
        let b = block.merge_partial(selector, shifted).unwrap();
        assert!(!a.is_empty());
        assert_eq!(a, b);
        // And the clip itself answers the same.
        assert_eq!(
            a,
            block
                .merge_partial(selector, block.clip_range(week))
                .unwrap()
        );
    }
    // A range that cuts into a block clips differently and answers less.
    let cut = TimeRange {
        start_ms: T0 + 12 * HOUR,
        end_ms: end,
    };
    assert_ne!(blocks[0].clip_range(cut), blocks[0].clip_range(week));
    let whole = blocks[0].merge_partial(selector, week).unwrap();
    let part = blocks[0].merge_partial(selector, cut).unwrap();
    let sum = |p: &BlockPartial| {
        let mut merged = MergedProfile::new();
        merged.add_partial(p);
        merged.total()
    };
    assert!(0 < sum(&part) && sum(&part) < sum(&whole));
}

#[test]
fn partials_answer_without_their_blocks_and_hold_only_what_they_use() {
    let (all_pods, one_pod) = (&selectors()[0], &selectors()[1]);
    let week = TimeRange {
        start_ms: T0 - DAY,
        end_ms: T0 + 7 * DAY,
    };
    let (direct, partials, all_pods_bytes) = {
        let blocks = blocks();
        let mut direct = MergedProfile::new();
        for block in &blocks {
            block.merge_into(one_pod, week, &mut direct).unwrap();
        }
        let partials: Vec<BlockPartial> = blocks
            .iter()
            .map(|b| b.merge_partial(one_pod, week).unwrap())
            .collect();
        let all_pods_bytes: usize = blocks
            .iter()
            .map(|b| b.merge_partial(all_pods, week).unwrap().approx_bytes())
            .sum();
        (direct, partials, all_pods_bytes)
        // The blocks are dropped here, as a cache may evict them.
    };
    let mut from_partials = MergedProfile::new();
    for partial in &partials {
        from_partials.add_partial(partial);
    }
    assert!(direct.total() > 0);
    assert_eq!(from_partials.total(), direct.total());
    assert_eq!(from_partials.stacks(), direct.stacks());
    // One pod of six: its partials carry only its share of the symbols.
    let one_pod_bytes: usize = partials.iter().map(BlockPartial::approx_bytes).sum();
    assert!(
        one_pod_bytes * 2 < all_pods_bytes,
        "{one_pod_bytes} bytes for one pod, {all_pods_bytes} for all"
    );
}

/// A merge of several blocks' partials, turned into one partial (what the
/// store caches for the days a range covers whole), adds to a later merge
/// exactly what the blocks do, and takes less memory than the partials it
/// was made of: their common symbols are held once.
#[test]
fn a_merge_turned_into_a_partial_adds_what_its_blocks_add_in_less_memory() {
    let blocks = blocks();
    let week = TimeRange {
        start_ms: T0 - DAY,
        end_ms: T0 + 7 * DAY,
    };
    for selector in selectors() {
        let partials: Vec<BlockPartial> = blocks
            .iter()
            .map(|b| b.merge_partial(&selector, week).unwrap())
            .collect();
        let mut span = MergedProfile::new();
        for partial in &partials {
            span.add_partial(partial);
        }
        let span = span.into_partial();
        let (mut direct, mut from_span) = (MergedProfile::new(), MergedProfile::new());
        for block in &blocks {
            block.merge_into(&selector, week, &mut direct).unwrap();
        }
        from_span.add_partial(&span);
        assert_eq!(from_span.total(), direct.total(), "{selector:?}");
        assert_eq!(from_span.stacks(), direct.stacks(), "{selector:?}");
        let separate: usize = partials.iter().map(BlockPartial::approx_bytes).sum();
        if direct.total() > 0 {
            assert!(
                span.approx_bytes() < separate,
                "{selector:?}: span {} bytes, partials {separate}",
                span.approx_bytes()
            );
        }
    }
}
