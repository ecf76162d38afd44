//! Rules compiled and evaluated on real encoded-then-decoded profiles, and
//! the recorded-series file read back or refused.

use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, Profile, ProfileBuilder};

use super::*;
use crate::head::{CheckedIngest, IngestLimits};
use crate::model::{MatchOp, NAME_LABEL};

fn cpu_type() -> ProfileType {
    ProfileType::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap()
}

/// main→json.Marshal→encode (30, pod a), main→json.Marshal→json.Marshal
/// (recursion, 5, pod a), main→work (60, pod b), and a zero sample.
fn profile() -> Profile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 10_000_000);
    let mut f = |name: &str| {
        b.function(&FunctionSpec {
            name: name.into(),
            ..Default::default()
        })
    };
    let (main, marshal, encode, work) = (f("main"), f("json.Marshal"), f("encode"), f("work"));
    let main_loc = b.location(0, 0x10, &[(main, 1)]);
    let marshal_loc = b.location(0, 0x20, &[(marshal, 2)]);
    // An inlined frame: encode within json.Marshal's location is one
    // location with two lines.
    let inlined = b.location(0, 0x30, &[(encode, 3), (marshal, 4)]);
    let work_loc = b.location(0, 0x40, &[(work, 5)]);
    let pod = |name: &str| vec![("pod", LabelValue::Str(name.into()))];
    b.sample(&[inlined, main_loc], &[30], &pod("a"));
    b.sample(&[marshal_loc, marshal_loc, main_loc], &[5], &pod("a"));
    b.sample(&[work_loc, main_loc], &[60], &pod("b"));
    b.sample(&[work_loc, main_loc], &[0], &pod("b"));
    let limits = DecodeLimits::default();
    kiln_pprof::decode(&kiln_pprof::encode_gzip(&b.finish()), &limits).expect("decodes")
}

fn checked(service: &str) -> CheckedIngest {
    let labels = LabelSet::new(vec![
        Label::new(NAME_LABEL, "process_cpu"),
        Label::new("service_name", service),
    ]);
    CheckedIngest::prepare(profile(), &labels, 10_000_000_000, &IngestLimits::default())
        .expect("checks")
}

fn rule(
    name: &str,
    matchers: &[Matcher],
    function: FunctionFilter,
    group_by: &[&str],
) -> RecordingRule {
    let group_by: Vec<String> = group_by.iter().map(|s| (*s).to_owned()).collect();
    RecordingRule::new(name, cpu_type(), true, matchers, function, &group_by).expect("compiles")
}

fn value_of(values: &[RecordedValue], labels: &[(&str, &str)]) -> Option<i64> {
    let wanted = LabelSet::new(labels.iter().map(|(n, v)| Label::new(*n, *v)).collect());
    values.iter().find(|v| v.labels == wanted).map(|v| v.value)
}

#[test]
fn a_rule_sums_the_counted_samples_by_its_group_by_labels() {
    let cpu_delta = ProfileType {
        delta: true,
        ..cpu_type()
    };
    let total = RecordingRule::new(
        "cpu_total",
        cpu_delta.clone(),
        true,
        &[],
        FunctionFilter::Any,
        &["pod".to_owned()],
    )
    .unwrap();
    let marshal = RecordingRule::new(
        "marshal",
        cpu_delta.clone(),
        true,
        &[],
        FunctionFilter::Exact("json.Marshal".to_owned()),
        &["service_name".to_owned()],
    )
    .unwrap();
    let regex = RecordingRule::new(
        "enc",
        cpu_delta,
        true,
        &[],
        FunctionFilter::regex("enc.*").unwrap(),
        &[],
    )
    .unwrap();
    let values =
        checked("shop").recorded_values(&RecordingRules::new(vec![total, marshal, regex]).unwrap());
    assert_eq!(
        value_of(&values, &[("__name__", "cpu_total"), ("pod", "a")]),
        Some(35)
    );
    assert_eq!(
        value_of(&values, &[("__name__", "cpu_total"), ("pod", "b")]),
        Some(60)
    );
    // Inlined and recursive frames count their sample once.
    assert_eq!(
        value_of(
            &values,
            &[("__name__", "marshal"), ("service_name", "shop")]
        ),
        Some(35)
    );
    assert_eq!(value_of(&values, &[("__name__", "enc")]), Some(30));
    assert_eq!(values.len(), 4, "{values:?}");
}

