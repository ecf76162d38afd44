//! Ingest normalization (labels, profile types, zero values, limits) and
//! what a merge renders into (flame graph, top table, diff, timeline, pprof).

#![allow(clippy::unwrap_used)] // Test helpers outside #[test] fns may unwrap too.

use kiln_engine::{
    CompiledSelector, FlameGraph, FlameNode, Head, IngestError, IngestLimits, Label, LabelSet,
    MatchOp, Matcher, MergedProfile, ProfileType, QueryError, Queryable, Selector, TimeRange,
    Timeline, diff,
};
use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, Profile, ProfileBuilder};

const T: i64 = 1_700_000_000_000;
const ALL: TimeRange = TimeRange {
    start_ms: 0,
    end_ms: i64::MAX,
};

fn labels(pairs: &[(&str, &str)]) -> LabelSet {
    LabelSet::new(pairs.iter().map(|(n, v)| Label::new(*n, *v)).collect())
}

/// One sample to build: frames (leaf first), values, labels.
type SampleSpec<'a> = (&'a [&'a str], [i64; 2], Vec<(&'a str, LabelValue)>);

/// Stacks are root-last lists of function names; every location has one
/// line except those named `a+b`, which hold two inlined lines (`a` innermost).
fn build(stacks: &[SampleSpec<'_>]) -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    for (frames, values, sample_labels) in stacks {
        let ids: Vec<u64> = frames
            .iter()
            .map(|frame| {
                let lines: Vec<(u64, i64)> = frame
                    .split('+')
                    .map(|name| {
                        let f = b.function(&FunctionSpec {
                            name: name.into(),
                            system_name: name.into(),
                            ..FunctionSpec::default()
                        });
                        (f, 1)
                    })
                    .collect();
                b.location(0, 0, &lines)
            })
            .collect();
        let refs: Vec<(&str, LabelValue)> =
            sample_labels.iter().map(|(k, v)| (*k, v.clone())).collect();
        b.sample(&ids, values, &refs);
    }
    Profile::validate(b.finish(), &DecodeLimits::default()).unwrap()
}

fn cpu_type(head: &Head) -> ProfileType {
    head.profile_types(ALL)
        .into_iter()
        .find(|t| t.sample_type == "cpu")
        .unwrap()
}

fn merge(head: &Head, matchers: Vec<Matcher>) -> MergedProfile {
    let mut merged = MergedProfile::new();
    let selector = CompiledSelector::new(&Selector {
        profile_type: cpu_type(head),
        matchers,
    })
    .unwrap();
    head.merge_into(&selector, ALL, &mut merged).unwrap();
    merged
}

#[test]
fn string_labels_are_promoted_and_span_and_numeric_labels_stay_per_sample() {
    let profile = build(&[
        (
            &["leaf", "main"],
            [1, 10],
            vec![("handler", LabelValue::Str("/a".into()))],
        ),
        (
            &["leaf", "main"],
            [2, 20],
            vec![("pod", LabelValue::Str("inner".into()))],
        ),
        (
            &["other", "main"],
            [3, 30],
            vec![("span_id", LabelValue::Str("abc".into()))],
        ),
        (
            &["alloc", "main"],
            [4, 40],
            vec![(
                "bytes",
                LabelValue::Num {
                    value: 512,
                    unit: "bytes".into(),
                },
            )],
        ),
    ]);
    let mut head = Head::new();
    let series_labels = labels(&[("__name__", "process_cpu"), ("pod", "p1")]);
    head.ingest(
        &profile,
        &series_labels,
        T,
        10_000_000_000,
        &IngestLimits::default(),
    )
    .unwrap();
    let names = head.label_names(&[], ALL).unwrap();
    assert!(names.contains(&"handler".to_owned()));
    assert!(names.contains(&"exported_pod".to_owned()), "{names:?}");
    assert!(!names.contains(&"span_id".to_owned()));
    assert!(!names.contains(&"bytes".to_owned()));
    assert_eq!(
        head.label_values("exported_pod", &[], ALL).unwrap(),
        vec!["inner"]
    );
    let by_handler = merge(
        &head,
        vec![Matcher {
            name: "handler".into(),
            op: MatchOp::Equal,
            value: "/a".into(),
        }],
    );
    assert_eq!(by_handler.total(), 10);

    // Span and numeric labels come back in pprof export.
    let merged = merge(&head, vec![]);
    assert_eq!(merged.total(), 100);
    let exported =
        Profile::validate(merged.to_pprof(&cpu_type(&head)), &DecodeLimits::default()).unwrap();
    let mut kept: Vec<String> = exported
        .samples()
        .iter()
        .flat_map(|s| &s.label)
        .map(|l| {
            format!(
                "{}={}{}{}",
                exported.string(l.key),
                exported.string(l.str),
                l.num,
                exported.string(l.num_unit)
            )
        })
        .collect();
    kept.sort();
    assert_eq!(kept, vec!["bytes=512bytes", "span_id=abc0"]);
}

