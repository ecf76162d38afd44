//! The query trees built from stored profiles: flame graph, diff, folded
//! text, top table, pprof export and Pyroscope's flamebearer rows, with
//! small node caps. What a query renders is whatever some client stored
//! earlier, so a profile that ingest accepted must never make a later query
//! of its range fail; this target stores the fuzz input first, through the
//! same decode and head ingest as the store, then renders it from the head
//! and again from the block the head flushes to.
//!
//! Input: byte 0 picks the node cap (1 to 64), byte 1 holds flags (bit 0:
//! the rest is a pprof profile; bit 1: group by the `thread` sample label;
//! the top table's limit above them). Otherwise the rest is a list of
//! stacks separated by `0`: a stack's first byte is its value and each
//! further byte a frame, leaf first, whose low six bits name its function
//! and whose top two bits add inlined lines, so the fuzzer reaches deep,
//! wide, recursive and inlined trees without having to find the pprof
//! wire format. Even stacks go to the diff's base, odd ones to its
//! comparison.

use kiln_engine::model::{Label, LabelSet, MatchOp, Matcher, Selector, TimeRange};
use kiln_engine::{
    Block, CompiledSelector, Head, IngestLimits, MergedProfile, Queryable, diff, encode_block,
};
use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, MappingSpec, ProfileBuilder};
use kiln_store::query::pyroscope::flamebearer::{diff_levels, single_levels};
use prost::Message;

use crate::NOW_MS;

/// The two series a diff compares.
const SERVICES: [&str; 2] = ["base", "compare"];

/// Profile types queried per input, so a pprof with many sample types
/// stays quick.
const MAX_TYPES: usize = 4;

/// Runs the target on `data`.
pub fn query_trees(data: &[u8]) {
    let [cap, flags, rest @ ..] = data else {
        return;
    };
    let max_nodes = 1 + usize::from(cap % 64);
    let top_limit = 1 + usize::from(flags >> 2) % 16;
    let group = flags & 2 != 0;
    let profiles: Vec<Vec<u8>> = if flags & 1 != 0 {
        vec![rest.to_vec()]
    } else {
        stack_profiles(rest)
    };
    let mut head = Head::new();
    for (service, pprof) in SERVICES.iter().zip(&profiles) {
        store(&mut head, service, pprof);
    }
    let from_head = render(&head, max_nodes, top_limit, group);
    if head.is_empty() {
        return;
    }
    match encode_block(&head, "01JFUZZTREESBLOCK00000000", "fuzz") {
        Ok((_, bytes)) => match Block::decode(&bytes) {
            Ok(block) => {
                let from_block = render(&block, max_nodes, top_limit, group);
                assert_eq!(from_head, from_block, "the head and its block disagree");
            }
            Err(error) => panic!("a block the engine just wrote does not decode: {error}"),
        },
        Err(error) => assert!(!error.to_string().is_empty()),
    }
}

