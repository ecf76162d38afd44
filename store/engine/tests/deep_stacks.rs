//! A stored stack of millions of frames cannot make a later query of its
//! range fail.
//!
//! Ingest now refuses a stack whose frames, with every location's inlined
//! lines unwound, are deeper than the decode limit (`kiln-pprof`'s
//! `hostile_inputs` and the store's `deep_stacks` test that). A store
//! that ran an older version may still hold such a stack: one location of
//! 4096 inlined lines repeated 4096 times is 16.7 million frames. These
//! tests put one straight into a head, decoded with the depth limit lifted
//! as an older store did, and build every tree a query builds from it: the
//! flame graph, the diff, the folded export, the top table and the pprof
//! export. Each runs on a thread with 256 KiB of stack, so any recursion
//! per frame fails the test, and each answer is checked to be trimmed
//! (within its node or depth cap) and whole (the root's total is the
//! merge's total).

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use std::time::Instant;

use kiln_contract::query_json::OTHER_NODE_NAME;
use kiln_engine::{
    CompiledSelector, FlameGraph, Head, IngestLimits, Label, LabelSet, MAX_FRAME_TREE_NODES,
    MAX_UNWOUND_FRAMES, MergedProfile, Queryable, Selector, TimeRange, diff,
};
use kiln_pprof::{DecodeLimits, FunctionSpec, Profile, ProfileBuilder};

const ALL: TimeRange = TimeRange {
    start_ms: 0,
    end_ms: i64::MAX,
};

/// Lines in the one deep location, and times the sample repeats it.
const LINES: usize = 4096;
const REPEATS: usize = 4096;
/// The deep sample's value, and a shallow sample's beside it.
const DEEP_VALUE: i64 = 5;
const SHALLOW_VALUE: i64 = 3;

/// A profile with one stack of `LINES * REPEATS` frames (seven functions
/// in turn, so the tree is not one name repeated) and one of two frames.
fn deep_profile() -> Profile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    let functions: Vec<u64> = (0..7)
        .map(|i| {
            b.function(&FunctionSpec {
                name: format!("frame{i}"),
                ..FunctionSpec::default()
            })
        })
        .collect();
    let lines: Vec<(u64, i64)> = (0..LINES)
        .map(|i| (functions[i % functions.len()], i as i64))
        .collect();
    let tower = b.location(0, 0x10, &lines);
    b.sample(&vec![tower; REPEATS], &[DEEP_VALUE], &[]);
    let main = b.function(&FunctionSpec {
        name: "main".into(),
        ..FunctionSpec::default()
    });
    let work = b.function(&FunctionSpec {
        name: "work".into(),
        ..FunctionSpec::default()
    });
    let main = b.location(0, 0x20, &[(main, 1)]);
    let work = b.location(0, 0x30, &[(work, 1)]);
    b.sample(&[work, main], &[SHALLOW_VALUE], &[]);
    // An older store checked locations and lines apart, never their product.
    let lifted = DecodeLimits {
        max_stack_depth: LINES * REPEATS,
        ..DecodeLimits::default()
    };
    Profile::validate(b.finish(), &lifted).unwrap()
}

/// A head holding the deep profile, merged whole.
fn deep_merge() -> MergedProfile {
    let mut head = Head::new();
    let labels = LabelSet::new(vec![Label::new("__name__", "process_cpu")]);
    head.ingest(
        &deep_profile(),
        &labels,
        1_700_000_000_000,
        0,
        &IngestLimits::default(),
    )
    .unwrap();
    let profile_type = head.profile_types(ALL).into_iter().next().unwrap();
    let selector = CompiledSelector::new(&Selector {
        profile_type,
        matchers: vec![],
    })
    .unwrap();
    let mut merged = MergedProfile::new();
    head.merge_into(&selector, ALL, &mut merged).unwrap();
    merged
}

/// Runs `work` on a thread with 256 KiB of stack; a stack overflow there
/// aborts the test process, which fails the test.
fn on_small_stack<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .name("small-stack".to_owned())
        .stack_size(256 << 10)
        .spawn(work)
        .unwrap()
        .join()
        .unwrap()
}