/// The agent's profiles carry `pid`, `tid` and `comm` on every sample: they
/// stay per sample, so a host's processes share one series (a label per
/// pid would let one busy host use up everyone's series budget).
#[test]
fn the_agents_process_labels_stay_per_sample_and_make_no_series() {
    use kiln_contract::sample_labels::{COMM, PER_SAMPLE_LABELS, PID, TID};
    let process = |pid: &str, tid: &str, comm: &str| {
        vec![
            (PID, LabelValue::Str(pid.into())),
            (TID, LabelValue::Str(tid.into())),
            (COMM, LabelValue::Str(comm.into())),
            ("node", LabelValue::Str("n1".into())),
        ]
    };
    let profile = build(&[
        (&["work", "main"], [1, 10], process("100", "101", "make")),
        (&["work", "main"], [2, 20], process("200", "200", "cc1")),
        (&["spin", "main"], [3, 30], process("300", "301", "cc1")),
    ]);
    let mut head = Head::new();
    head.ingest(
        &profile,
        &labels(&[("__name__", "process_cpu")]),
        T,
        10_000_000_000,
        &IngestLimits::default(),
    )
    .unwrap();
    let names = head.label_names(&[], ALL).unwrap();
    for name in PER_SAMPLE_LABELS {
        assert!(!names.contains(&name.to_owned()), "{name} in {names:?}");
    }
    assert!(
        names.contains(&"node".to_owned()),
        "other strings are promoted"
    );
    assert_eq!(
        head.series_count(),
        2,
        "one series per sample type, whatever the processes"
    );

    // Each process's samples stay apart, and come back in pprof export.
    let merged = merge(&head, vec![]);
    assert_eq!(merged.total(), 60);
    let exported =
        Profile::validate(merged.to_pprof(&cpu_type(&head)), &DecodeLimits::default()).unwrap();
    let mut kept: Vec<(String, i64)> = exported
        .samples()
        .iter()
        .map(|sample| {
            let mut labels: Vec<String> = sample
                .label
                .iter()
                .map(|l| format!("{}={}", exported.string(l.key), exported.string(l.str)))
                .collect();
            labels.sort();
            (labels.join(","), sample.value[0])
        })
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        vec![
            ("comm=cc1,pid=200,tid=200".to_owned(), 20),
            ("comm=cc1,pid=300,tid=301".to_owned(), 30),
            ("comm=make,pid=100,tid=101".to_owned(), 10),
        ]
    );
}

#[test]
fn each_sample_type_is_a_profile_type_and_zero_values_are_dropped() {
    let profile = build(&[(&["a"], [0, 5], vec![]), (&["b"], [0, 0], vec![])]);
    let mut head = Head::new();
    let stats = head
        .ingest(
            &profile,
            &labels(&[("__name__", "process_cpu")]),
            T,
            0,
            &IngestLimits::default(),
        )
        .unwrap();
    assert_eq!(stats.samples, 1);
    assert_eq!(stats.zero_values_dropped, 3);
    // `samples` had only zeros, so only `cpu` has a series; no duration, so no `:delta`.
    let types: Vec<String> = head
        .profile_types(ALL)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(types, vec!["process_cpu:cpu:nanoseconds:cpu:nanoseconds"]);
    assert_eq!(
        ProfileType::parse(&types[0]),
        Some(head.profile_types(ALL)[0].clone())
    );
    assert_eq!(head.time_bounds(), Some((T, T)));
    assert_eq!(head.profiles(), 1);
}

