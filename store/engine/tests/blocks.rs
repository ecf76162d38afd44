//! Blocks answer exactly like the head they were cut from; rollups never
//! change an answer; compaction preserves everything; corrupt bytes are
//! clean errors.

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::collections::BTreeMap;

use kiln_engine::{
    Block, BlockError, CompiledSelector, Head, IngestLimits, Label, LabelSet, MatchOp, Matcher,
    MergedProfile, ProfileType, Queryable, Selector, ShardCensus, StepExemplars, TimeRange,
    Timeline, compact_blocks, compile_matchers, encode_block, encode_heads, encode_selection,
};
use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, MappingSpec, Profile, ProfileBuilder};
use proptest::prelude::*;

const DAY: i64 = 86_400_000;
const HOUR: i64 = 3_600_000;
/// A UTC midnight, plus an odd offset so nothing is accidentally aligned.
const T0: i64 = 19_700 * DAY + 7 * HOUR + 12_345;

/// Deterministic pseudo-random numbers (no external RNG needed).
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

/// A CPU profile with symbolized, inlined and unsymbolized frames, promoted
/// string labels, span labels and numeric labels, and some zero values.
fn cpu_profile(seed: u64) -> Profile {
    let mut rng = Lcg(seed);
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    let mapping = b.mapping(&MappingSpec {
        memory_start: 0x400000,
        memory_limit: 0x800000,
        file_offset: 0,
        filename: "/usr/bin/app".into(),
        build_id: "b1d".into(),
        has_functions: true,
    });
    let functions: Vec<u64> = (0..12)
        .map(|i| {
            b.function(&FunctionSpec {
                name: format!("app::f{i}"),
                system_name: format!("_ZN3app2f{i}E"),
                filename: "src/app.rs".into(),
                start_line: i,
            })
        })
        .collect();
    let locations: Vec<u64> = (0..24u64)
        .map(|i| match i % 6 {
            // Unsymbolized: address only.
            5 => b.location(mapping, 0x400000 + i * 16, &[]),
            // Inlined: two lines in one location.
            4 => b.location(
                mapping,
                0x400000 + i * 16,
                &[
                    (functions[(i % 12) as usize], 10),
                    (functions[((i + 1) % 12) as usize], 20),
                ],
            ),
            _ => b.location(
                mapping,
                0x400000 + i * 16,
                &[(functions[(i % 12) as usize], i as i64)],
            ),
        })
        .collect();
    for _ in 0..(20 + rng.next(30)) {
        let depth = 2 + rng.next(7) as usize;
        let stack: Vec<u64> = (0..depth)
            .map(|_| locations[rng.next(24) as usize])
            .collect();
        let count = rng.next(5) as i64;
        let mut labels = Vec::new();
        match rng.next(4) {
            0 => labels.push(("handler", LabelValue::Str(format!("/api/{}", rng.next(3))))),
            1 => labels.push(("span_id", LabelValue::Str(format!("{:x}", rng.next(4))))),
            2 => labels.push((
                "bytes",
                LabelValue::Num {
                    value: 1 << rng.next(10),
                    unit: "bytes".into(),
                },
            )),
            _ => {}
        }
        b.sample(&stack, &[count, count * 10_000_000], &labels);
    }
    Profile::validate(b.finish(), &DecodeLimits::default()).unwrap()
}

fn pod_labels(pod: usize) -> LabelSet {
    LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("namespace", "shop"),
        Label::new("pod", format!("pod-{pod}")),
    ])
}

/// `(pod, time_ms, profile)` for 4 pods every 41 minutes over 2.5 days.
fn workload() -> Vec<(usize, i64, Profile)> {
    let mut out = Vec::new();
    let mut t = T0;
    let mut seed = 1;
    while t < T0 + 5 * DAY / 2 {
        for pod in 0..4 {
            seed += 1;
            out.push((pod, t + pod as i64 * 1_000, cpu_profile(seed)));
        }
        t += 41 * 60_000;
    }
    out
}

fn head_of(items: &[(usize, i64, Profile)]) -> Head {
    let mut head = Head::new();
    for (pod, time_ms, profile) in items {
        head.ingest(
            profile,
            &pod_labels(*pod),
            *time_ms,
            10_000_000_000,
            &IngestLimits::default(),
        )
        .unwrap();
    }
    head
}