/// Checks that every node's total is its self value plus its children's,
/// and returns the depth of the deepest node.
fn check_graph(graph: &FlameGraph) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(graph.root(), 0usize)];
    let mut seen = 0;
    while let Some((node, depth)) = pending.pop() {
        seen += 1;
        deepest = deepest.max(depth);
        let children = graph.children(node);
        let sum: i64 = children.iter().map(|c| c.total).sum();
        assert_eq!(node.total, node.self_value + sum);
        pending.extend(children.iter().map(|c| (c, depth + 1)));
    }
    assert_eq!(seen, graph.node_count(), "every node is reachable once");
    deepest
}

#[test]
fn a_stored_sixteen_million_frame_stack_gives_trimmed_whole_trees() {
    on_small_stack(|| {
        let started = Instant::now();
        let merged = deep_merge();
        let total = DEEP_VALUE + SHALLOW_VALUE;
        assert_eq!(merged.total(), total);
        println!("ingest and merge: {:?}", started.elapsed());

        for max_nodes in [8192, MAX_FRAME_TREE_NODES] {
            let started = Instant::now();
            let graph = merged.flamegraph(max_nodes);
            let built = started.elapsed();
            assert!(graph.node_count() <= max_nodes, "{}", graph.node_count());
            assert_eq!(graph.root().total, total, "the root keeps every value");
            let depth = check_graph(&graph);
            assert!(
                graph
                    .nodes
                    .iter()
                    .any(|n| graph.name(n) == OTHER_NODE_NAME && n.total == DEEP_VALUE),
                "the frames past the cap are one (other) node carrying the deep value"
            );
            let started = Instant::now();
            let json = serde_json::to_vec(&graph).unwrap();
            println!(
                "flame graph, max_nodes {max_nodes}: {} nodes, {depth} deep, built in {built:?}, \
                 {} bytes of JSON in {:?}",
                graph.node_count(),
                json.len(),
                started.elapsed()
            );
            let started = Instant::now();
            drop(graph);
            drop(json);
            println!("dropped in {:?}", started.elapsed());
        }

        let started = Instant::now();
        let d = diff(&merged, &MergedProfile::new(), MAX_FRAME_TREE_NODES);
        assert!(d.node_count() <= MAX_FRAME_TREE_NODES);
        assert_eq!((d.root().base_total, d.root().compare_total), (total, 0));
        let json = serde_json::to_vec(&d).unwrap();
        println!(
            "diff: {} nodes, {} bytes of JSON, in {:?}",
            d.node_count(),
            json.len(),
            started.elapsed()
        );

        let started = Instant::now();
        let folded = merged.folded();
        let mut sum = 0;
        for line in folded.lines() {
            let (frames, value) = line.rsplit_once(' ').unwrap();
            assert!(frames.split(';').count() <= MAX_UNWOUND_FRAMES + 1);
            sum += value.parse::<i64>().unwrap();
        }
        assert_eq!(sum, total, "folded stacks keep every value");
        assert!(folded.contains(&format!(";{OTHER_NODE_NAME} {DEEP_VALUE}\n")));
        println!("folded: {} bytes in {:?}", folded.len(), started.elapsed());

        let started = Instant::now();
        let top = merged.top(100);
        let main = top.iter().find(|e| e.name == "main").unwrap();
        assert_eq!((main.flat, main.cumulative), (0, SHALLOW_VALUE));
        let leaf = top.iter().find(|e| e.name == "frame0").unwrap();
        assert_eq!(leaf.cumulative, DEEP_VALUE, "recursion counts once");
        println!("top: {} rows in {:?}", top.len(), started.elapsed());

        let started = Instant::now();
        let pprof = merged.to_pprof(
            &kiln_engine::ProfileType::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
                .unwrap(),
        );
        assert_eq!(pprof.sample.len(), 2);
        println!("pprof export in {:?}", started.elapsed());
    });
}