#[test]
fn limit_violations_are_clear_errors_and_change_nothing() {
    let profile = build(&[(
        &["a"],
        [1, 1],
        vec![("handler", LabelValue::Str("x".repeat(300)))],
    )]);
    let ok_labels = labels(&[("__name__", "process_cpu")]);
    let cases: Vec<(LabelSet, IngestLimits, &str)> = vec![
        (
            labels(&[("pod", "p")]),
            IngestLimits::default(),
            "missing_name",
        ),
        (ok_labels.clone(), IngestLimits::default(), ""),
        (
            ok_labels.clone(),
            IngestLimits {
                max_label_value_bytes: 100,
                ..IngestLimits::default()
            },
            "label_value_too_long",
        ),
        (
            labels(&[("__name__", "process_cpu"), (&"n".repeat(300), "v")]),
            IngestLimits::default(),
            "label_name_too_long",
        ),
        (
            ok_labels.clone(),
            IngestLimits {
                max_labels_per_series: 2,
                ..IngestLimits::default()
            },
            "too_many_labels",
        ),
        (
            ok_labels.clone(),
            IngestLimits {
                max_series_per_profile_name: 1,
                ..IngestLimits::default()
            },
            "too_many_series",
        ),
        (
            ok_labels,
            IngestLimits {
                max_samples_per_profile: 0,
                ..IngestLimits::default()
            },
            "too_many_samples",
        ),
    ];
    for (series_labels, limits, reason) in cases {
        let mut head = Head::new();
        let result = head.ingest(&profile, &series_labels, T, 0, &limits);
        if reason.is_empty() {
            assert!(result.is_ok());
            continue;
        }
        let error: IngestError = result.unwrap_err();
        assert_eq!(error.reason(), reason, "{error}");
        assert!(head.is_empty() && head.series_count() == 0 && head.profiles() == 0);
    }
}

fn check_totals(graph: &FlameGraph) {
    for node in &graph.nodes {
        let children: i64 = graph.children(node).iter().map(|c| c.total).sum();
        assert_eq!(node.total, node.self_value + children);
    }
}

/// Nodes reachable from the root.
fn count(graph: &FlameGraph) -> usize {
    let mut pending = vec![graph.root()];
    let mut seen = 0;
    while let Some(node) = pending.pop() {
        seen += 1;
        pending.extend(graph.children(node));
    }
    seen
}

#[test]
fn flamegraph_expands_inlined_frames_and_trims_without_losing_totals() {
    let mut stacks: Vec<SampleSpec<'_>> = vec![
        (&["inner+outer", "main"], [1, 7], vec![]),
        (&["main"], [1, 3], vec![]),
    ];
    let leaves: Vec<String> = (0..50).map(|i| format!("leaf{i}")).collect();
    let leaf_stacks: Vec<[&str; 2]> = leaves.iter().map(|l| [l.as_str(), "main"]).collect();
    for (i, stack) in leaf_stacks.iter().enumerate() {
        stacks.push((stack, [1, i as i64 + 1], vec![]));
    }
    let profile = build(&stacks);
    let mut head = Head::new();
    head.ingest(
        &profile,
        &labels(&[("__name__", "process_cpu")]),
        T,
        0,
        &IngestLimits::default(),
    )
    .unwrap();
    let merged = merge(&head, vec![]);
    let full = merged.flamegraph(10_000);
    assert_eq!(full.root().total, merged.total());
    check_totals(&full);
    // main -> outer -> inner: the inlined frame sits below its caller.
    let name = |n: &FlameNode| full.names[n.name as usize].clone();
    let main = &full.children(full.root())[0];
    let outer = full
        .children(main)
        .iter()
        .find(|c| name(c) == "outer")
        .unwrap();
    assert_eq!(name(&full.children(outer)[0]), "inner");
    assert_eq!(full.children(outer)[0].self_value, 7);
    assert_eq!(main.self_value, 3);

    for budget in [1, 2, 3, 5, 10, 20] {
        let trimmed = merged.flamegraph(budget);
        assert!(
            trimmed.node_count() <= budget.max(2),
            "{budget}: {}",
            trimmed.node_count()
        );
        assert_eq!(count(&trimmed), trimmed.node_count());
        assert_eq!(trimmed.root().total, merged.total());
        check_totals(&trimmed);
    }
}