fn ranges() -> Vec<TimeRange> {
    let mut out = vec![
        TimeRange {
            start_ms: T0 - DAY,
            end_ms: T0 + 3 * DAY,
        },
        TimeRange {
            start_ms: T0 + HOUR + 123,
            end_ms: T0 + 26 * HOUR + 777,
        },
        TimeRange {
            start_ms: (T0 / DAY + 1) * DAY,
            end_ms: (T0 / DAY + 2) * DAY,
        },
        TimeRange {
            start_ms: (T0 / HOUR + 3) * HOUR,
            end_ms: (T0 / HOUR + 5) * HOUR,
        },
    ];
    let mut rng = Lcg(99);
    for _ in 0..8 {
        let start = T0 - HOUR + rng.next(3 * DAY as u64) as i64;
        out.push(TimeRange {
            start_ms: start,
            end_ms: start + 1 + rng.next(DAY as u64) as i64,
        });
    }
    out
}

fn matcher_sets() -> Vec<Vec<Matcher>> {
    let m = |name: &str, op, value: &str| Matcher {
        name: name.into(),
        op,
        value: value.into(),
    };
    vec![
        vec![],
        vec![m("pod", MatchOp::Equal, "pod-1")],
        vec![m("pod", MatchOp::Regex, "pod-[12]")],
        vec![m("handler", MatchOp::NotEqual, "")],
        vec![
            m("handler", MatchOp::NotRegex, "/api/0"),
            m("namespace", MatchOp::Equal, "shop"),
        ],
    ]
}

/// A merge in a form independent of symbol ids: exported through pprof and
/// read back as (frame names, labels) -> value.
fn canonical(
    merged: &MergedProfile,
    profile_type: &ProfileType,
) -> BTreeMap<(Vec<String>, Vec<String>), i64> {
    let profile =
        Profile::validate(merged.to_pprof(profile_type), &DecodeLimits::default()).unwrap();
    let mut out = BTreeMap::new();
    for sample in profile.samples() {
        let mut names = Vec::new();
        for &id in &sample.location_id {
            let location = profile.location(id).unwrap();
            names.push(format!("0x{:x}", location.address));
            for line in &location.line {
                names.push(
                    profile
                        .string(profile.function(line.function_id).unwrap().name)
                        .to_owned(),
                );
            }
        }
        let mut labels: Vec<String> = sample
            .label
            .iter()
            .map(|l| {
                format!(
                    "{}={}{}{}",
                    profile.string(l.key),
                    profile.string(l.str),
                    l.num,
                    profile.string(l.num_unit)
                )
            })
            .collect();
        labels.sort();
        *out.entry((names, labels)).or_insert(0) += sample.value[0];
    }
    out
}

fn assert_same_answers(expected: &dyn Queryable, actual: &dyn Queryable, what: &str) {
    let everything = TimeRange {
        start_ms: i64::MIN / 2,
        end_ms: i64::MAX / 2,
    };
    let types = expected.profile_types(everything);
    assert_eq!(types.len(), 2, "{what}");
    assert_eq!(actual.profile_types(everything), types, "{what}");
    for range in ranges() {
        assert_eq!(
            actual.profile_types(range),
            expected.profile_types(range),
            "{what} {range:?}"
        );
        for matchers in matcher_sets() {
            let context = format!("{what} {range:?} {matchers:?}");
            let compiled = compile_matchers(&matchers).unwrap();
            assert_eq!(
                actual.label_names(&compiled, range).unwrap(),
                expected.label_names(&compiled, range).unwrap(),
                "{context}"
            );
            assert_eq!(
                actual.label_values("handler", &compiled, range).unwrap(),
                expected.label_values("handler", &compiled, range).unwrap(),
                "{context}"
            );
            assert_eq!(
                actual.series(&compiled, range).unwrap(),
                expected.series(&compiled, range).unwrap(),
                "{context}"
            );
            for profile_type in &types {
                let selector = CompiledSelector::new(&Selector {
                    profile_type: profile_type.clone(),
                    matchers: matchers.clone(),
                })
                .unwrap();
                let (mut a, mut e) = (MergedProfile::new(), MergedProfile::new());
                expected.merge_into(&selector, range, &mut e).unwrap();
                actual.merge_into(&selector, range, &mut a).unwrap();
                assert_eq!(a.total(), e.total(), "{context}");
                assert_eq!(
                    canonical(&a, profile_type),
                    canonical(&e, profile_type),
                    "{context}"
                );
                let (mut ta, mut te) = (
                    Timeline::new(range, HOUR).unwrap(),
                    Timeline::new(range, HOUR).unwrap(),
                );
                expected.timeline_into(&selector, range, &mut te).unwrap();
                actual.timeline_into(&selector, range, &mut ta).unwrap();
                assert_eq!(ta, te, "{context}");
                assert_eq!(
                    te.total(),
                    e.total(),
                    "{context}: timeline total equals merge total"
                );
                let (mut xa, mut xe) = (
                    StepExemplars::new(range, HOUR).unwrap(),
                    StepExemplars::new(range, HOUR).unwrap(),
                );
                expected.exemplars_into(&selector, range, &mut xe).unwrap();
                actual.exemplars_into(&selector, range, &mut xa).unwrap();
                assert_eq!(xa, xe, "{context}: exemplars");
                for (step, exemplar) in xe.steps.iter().enumerate() {
                    let value = te.values[step];
                    match exemplar {
                        // Each step's heaviest profile is a part of it.
                        Some(kept) => assert!(
                            kept.value <= value,
                            "{context}: step {step}: {kept:?} over {value}"
                        ),
                        None => assert_eq!(value, 0, "{context}: step {step}"),
                    }
                }
            }
        }
    }
}