#[test]
fn a_rule_reads_only_its_profile_type_and_selected_series() {
    // The profile is a delta profile (it has a duration): the cumulative
    // type selects nothing.
    let cumulative = rule("cpu", &[], FunctionFilter::Any, &[]);
    assert!(
        checked("shop")
            .recorded_values(&RecordingRules::new(vec![cumulative]).unwrap())
            .is_empty()
    );
    // Written with five parts, the type takes deltas too.
    let either =
        RecordingRule::new("cpu", cpu_type(), false, &[], FunctionFilter::Any, &[]).unwrap();
    assert_eq!(
        checked("shop").recorded_values(&RecordingRules::new(vec![either]).unwrap())[0].value,
        95
    );
    let delta = ProfileType {
        delta: true,
        ..cpu_type()
    };
    let other_service = Matcher {
        name: "service_name".to_owned(),
        op: MatchOp::Equal,
        value: "cart".to_owned(),
    };
    let elsewhere = RecordingRule::new(
        "cpu",
        delta.clone(),
        true,
        &[other_service],
        FunctionFilter::Any,
        &[],
    )
    .unwrap();
    assert!(
        checked("shop")
            .recorded_values(&RecordingRules::new(vec![elsewhere.clone()]).unwrap())
            .is_empty()
    );
    assert_eq!(
        checked("cart").recorded_values(&RecordingRules::new(vec![elsewhere]).unwrap())[0].value,
        95
    );
    // A group-by label the series lacks is left out.
    let absent = RecordingRule::new(
        "cpu",
        delta,
        true,
        &[],
        FunctionFilter::Any,
        &["zone".to_owned()],
    )
    .unwrap();
    let values = checked("shop").recorded_values(&RecordingRules::new(vec![absent]).unwrap());
    assert_eq!(value_of(&values, &[("__name__", "cpu")]), Some(95));
}

#[test]
fn bad_rules_are_refused_by_name() {
    let bad = |name: &str, group_by: &[&str]| {
        let group_by: Vec<String> = group_by.iter().map(|s| (*s).to_owned()).collect();
        RecordingRule::new(name, cpu_type(), true, &[], FunctionFilter::Any, &group_by).unwrap_err()
    };
    assert!(matches!(bad("1abc", &[]), RuleError::MetricName { .. }));
    assert!(matches!(bad("a-b", &[]), RuleError::MetricName { .. }));
    assert!(matches!(
        bad(&"m".repeat(201), &[]),
        RuleError::MetricName { .. }
    ));
    assert!(matches!(
        bad("ok", &["pod", "pod"]),
        RuleError::GroupBy { .. }
    ));
    assert!(matches!(bad("ok", &["a:b"]), RuleError::GroupBy { .. }));
    let many: Vec<String> = (0..17).map(|i| format!("l{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(matches!(
        bad("ok", &many),
        RuleError::TooManyGroupBy { count: 17 }
    ));
    assert!(matches!(
        FunctionFilter::regex("(").unwrap_err(),
        RuleError::FunctionRegex { .. }
    ));
    assert!(matches!(
        FunctionFilter::regex(&"a".repeat(2000)).unwrap_err(),
        RuleError::FunctionRegex { .. }
    ));
    let bad_matcher = Matcher {
        name: "pod".to_owned(),
        op: MatchOp::Regex,
        value: "(".to_owned(),
    };
    assert!(matches!(
        RecordingRule::new(
            "ok",
            cpu_type(),
            true,
            &[bad_matcher],
            FunctionFilter::Any,
            &[]
        )
        .unwrap_err(),
        RuleError::Matcher { .. }
    ));
}

fn labels(metric: &str, pod: &str) -> LabelSet {
    LabelSet::new(vec![
        Label::new(METRIC_NAME_LABEL, metric),
        Label::new("pod", pod),
    ])
}