/// Decodes `pprof` as the store does and adds it to `head` under `service`;
/// a refusal is fine, a panic is not.
fn store(head: &mut Head, service: &str, pprof: &[u8]) {
    let profile = match kiln_pprof::decode_flat(pprof, &DecodeLimits::default()) {
        Ok(profile) => profile,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let labels = LabelSet::new(vec![
        Label::new("__name__", "process_cpu"),
        Label::new("service_name", service),
    ]);
    if let Err(error) = head.ingest(
        &profile,
        &labels,
        NOW_MS,
        10_000_000_000,
        &IngestLimits::default(),
    ) {
        assert!(!error.to_string().is_empty());
    }
}

fn range() -> TimeRange {
    TimeRange {
        start_ms: NOW_MS - 3_600_000,
        end_ms: NOW_MS + 3_600_000,
    }
}

/// Every tree of every stored type, with the merge totals of both sides;
/// returned so the head and its block can be compared.
fn render(
    source: &impl Queryable,
    max_nodes: usize,
    top_limit: usize,
    group: bool,
) -> Vec<(i64, i64)> {
    let mut totals = Vec::new();
    for profile_type in source.profile_types(range()).into_iter().take(MAX_TYPES) {
        let [base, compare] = SERVICES.map(|service| {
            let selector = Selector {
                profile_type: profile_type.clone(),
                matchers: vec![Matcher {
                    name: "service_name".to_owned(),
                    op: MatchOp::Equal,
                    value: service.to_owned(),
                }],
            };
            let mut merged = MergedProfile::new();
            let compiled = CompiledSelector::new(&selector);
            if let Ok(compiled) = compiled
                && let Err(error) = source.merge_into(&compiled, range(), &mut merged)
            {
                assert!(!error.to_string().is_empty());
            }
            merged
        });
        totals.push((base.total(), compare.total()));
        let mut all = base.clone();
        all.merge(&compare);
        let all = if group {
            let mut grouped = MergedProfile::new();
            grouped.add_grouped(&all, &["thread".to_owned()], &[""]);
            grouped
        } else {
            all
        };

        let graph = all.flamegraph(max_nodes);
        let levels = single_levels(&graph);
        assert!(levels.levels.iter().all(|row| row.len() % 4 == 0));
        let json = serde_json::to_vec(&graph);
        assert!(json.is_ok(), "the flame graph serializes");

        let difference = diff(&base, &compare, max_nodes);
        let levels = diff_levels(&difference);
        assert!(levels.levels.iter().all(|row| row.len() % 7 == 0));
        assert!(
            serde_json::to_vec(&difference).is_ok(),
            "the diff serializes"
        );

        let folded = all.folded();
        assert!(folded.lines().all(|line| line.rsplit_once(' ').is_some()));
        let top = all.top(top_limit);
        assert!(top.len() <= top_limit);
        let _ = all.to_pprof(&profile_type).encode_to_vec();
    }
    totals
}

/// The two profiles (base, comparison) that the stack list in `bytes`
/// describes, encoded as pprof.
fn stack_profiles(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut builders = [new_builder(), new_builder()];
    // One location per frame byte and side, so a long input stays cheap.
    let mut locations = [[0u64; 256], [0u64; 256]];
    for (i, stack) in bytes.split(|&b| b == 0).enumerate() {
        let [value, frames @ ..] = stack else {
            continue;
        };
        let side = i % 2;
        let builder = &mut builders[side];
        let mut ids = Vec::with_capacity(frames.len());
        for &frame in frames {
            let slot = &mut locations[side][usize::from(frame)];
            if *slot == 0 {
                *slot = frame_location(builder, frame);
            }
            ids.push(*slot);
        }
        let thread = LabelValue::Str(format!("t{}", value % 3));
        builder.sample(
            &ids,
            &[i64::from(*value) * 10_000_000],
            &[("thread", thread)],
        );
    }
    builders
        .map(|builder| builder.finish().encode_to_vec())
        .to_vec()
}

fn new_builder() -> ProfileBuilder {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    builder.time(NOW_MS * 1_000_000, 10_000_000_000);
    builder
}

/// The location of frame byte `frame`: function `frame & 63`, with
/// `frame >> 6` more functions inlined into it.
fn frame_location(builder: &mut ProfileBuilder, frame: u8) -> u64 {
    let mapping = builder.mapping(&MappingSpec {
        memory_start: 0x400000,
        memory_limit: 0x800000,
        filename: "/usr/bin/app".into(),
        has_functions: true,
        ..MappingSpec::default()
    });
    let lines: Vec<(u64, i64)> = (0..=frame >> 6)
        .map(|k| {
            let id = (frame & 63).wrapping_add(k * 7) & 63;
            let function = builder.function(&FunctionSpec {
                name: format!("fn_{id}"),
                system_name: String::new(),
                filename: "app.go".into(),
                start_line: i64::from(id),
            });
            (function, i64::from(k) + 1)
        })
        .collect();
    builder.location(mapping, 0x400000 + u64::from(frame) * 16, &lines)
}

/// Seeds: stack lists (shared prefixes, recursion, inlining, both sides)
/// and one pprof profile.
pub fn seeds(pprof: &[u8]) -> Vec<Vec<u8>> {
    let stacks: &[&[u8]] = &[
        // main -> work -> hot (base), main -> work -> cold (compare), ...
        &[3, 3, 2, 1],
        &[2, 4, 2, 1],
        &[5, 5, 5, 5, 1],
        &[1, 0x86, 0x45, 1],
        &[7, 9, 8, 2, 1],
        &[4, 0xc3, 2, 1],
    ];
    let mut list = vec![40, 0];
    list.extend(stacks.join(&0u8));
    let mut grouped = list.clone();
    grouped[1] = 2 | 3 << 2;
    let mut narrow = list.clone();
    narrow[0] = 2;
    let mut profile = vec![8, 1 | 5 << 2];
    profile.extend_from_slice(pprof);
    vec![list, grouped, narrow, profile]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_seeds_store_both_sides_and_render_them() {
        let seed = &seeds(&[])[0];
        let mut head = Head::new();
        for (service, pprof) in SERVICES.iter().zip(&stack_profiles(&seed[2..])) {
            store(&mut head, service, pprof);
        }
        let totals = render(&head, 8, 4, true);
        assert_eq!(totals.len(), 1, "one profile type");
        let (base, compare) = totals[0];
        assert!(base > 0 && compare > 0, "{totals:?}");
    }

    #[test]
    fn a_stack_of_sixteen_thousand_inlined_frames_is_refused_or_rendered() {
        // One location of four inlined lines, 4,000 times: 16,000 frames
        // from a body of a few KiB, on a test thread's ordinary stack.
        let mut input = vec![63, 0, 1];
        input.extend(std::iter::repeat_n(0xc1u8, 4000));
        query_trees(&input);
    }
}