#[test]
fn block_answers_every_query_exactly_like_its_head() {
    let items = workload();
    let head = head_of(&items);
    let (meta, bytes) = encode_block(&head, "01BLOCK", "replica-a").unwrap();
    let block = Block::decode(&bytes).unwrap();
    assert_eq!(block.meta(), &meta);
    assert_eq!(meta.profiles, items.len() as u64);
    assert_eq!(meta.samples, head.samples());
    assert_eq!(meta.min_time_ms, head.time_bounds().unwrap().0);
    assert!(
        block.rollup_chunk_count() > 0,
        "a 2.5-day block has rollups"
    );
    assert_same_answers(&head, &block, "head vs block");
}

#[test]
fn shards_encode_into_one_block_that_answers_like_one_head() {
    let items = workload();
    let head = head_of(&items);
    // Three shards, each pod in one of them, as the store's live head
    // splits requests; pod 3 also writes one profile through a second
    // shard, so one series lives in two shards and must merge.
    let mut shards: Vec<Vec<(usize, i64, Profile)>> = vec![Vec::new(); 3];
    for (i, item) in items.iter().enumerate() {
        let shard = if item.0 == 3 && i % 7 == 0 {
            0
        } else {
            item.0 % 3
        };
        shards[shard].push(item.clone());
    }
    let heads: Vec<Head> = shards.iter().map(|s| head_of(s)).collect();
    let refs: Vec<&Head> = heads.iter().collect();
    let (meta, bytes) = encode_heads(&refs, "01SHARDS", "replica-a").unwrap();
    let (one_meta, _) = encode_block(&head, "01ONE", "replica-a").unwrap();
    assert_eq!(meta.profiles, one_meta.profiles);
    assert_eq!(meta.samples, one_meta.samples);
    assert_eq!(
        meta.series, one_meta.series,
        "a series in two shards is one series"
    );
    assert_eq!(
        (meta.min_time_ms, meta.max_time_ms),
        (one_meta.min_time_ms, one_meta.max_time_ms)
    );
    let block = Block::decode(&bytes).unwrap();
    assert_same_answers(&head, &block, "one head vs its shards' block");
    // Empty shards are skipped, all-empty is an error, as for one head.
    let empty = Head::new();
    let with_empty: Vec<&Head> = vec![&empty, &heads[0], &empty];
    assert!(encode_heads(&with_empty, "01E", "r").is_ok());
    assert!(matches!(
        encode_heads(&[&empty, &empty], "01E", "r"),
        Err(BlockError::Empty)
    ));
    assert!(matches!(
        encode_heads(&[], "01E", "r"),
        Err(BlockError::Empty)
    ));
}