#[test]
fn points_sum_per_bucket_and_read_back_from_their_file() {
    let mut points = RecordedPoints::new();
    points.add(&labels("m", "a"), 1_000, 5);
    points.add(&labels("m", "a"), 9_999, 7);
    points.add(&labels("m", "a"), 10_000, 1);
    points.add(&labels("m", "b"), -25_000, 3);
    assert_eq!(points.point_count(), 3);
    assert_eq!(points.time_bounds(), Some((-30_000, 10_000)));
    let file = points.encode(&["a.krec".to_owned()]);
    assert_eq!(
        RecordedPoints::decode(&file).unwrap(),
        (points.clone(), vec!["a.krec".to_owned()])
    );

    let pod_a = crate::index::CompiledMatcher::new(&Matcher {
        name: "pod".to_owned(),
        op: MatchOp::Equal,
        value: "a".to_owned(),
    })
    .unwrap();
    let file = RecordedFile {
        name: "f".to_owned(),
        range: (-30_000, 20_000),
        points: std::sync::Arc::new(points.clone()),
        replaces: Vec::new(),
    };
    let mut raw = RecordedPoints::new();
    select_recorded(
        std::slice::from_ref(&file),
        std::slice::from_ref(&pod_a),
        &Steps::raw(0, 10_000),
        &mut raw,
    );
    let (only, series) = raw.series().next().unwrap();
    assert_eq!(only, &labels("m", "a"));
    assert_eq!(series.iter().collect::<Vec<_>>(), vec![(&0, &12)]);
    // Steps of 20 s from t=5 s: 5 s sums [-15 s, 5 s), 25 s sums [5 s, 25 s).
    let mut stepped = RecordedPoints::new();
    select_recorded(
        &[file],
        &[],
        &Steps::range(5_000, 25_000, 20_000),
        &mut stepped,
    );
    let sums: Vec<(String, i64, i64)> = stepped
        .series()
        .flat_map(|(l, p)| {
            p.iter()
                .map(|(t, v)| (l.get("pod").unwrap().to_owned(), *t, *v))
        })
        .collect();
    assert_eq!(
        sums,
        vec![("a".to_owned(), 5_000, 12), ("a".to_owned(), 25_000, 1)]
    );

    let mut merged = points.clone();
    merged.merge(&points);
    assert_eq!(merged.point_count(), 3);
    assert_eq!(merged.series().next().unwrap().1[&0], 24);
}

#[test]
fn damaged_files_are_refused_without_panicking() {
    let mut points = RecordedPoints::new();
    points.add(&labels("m", "a"), 1_000, 5);
    let file = points.encode(&["a".to_owned()]);
    for cut in 0..file.len() {
        assert!(
            RecordedPoints::decode(&file[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    for at in 0..file.len() {
        let mut flipped = file.clone();
        flipped[at] ^= 0x41;
        assert!(RecordedPoints::decode(&flipped).is_err(), "flip at {at}");
    }
    // A well-formed checksum over a hostile count is still refused.
    let mut hostile = b"KREC\x01\xff\xff\xff\xff\x0f".to_vec();
    let crc = crc32fast::hash(&hostile);
    hostile.extend_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        RecordedPoints::decode(&hostile),
        Err(RecordedFileError::Malformed { .. })
    ));
}

#[test]
fn a_merged_file_replaces_its_sources_points_only_within_its_range() {
    let file = |name: &str, range: (i64, i64), points: &[(i64, i64)], replaces: &[&str]| {
        let mut recorded = RecordedPoints::new();
        for &(t, v) in points {
            recorded.add(&labels("m", "a"), t, v);
        }
        RecordedFile {
            name: name.to_owned(),
            range,
            points: std::sync::Arc::new(recorded),
            replaces: replaces.iter().map(|s| (*s).to_owned()).collect(),
        }
    };
    // f1 spans two days; the day-1 merge (of f1's day-1 points) was written
    // but f1 was not deleted yet.
    let f1 = file("f1", (0, 300_000), &[(10_000, 1), (200_000, 2)], &[]);
    let day1 = file("d1", (0, 100_000), &[(10_000, 1)], &["f1"]);
    let mut sum = RecordedPoints::new();
    select_recorded(
        &[f1.clone(), day1.clone()],
        &[],
        &Steps::raw(0, 1_000_000),
        &mut sum,
    );
    let series: Vec<(i64, i64)> = sum
        .series()
        .next()
        .unwrap()
        .1
        .iter()
        .map(|(t, v)| (*t, *v))
        .collect();
    assert_eq!(series, vec![(10_000, 1), (200_000, 2)]);
    // A second merge of day 1 that also takes d1 keeps the same total.
    let day1_again = file("d1b", (0, 100_000), &[(10_000, 1)], &["d1", "f1"]);
    let mut again = RecordedPoints::new();
    select_recorded(
        &[f1, day1, day1_again],
        &[],
        &Steps::raw(0, 1_000_000),
        &mut again,
    );
    assert_eq!(again, sum);
}
