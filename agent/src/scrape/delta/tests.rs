use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, MappingSpec, ProfileBuilder};

use super::*;

/// A Go-like heap profile: per function, (alloc_objects, alloc_space,
/// inuse_objects, inuse_space), with ids numbered from `id_offset` so
/// that identity by ids would fail.
fn heap(stacks: &[(&str, [i64; 4])], reversed: bool) -> Profile {
    let mut builder = ProfileBuilder::new(&[
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]);
    builder.period("space", "bytes", 1).time(5, 1);
    let mapping = builder.mapping(&MappingSpec::default());
    let mut ordered: Vec<_> = stacks.to_vec();
    if reversed {
        ordered.reverse();
    }
    for (name, values) in ordered {
        let function = builder.function(&FunctionSpec {
            name: name.to_owned(),
            filename: "main.go".to_owned(),
            ..FunctionSpec::default()
        });
        let leaf = builder.location(mapping, 0, &[(function, 10)]);
        builder.sample(
            &[leaf],
            &values,
            &[(
                "bytes",
                LabelValue::Num {
                    value: 64,
                    unit: "bytes".to_owned(),
                },
            )],
        );
    }
    let bytes = kiln_pprof::encode_gzip(&builder.finish());
    kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid")
}

fn names(profile: &proto::Profile) -> Vec<String> {
    profile
        .sample_type
        .iter()
        .map(|t| {
            let index = usize::try_from(t.r#type).expect("index");
            String::from_utf8_lossy(&profile.string_table[index]).into_owned()
        })
        .collect()
}

fn values(outcome: &DeltaOutcome) -> Vec<Vec<i64>> {
    match outcome {
        DeltaOutcome::Delta(p) | DeltaOutcome::Restarted(p) => {
            p.sample.iter().map(|s| s.value.clone()).collect()
        }
        other => panic!("no profile: {other:?}"),
    }
}

#[test]
fn heap_keeps_inuse_and_allocs_keeps_alloc() {
    let stacks = [("main.grow", [4, 400, 1, 100])];
    let heap_kept = prepare(PprofProfile::Heap, heap(&stacks, false)).expect("kept");
    assert_eq!(names(&heap_kept.profile), ["inuse_objects", "inuse_space"]);
    assert_eq!(heap_kept.profile.sample[0].value, [1, 100]);
    let default = usize::try_from(heap_kept.profile.default_sample_type).expect("index");
    assert_eq!(heap_kept.profile.string_table[default], b"inuse_space");
    let allocs = prepare(PprofProfile::Allocs, heap(&stacks, false)).expect("kept");
    assert_eq!(names(&allocs.profile), ["alloc_objects", "alloc_space"]);
    assert_eq!(allocs.profile.sample[0].value, [4, 400]);
}

#[test]
fn a_profile_without_the_kept_types_is_refused() {
    let mut builder = ProfileBuilder::new(&[("goroutine", "count")]);
    let mapping = builder.mapping(&MappingSpec::default());
    let leaf = builder.location(mapping, 0x10, &[]);
    builder.sample(&[leaf], &[3], &[]);
    let bytes = kiln_pprof::encode_gzip(&builder.finish());
    let profile = kiln_pprof::decode(&bytes, &DecodeLimits::default()).expect("valid");
    let error = prepare(PprofProfile::Heap, profile).expect_err("no inuse_*");
    assert_eq!(error.reason(), "sample_types");
    assert!(error.to_string().contains("goroutine"), "{error}");
}

#[test]
fn the_first_scrape_is_a_baseline_then_deltas_by_stack_not_by_id() {
    let mut state = DeltaState::new(1 << 20);
    let first = prepare(
        PprofProfile::Allocs,
        heap(
            &[("main.a", [1, 100, 0, 0]), ("main.b", [2, 200, 0, 0])],
            false,
        ),
    )
    .expect("kept");
    assert_eq!(
        state.delta("pod/c", PprofProfile::Allocs, first, 1_000),
        DeltaOutcome::Baseline
    );
    // The same stacks in another order (other ids), `main.a` unchanged.
    let second = prepare(
        PprofProfile::Allocs,
        heap(
            &[("main.a", [1, 100, 0, 0]), ("main.b", [5, 500, 0, 0])],
            true,
        ),
    )
    .expect("kept");
    let outcome = state.delta("pod/c", PprofProfile::Allocs, second, 3_000);
    assert!(matches!(outcome, DeltaOutcome::Delta(_)), "{outcome:?}");
    assert_eq!(values(&outcome), [[3, 300]]);
    if let DeltaOutcome::Delta(p) = &outcome {
        assert_eq!((p.time_nanos, p.duration_nanos), (1_000, 2_000));
    }
    // Another endpoint has a baseline of its own.
    let other = prepare(
        PprofProfile::Allocs,
        heap(&[("main.a", [9, 9, 0, 0])], false),
    )
    .expect("kept");
    assert_eq!(
        state.delta("pod/d", PprofProfile::Allocs, other, 3_000),
        DeltaOutcome::Baseline
    );
}

#[test]
fn a_value_that_falls_is_a_restart_and_the_scrape_is_stored_whole() {
    let mut state = DeltaState::new(1 << 20);
    let scrape = |stacks: &[(&str, [i64; 4])]| {
        prepare(PprofProfile::Allocs, heap(stacks, false)).expect("kept")
    };
    state.delta(
        "e",
        PprofProfile::Allocs,
        scrape(&[("main.a", [9, 900, 0, 0])]),
        1,
    );
    let restarted = state.delta(
        "e",
        PprofProfile::Allocs,
        scrape(&[("main.a", [2, 200, 0, 0]), ("main.b", [1, 10, 0, 0])]),
        2,
    );
    assert!(
        matches!(restarted, DeltaOutcome::Restarted(_)),
        "{restarted:?}"
    );
    assert_eq!(values(&restarted), [[2, 200], [1, 10]]);
    // A vanished stack is a restart too (cumulative stacks never go).
    let vanished = state.delta(
        "e",
        PprofProfile::Allocs,
        scrape(&[("main.b", [3, 30, 0, 0])]),
        3,
    );
    assert!(
        matches!(vanished, DeltaOutcome::Restarted(_)),
        "{vanished:?}"
    );
    // And deltas resume against the new baseline.
    let next = state.delta(
        "e",
        PprofProfile::Allocs,
        scrape(&[("main.b", [4, 40, 0, 0])]),
        4,
    );
    assert_eq!(values(&next), [[1, 10]]);
}

#[test]
fn a_zero_sample_that_gains_a_label_is_no_restart() {
    let mut state = DeltaState::new(1 << 20);
    let scrape = |stacks: &[(&str, [i64; 4])]| {
        prepare(PprofProfile::Allocs, heap(stacks, false)).expect("kept")
    };
    state.delta(
        "e",
        PprofProfile::Allocs,
        scrape(&[("main.a", [1, 10, 0, 0]), ("main.later", [0, 0, 0, 0])]),
        1,
    );
    // `main.later` now counted, under another label set in Go; here it
    // is simply gone as a zero: no restart, `main.a` a plain delta.
    let next = state.delta(
        "e",
        PprofProfile::Allocs,
        scrape(&[("main.a", [2, 20, 0, 0])]),
        2,
    );
    assert!(matches!(next, DeltaOutcome::Delta(_)), "{next:?}");
    assert_eq!(values(&next), [[1, 10]]);
}

#[test]
fn state_stays_within_its_budget_and_forgets_gone_endpoints() {
    let one = || {
        prepare(
            PprofProfile::Allocs,
            heap(&[("main.a", [1, 1, 0, 0])], false),
        )
    };
    let mut state = DeltaState::new(200);
    state.delta("a", PprofProfile::Allocs, one().expect("kept"), 1);
    let held = state.bytes();
    assert!(held > 0 && held <= 200, "{held}");
    let many: Vec<(String, [i64; 4])> = (0..10)
        .map(|i| (format!("main.f{i}"), [1, 1, 0, 0]))
        .collect();
    let many: Vec<(&str, [i64; 4])> = many.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let big = prepare(PprofProfile::Allocs, heap(&many, false)).expect("kept");
    assert_eq!(
        state.delta("b", PprofProfile::Allocs, big, 1),
        DeltaOutcome::OverBudget
    );
    assert_eq!(state.bytes(), held);
    state.retain(|endpoint| endpoint != "a");
    assert_eq!(state.bytes(), 0);
    assert_eq!(
        state.delta("a", PprofProfile::Allocs, one().expect("kept"), 2),
        DeltaOutcome::Baseline
    );
}

#[test]
fn a_gauge_has_no_duration() {
    let kept = prepare(PprofProfile::Heap, heap(&[("main.a", [1, 1, 1, 1])], false)).expect("kept");
    let gauge = as_gauge(kept.profile, 42);
    assert_eq!((gauge.time_nanos, gauge.duration_nanos), (42, 0));
}