/// What a replica hands a querying peer: only the selected series, only
/// their profiles in the range, from every shard, answering exactly like a
/// head that held just those profiles.
#[test]
fn a_selection_of_shards_answers_like_a_head_of_just_the_selection() {
    let items = workload();
    let mut shards: Vec<Vec<(usize, i64, Profile)>> = vec![Vec::new(); 2];
    for (i, item) in items.iter().enumerate() {
        shards[i % 2].push(item.clone());
    }
    let heads: Vec<Head> = shards.iter().map(|s| head_of(s)).collect();
    let refs: Vec<&Head> = heads.iter().collect();
    let range = TimeRange {
        start_ms: T0 + DAY / 2,
        end_ms: T0 + 3 * DAY / 2,
    };
    let matchers = compile_matchers(&[Matcher {
        name: "pod".into(),
        op: MatchOp::Regex,
        value: "pod-[12]".into(),
    }])
    .unwrap();
    let (meta, bytes) = encode_selection(&refs, &matchers, range, true, ("01PEER", "replica-b"))
        .unwrap()
        .expect("the selection holds profiles");
    let expected: Vec<(usize, i64, Profile)> = items
        .iter()
        .filter(|(pod, time_ms, _)| (*pod == 1 || *pod == 2) && range.contains(*time_ms))
        .cloned()
        .collect();
    let expected = head_of(&expected);
    let block = Block::decode(&bytes).unwrap();
    assert_eq!(meta.series as usize, expected.series_count());
    assert_eq!(meta.samples, expected.samples());
    assert_eq!(
        (meta.min_time_ms, meta.max_time_ms),
        expected.time_bounds().unwrap()
    );
    assert!(
        block.symbols().location_count() < heads[0].symbols().location_count() * 2,
        "symbols come from the selection, not copied whole"
    );
    assert_same_answers(&expected, &block, "selection vs a head of just it");
    // Totals only: the same series and timelines, no stacks, fewer bytes.
    let (_, totals) = encode_selection(&refs, &matchers, range, false, ("01TOT", "replica-b"))
        .unwrap()
        .expect("the selection holds profiles");
    assert!(
        totals.len() < bytes.len() / 2,
        "{} vs {}",
        totals.len(),
        bytes.len()
    );
    let totals = Block::decode(&totals).unwrap();
    let all = compile_matchers(&[]).unwrap();
    assert_eq!(
        totals.series(&all, range).unwrap(),
        expected.series(&all, range).unwrap()
    );
    for profile_type in expected.profile_types(range) {
        let selector = CompiledSelector::new(&Selector {
            profile_type,
            matchers: vec![],
        })
        .unwrap();
        let mut want = Timeline::new(range, HOUR).unwrap();
        expected.timeline_into(&selector, range, &mut want).unwrap();
        let mut got = Timeline::new(range, HOUR).unwrap();
        totals.timeline_into(&selector, range, &mut got).unwrap();
        assert_eq!(got, want);
        let mut merged = MergedProfile::default();
        totals.merge_into(&selector, range, &mut merged).unwrap();
        assert_eq!(merged.total(), 0, "no stacks");
    }
    // Nothing selected is no block, not an error.
    let nobody = compile_matchers(&[Matcher {
        name: "pod".into(),
        op: MatchOp::Equal,
        value: "pod-9".into(),
    }])
    .unwrap();
    assert!(
        encode_selection(&refs, &nobody, range, true, ("01NONE", "r"))
            .unwrap()
            .is_none()
    );
}

#[test]
fn series_limits_count_every_shard() {
    use kiln_engine::{CheckedIngest, SeriesCensus};
    let items = workload();
    // Two shards holding two pods each.
    let mut shards = [Head::new(), Head::new()];
    for (pod, time_ms, profile) in items.iter().filter(|i| i.0 < 2) {
        shards[*pod]
            .ingest(
                profile,
                &pod_labels(*pod),
                *time_ms,
                10_000_000_000,
                &IngestLimits::default(),
            )
            .unwrap();
    }
    // A limit the two shards fill exactly together.
    let held: usize = shards
        .iter()
        .map(|h| h.series_for_name("process_cpu"))
        .sum();
    let limits = IngestLimits {
        max_series_per_profile_name: held,
        ..IngestLimits::default()
    };
    let refs: Vec<&Head> = shards.iter().collect();
    let census = ShardCensus(&refs);
    assert_eq!(census.series_for_name("process_cpu"), held);
    let (_, _, profile) = items.iter().find(|i| i.0 == 1).unwrap();
    let prepare = |pod| {
        CheckedIngest::prepare(profile.clone(), &pod_labels(pod), 10_000_000_000, &limits).unwrap()
    };
    // Pod 1 writes on into the series it has; pod 9 would add new ones.
    prepare(1).count_series(&census, &limits).unwrap();
    assert!(prepare(9).count_series(&census, &limits).is_err());
    // Shard 0 alone has room for them: only the sum refuses.
    prepare(9)
        .count_series(&ShardCensus(&refs[..1]), &limits)
        .unwrap();
}

#[test]
fn rollups_never_change_a_merge() {
    let head = head_of(&workload());
    let (_, bytes) = encode_block(&head, "01BLOCK", "r").unwrap();
    let block = Block::decode(&bytes).unwrap();
    let profile_type = block
        .profile_types(TimeRange {
            start_ms: 0,
            end_ms: i64::MAX,
        })
        .remove(1);
    for range in ranges() {
        for matchers in matcher_sets() {
            let selector = CompiledSelector::new(&Selector {
                profile_type: profile_type.clone(),
                matchers,
            })
            .unwrap();
            let (mut with, mut without) = (MergedProfile::new(), MergedProfile::new());
            block.merge_into(&selector, range, &mut with).unwrap();
            block
                .merge_into_without_rollups(&selector, range, &mut without)
                .unwrap();
            assert_eq!(
                canonical(&with, &profile_type),
                canonical(&without, &profile_type),
                "{range:?}"
            );
        }
    }
}