#[test]
fn top_counts_recursion_once_and_diff_carries_both_sides() {
    let profile = build(&[
        (&["f", "f", "main"], [1, 5], vec![]),
        (&["g", "main"], [1, 2], vec![]),
    ]);
    let mut head = Head::new();
    head.ingest(
        &profile,
        &labels(&[("__name__", "process_cpu")]),
        T,
        0,
        &IngestLimits::default(),
    )
    .unwrap();
    let merged = merge(&head, vec![]);
    let top = merged.top(10);
    let f = top.iter().find(|e| e.name == "f").unwrap();
    assert_eq!((f.flat, f.cumulative), (5, 5));
    let main = top.iter().find(|e| e.name == "main").unwrap();
    assert_eq!((main.flat, main.cumulative), (0, 7));
    assert_eq!(top[0].name, "f");
    assert_eq!(merged.top(1).len(), 1);

    let empty = MergedProfile::new();
    let d = diff(&empty, &merged, 100);
    assert_eq!((d.root().base_total, d.root().compare_total), (0, 7));
}

#[test]
fn bad_queries_are_clear_errors() {
    let profile = build(&[(&["a"], [1, 1], vec![])]);
    let mut head = Head::new();
    head.ingest(
        &profile,
        &labels(&[("__name__", "process_cpu")]),
        T,
        0,
        &IngestLimits::default(),
    )
    .unwrap();
    // Refused once, when the query compiles it, before any head or block.
    let error = CompiledSelector::new(&Selector {
        profile_type: cpu_type(&head),
        matchers: vec![Matcher {
            name: "pod".into(),
            op: MatchOp::Regex,
            value: "(".into(),
        }],
    })
    .unwrap_err();
    assert!(matches!(error, QueryError::InvalidRegex { .. }));
    let range = TimeRange {
        start_ms: 0,
        end_ms: 1_000,
    };
    assert!(matches!(
        Timeline::new(range, 0),
        Err(QueryError::InvalidStep { .. })
    ));
    assert!(matches!(
        Timeline::new(ALL, 1),
        Err(QueryError::TooManySteps { .. })
    ));
    let empty = TimeRange {
        start_ms: 5,
        end_ms: 5,
    };
    assert!(matches!(
        Timeline::new(empty, 1),
        Err(QueryError::EmptyRange { .. })
    ));
    let mut timeline = Timeline::new(
        TimeRange {
            start_ms: T - 5_000,
            end_ms: T + 5_000,
        },
        1_000,
    )
    .unwrap();
    head.timeline_into(
        &CompiledSelector::new(&Selector {
            profile_type: cpu_type(&head),
            matchers: vec![],
        })
        .unwrap(),
        ALL,
        &mut timeline,
    )
    .unwrap();
    assert_eq!(timeline.values[5], 1);
    assert_eq!(timeline.total(), 1);
}

#[test]
fn head_block_and_merge_results_can_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Head>();
    assert_send_sync::<kiln_engine::Block>();
    assert_send_sync::<MergedProfile>();
    assert_send_sync::<Timeline>();
}