#[test]
fn compaction_preserves_every_answer_and_records_lineage() {
    let items = workload();
    let head = head_of(&items);
    let thirds: Vec<Block> = items
        .chunks(items.len() / 3 + 1)
        .enumerate()
        .map(|(i, chunk)| {
            Block::decode(
                &encode_block(&head_of(chunk), &format!("01L0-{i}"), "r")
                    .unwrap()
                    .1,
            )
            .unwrap()
        })
        .collect();
    let sources: Vec<&Block> = thirds.iter().collect();
    let (meta, bytes) = compact_blocks(&sources, "01L1", "r").unwrap();
    assert_eq!(meta.compaction_level, 1);
    assert_eq!(meta.sources, vec!["01L0-0", "01L0-1", "01L0-2"]);
    assert_eq!(meta.profiles, items.len() as u64);
    let compacted = Block::decode(&bytes).unwrap();
    // The same stacks across source blocks are stored once.
    let source_nodes: usize = thirds.iter().map(|b| b.symbols().node_count()).sum();
    assert!(compacted.symbols().node_count() < source_nodes);
    assert_same_answers(&head, &compacted, "head vs compacted");
    // Compacting again keeps answers and bumps the level.
    let (meta2, bytes2) = compact_blocks(&[&compacted], "01L2", "r").unwrap();
    assert_eq!(meta2.compaction_level, 2);
    assert_eq!(meta2.samples, meta.samples);
    assert_same_answers(
        &head,
        &Block::decode(&bytes2).unwrap(),
        "head vs recompacted",
    );
}

#[test]
fn every_flipped_byte_and_every_truncation_is_a_clean_error() {
    let items: Vec<_> = workload().into_iter().take(6).collect();
    let (_, bytes) = encode_block(&head_of(&items), "01SMALL", "r").unwrap();
    assert!(Block::decode(&bytes).is_ok());
    let mut copy = bytes.clone();
    for i in 0..bytes.len() {
        copy[i] ^= 0x5a;
        let error = Block::decode(&copy).expect_err("a flipped byte is detected");
        assert!(!error.reason().is_empty());
        copy[i] = bytes[i];
    }
    for len in 0..bytes.len() {
        assert!(Block::decode(&bytes[..len]).is_err(), "truncated to {len}");
    }
    assert!(matches!(
        Block::decode(b"not a block at all"),
        Err(BlockError::BadMagic)
    ));
}

#[test]
fn empty_head_does_not_encode() {
    assert!(matches!(
        encode_block(&Head::new(), "x", "r"),
        Err(BlockError::Empty)
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn garbage_with_a_valid_magic_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"KILNBLK\x01\x01\x00\x00\x00".to_vec();
        bytes.extend(tail);
        let _ = Block::decode(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random profile times (around window and chunk boundaries, before and
    /// after the epoch) and random ranges: the block, with or without
    /// rollups, always answers like the head.
    #[test]
    fn random_times_and_ranges_answer_like_the_head(
        times in proptest::collection::vec((0usize..3, -3 * DAY..3 * DAY), 1..12),
        queries in proptest::collection::vec((-4 * DAY..4 * DAY, 1i64..5 * DAY), 1..6),
    ) {
        let items: Vec<(usize, i64, Profile)> = times
            .iter()
            .enumerate()
            .map(|(i, &(pod, t))| (pod, t, cpu_profile(i as u64 + 7)))
            .collect();
        let head = head_of(&items);
        let block = Block::decode(&encode_block(&head, "01P", "r").unwrap().1).unwrap();
        let everything = TimeRange { start_ms: i64::MIN / 2, end_ms: i64::MAX / 2 };
        for profile_type in head.profile_types(everything) {
            for &(start, len) in &queries {
                let range = TimeRange { start_ms: start, end_ms: start + len };
                let selector = CompiledSelector::new(&Selector { profile_type: profile_type.clone(), matchers: vec![] }).unwrap();
                let (mut h, mut b, mut raw) = (MergedProfile::new(), MergedProfile::new(), MergedProfile::new());
                head.merge_into(&selector, range, &mut h).unwrap();
                block.merge_into(&selector, range, &mut b).unwrap();
                block.merge_into_without_rollups(&selector, range, &mut raw).unwrap();
                let expected = canonical(&h, &profile_type);
                prop_assert_eq!(&canonical(&b, &profile_type), &expected);
                prop_assert_eq!(&canonical(&raw, &profile_type), &expected);
            }
        }
    }
}