/// A string table may hold one label value twice; both spellings must land
/// in one series with one run and the right total.
#[test]
fn duplicate_label_strings_in_one_profile_merge_into_one_series() {
    use kiln_pprof::proto;
    let strings = ["", "cpu", "nanoseconds", "handler", "x", "x", "main"];
    let raw = proto::Profile {
        sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
        string_table: strings.iter().map(|s| s.as_bytes().to_vec()).collect(),
        function: vec![proto::Function {
            id: 1,
            name: 6,
            system_name: 6,
            ..proto::Function::default()
        }],
        location: vec![proto::Location {
            id: 1,
            line: vec![proto::Line {
                function_id: 1,
                line: 1,
                column: 0,
            }],
            ..proto::Location::default()
        }],
        sample: [4, 5]
            .iter()
            .map(|&value_string| proto::Sample {
                location_id: vec![1],
                value: vec![value_string],
                label: vec![proto::Label {
                    key: 3,
                    str: value_string,
                    num: 0,
                    num_unit: 0,
                }],
            })
            .collect(),
        ..proto::Profile::default()
    };
    let profile = Profile::validate(raw, &DecodeLimits::default()).unwrap();
    let mut head = Head::new();
    head.ingest(
        &profile,
        &labels(&[("__name__", "p")]),
        T,
        0,
        &IngestLimits::default(),
    )
    .unwrap();
    assert_eq!(head.series_count(), 1);
    let merged = merge(&head, vec![]);
    assert_eq!(merged.total(), 9);
    let mut timeline = Timeline::new(
        TimeRange {
            start_ms: T,
            end_ms: T + 1,
        },
        1,
    )
    .unwrap();
    let selector = CompiledSelector::new(&Selector {
        profile_type: cpu_type(&head),
        matchers: vec![],
    })
    .unwrap();
    head.timeline_into(&selector, ALL, &mut timeline).unwrap();
    assert_eq!(timeline.values, vec![9]);
}

/// Function names of each exported sample's stack, root first, with its value.
fn exported_stacks(exported: &Profile) -> Vec<(String, i64)> {
    let mut stacks: Vec<(String, i64)> = exported
        .samples()
        .iter()
        .map(|sample| {
            let names: Vec<&str> = sample
                .location_id
                .iter()
                .rev()
                .flat_map(|&id| {
                    let location = exported.locations().iter().find(|l| l.id == id).unwrap();
                    location.line.iter().rev().map(|line| {
                        let function = exported
                            .functions()
                            .iter()
                            .find(|f| f.id == line.function_id)
                            .unwrap();
                        exported.string(function.name)
                    })
                })
                .collect();
            (names.join(";"), sample.value[0])
        })
        .collect();
    stacks.sort();
    stacks
}

#[test]
fn a_trimmed_pprof_keeps_the_heaviest_functions_and_cuts_the_rest_into_other() {
    // main 100: hot 60 (leaf 50 under it), cold1 25, cold2 10, cold3 5.
    let profile = build(&[
        (&["leaf", "hot", "main"], [5, 50], vec![]),
        (&["hot", "main"], [1, 10], vec![]),
        (&["cold1", "main"], [2, 25], vec![]),
        (&["deeper", "cold2", "main"], [1, 10], vec![]),
        (&["cold3", "main"], [1, 5], vec![]),
    ]);
    let mut head = Head::new();
    head.ingest(
        &profile,
        &labels(&[("__name__", "process_cpu")]),
        T,
        10_000_000_000,
        &IngestLimits::default(),
    )
    .unwrap();
    let merged = merge(&head, vec![]);
    let profile_type = cpu_type(&head);
    let untrimmed =
        Profile::validate(merged.to_pprof(&profile_type), &DecodeLimits::default()).unwrap();
    assert_eq!(untrimmed.functions().len(), 7);

    let trimmed = Profile::validate(
        merged.to_pprof_trimmed(&profile_type, 4),
        &DecodeLimits::default(),
    )
    .unwrap();
    let names: Vec<&str> = trimmed
        .functions()
        .iter()
        .map(|f| trimmed.string(f.name))
        .collect();
    assert_eq!(names.len(), 5, "4 kept and `other`: {names:?}");
    let stacks = exported_stacks(&trimmed);
    eprintln!("trimmed to 4 functions: {stacks:?}");
    assert_eq!(
        stacks,
        vec![
            // cold2 (with deeper under it) and cold3 are cut into one sample.
            ("main;(other)".to_owned(), 15),
            ("main;cold1".to_owned(), 25),
            ("main;hot".to_owned(), 10),
            ("main;hot;leaf".to_owned(), 50),
        ]
    );
    let total: i64 = stacks.iter().map(|(_, v)| v).sum();
    assert_eq!(total, merged.total(), "values still add up");

    // Asking for more functions than there are changes nothing.
    let whole = merged.to_pprof_trimmed(&profile_type, 100);
    let whole = Profile::validate(whole, &DecodeLimits::default()).unwrap();
    assert_eq!(exported_stacks(&whole), exported_stacks(&untrimmed));
}
