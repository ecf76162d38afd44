//! Checks and limits of `Head::ingest`, and the store's `check_ingest`.

use kiln_pprof::{DecodeLimits, FunctionSpec, LabelValue, Profile, ProfileBuilder};

use super::IngestLimits;
use super::limits::label_bytes;
use crate::error::IngestError;
use crate::head::Head;
use crate::model::{Label, LabelSet, NAME_LABEL, NAMESPACE_LABEL, TimeRange};
use crate::query::Queryable;

/// `samples` samples, each with its own string label `k=<i>`.
fn distinct_label_profile(samples: usize) -> Profile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    let f = b.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let loc = b.location(0, 0x1000, &[(f, 1)]);
    for i in 0..samples {
        b.sample(&[loc], &[1], &[("k", LabelValue::Str(i.to_string()))]);
    }
    let limits = DecodeLimits {
        max_decoded_bytes: usize::MAX,
        ..DecodeLimits::default()
    };
    kiln_pprof::decode(&kiln_pprof::encode_gzip(&b.finish()), &limits).expect("decodes")
}

fn long_labels(count: usize, bytes: usize) -> LabelSet {
    let mut labels = vec![Label::new(NAME_LABEL, "process_cpu")];
    labels.extend((1..count).map(|i| Label::new(format!("{i:0>bytes$}"), "v".repeat(bytes))));
    LabelSet::new(labels)
}

/// A WAL record that out-allocates the store crash-loops it on replay:
/// 46 labels of 2 KiB names and values times 20k distinct
/// promoted labels is 3.7 GiB of label sets; it is refused before the
/// first set beyond the budget is built, by the same check the store runs
/// before logging.
#[test]
fn many_signatures_on_long_labels_are_refused_before_their_sets_are_built() {
    let limits = IngestLimits {
        max_label_name_bytes: 2048,
        max_label_value_bytes: 2048,
        ..IngestLimits::default()
    };
    let profile = distinct_label_profile(20_000);
    let labels = long_labels(46, 2048);
    let mut head = Head::new();
    let check = head.check_ingest(&profile, &labels, 10, &limits);
    assert!(
        matches!(check, Err(IngestError::SeriesLabelsTooLarge { limit, .. }) if limit == 64 << 20),
        "{check:?}"
    );
    let err = head.ingest(&profile, &labels, 1, 10, &limits).unwrap_err();
    assert_eq!(err.reason(), "series_labels_too_large");
    assert!(head.is_empty());
    // The same profile under short labels fits.
    let short = long_labels(3, 8);
    head.check_ingest(&profile, &short, 10, &limits)
        .expect("fits the budget");
    let stats = head
        .ingest(&profile, &short, 1, 10, &limits)
        .expect("ingest");
    assert_eq!(stats.series_created, 20_000);
}

/// The series limit is the one check that depends on the head, so a
/// logged record is applied without it (see `for_logged_records`).
#[test]
fn logged_records_are_applied_past_the_series_limit_but_checked_ones_are_not() {
    let limits = IngestLimits {
        max_series_per_profile_name: 5,
        ..IngestLimits::default()
    };
    let profile = distinct_label_profile(8);
    let labels = long_labels(1, 1);
    let mut head = Head::new();
    let err = head
        .check_ingest(&profile, &labels, 10, &limits)
        .unwrap_err();
    assert!(
        matches!(
            err,
            IngestError::TooManySeries {
                count: 6,
                limit: 5,
                ..
            }
        ),
        "{err}"
    );
    let stats = head
        .ingest(&profile, &labels, 1, 10, &limits.for_logged_records())
        .expect("a logged record is applied");
    assert_eq!(stats.series_created, 8);
}

fn labels_in(namespace: &str, pod: &str) -> LabelSet {
    LabelSet::new(vec![
        Label::new(NAME_LABEL, "process_cpu"),
        Label::new(NAMESPACE_LABEL, namespace),
        Label::new("pod", pod),
    ])
}

/// Series cardinality is per tenant: a tenant at its limit cannot add
/// series, keeps ingesting into those it has, and leaves other tenants'
/// room alone.
#[test]
fn a_namespace_at_its_series_limit_gets_no_new_series_but_keeps_its_own() {
    let limits = IngestLimits {
        max_series_per_namespace: 3,
        ..IngestLimits::default()
    };
    let profile = distinct_label_profile(1);
    let mut head = Head::new();
    for pod in ["a", "b", "c"] {
        head.ingest(&profile, &labels_in("churn", pod), 1, 10, &limits)
            .expect("within the namespace's limit");
    }
    let err = head
        .check_ingest(&profile, &labels_in("churn", "d"), 10, &limits)
        .unwrap_err();
    assert!(
        matches!(
            &err,
            IngestError::TooManySeriesInNamespace { namespace, count: 4, limit: 3 }
                if namespace == "churn"
        ),
        "{err}"
    );
    assert_eq!(err.reason(), "too_many_series_in_namespace");
    let stats = head
        .ingest(&profile, &labels_in("churn", "a"), 2, 10, &limits)
        .expect("an existing series still ingests");
    assert_eq!(stats.series_created, 0);
    head.ingest(&profile, &labels_in("quiet", "a"), 2, 10, &limits)
        .expect("another namespace still creates series");
    // Series without the label share the namespace "".
    let mut bare = LabelSet::new(vec![Label::new(NAME_LABEL, "process_cpu")]);
    for pod in ["a", "b", "c"] {
        bare.insert(Label::new("pod", pod));
        head.ingest(&profile, &bare, 3, 10, &limits)
            .expect("within the limit of the unnamed namespace");
    }
    bare.insert(Label::new("pod", "d"));
    let err = head.check_ingest(&profile, &bare, 10, &limits).unwrap_err();
    assert!(
        matches!(&err, IngestError::TooManySeriesInNamespace { namespace, .. } if namespace.is_empty()),
        "{err}"
    );
    head.ingest(
        &profile,
        &labels_in("churn", "d"),
        3,
        10,
        &limits.for_logged_records(),
    )
    .expect("a logged record is applied past the namespace limit");
}

/// A profile whose samples promote a `namespace` label counts each new
/// series in its own namespace, and the store-wide limit caps them all.
#[test]
fn the_store_wide_series_limit_counts_every_namespace_and_only_new_series() {
    let limits = IngestLimits {
        max_series_per_namespace: 1,
        max_series: 4,
        ..IngestLimits::default()
    };
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    let f = b.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let loc = b.location(0, 0x1000, &[(f, 1)]);
    for ns in ["n1", "n2", "n3"] {
        b.sample(
            &[loc],
            &[1],
            &[(NAMESPACE_LABEL, LabelValue::Str(ns.into()))],
        );
    }
    let spread = kiln_pprof::decode(
        &kiln_pprof::encode_gzip(&b.finish()),
        &DecodeLimits::default(),
    )
    .expect("decodes");
    let name_only = LabelSet::new(vec![Label::new(NAME_LABEL, "process_cpu")]);
    let mut head = Head::new();
    let stats = head
        .ingest(&spread, &name_only, 1, 10, &limits)
        .expect("one new series in each of three namespaces");
    assert_eq!(stats.series_created, 3);
    let one = distinct_label_profile(1);
    head.ingest(&one, &labels_in("n4", "a"), 1, 10, &limits)
        .expect("the fourth series fits");
    let err = head
        .check_ingest(&one, &labels_in("n5", "a"), 10, &limits)
        .unwrap_err();
    assert!(
        matches!(
            err,
            IngestError::TooManySeriesInStore { count: 5, limit: 4 }
        ),
        "{err}"
    );
    assert_eq!(err.reason(), "too_many_series_in_store");
    let stats = head
        .ingest(&spread, &name_only, 2, 10, &limits)
        .expect("existing series still ingest at the store-wide limit");
    assert_eq!(stats.series_created, 0);
}

/// The store checks a profile before logging it and applies the checked
/// result afterwards, while other ingests may have changed the head: the
/// result is what `ingest` stores.
#[test]
fn a_checked_profile_applied_after_the_head_changed_stores_what_ingest_stores() {
    let profile = distinct_label_profile(5);
    let labels = long_labels(2, 4);
    let other = distinct_label_profile(3);
    let limits = IngestLimits::default();
    let mut head = Head::new();
    let checked = head
        .check(profile.clone(), &labels, 10, &limits)
        .expect("passes");
    head.ingest(&other, &labels_in("ns", "x"), 1, 10, &limits)
        .expect("another ingest");
    let stats = head.apply_checked(checked, 2);
    let mut direct = Head::new();
    direct
        .ingest(&other, &labels_in("ns", "x"), 1, 10, &limits)
        .expect("another ingest");
    let expected = direct
        .ingest(&profile, &labels, 2, 10, &limits)
        .expect("ingest");
    assert_eq!(stats, expected);
    assert_eq!(stats.series_created, 5);
    assert_eq!(head.series_count(), direct.series_count());
    assert_eq!(head.approx_bytes(), direct.approx_bytes());
}

/// One sample per value of `node`, each with the string sample labels
/// `node=<value>` and `language=native`.
fn node_labelled_profile(nodes: &[&str]) -> Profile {
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    let f = b.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let loc = b.location(0, 0x1000, &[(f, 1)]);
    for node in nodes {
        b.sample(
            &[loc],
            &[1],
            &[
                ("node", LabelValue::Str((*node).into())),
                ("language", LabelValue::Str("native".into())),
            ],
        );
    }
    kiln_pprof::decode(
        &kiln_pprof::encode_gzip(&b.finish()),
        &DecodeLimits::default(),
    )
    .expect("decodes")
}

fn node_series_labels() -> LabelSet {
    LabelSet::new(vec![
        Label::new(NAME_LABEL, "process_cpu"),
        Label::new("language", "native"),
        Label::new("node", "node-a"),
    ])
}

const ALL: TimeRange = TimeRange {
    start_ms: 0,
    end_ms: i64::MAX,
};

/// The agent repeats its series labels `node` and `language` on every
/// sample: a sample label equal to the series label of its name adds no
/// `exported_` copy and no series.
#[test]
fn a_sample_label_equal_to_its_series_label_is_not_exported() {
    let mut head = Head::new();
    let stats = head
        .ingest(
            &node_labelled_profile(&["node-a"]),
            &node_series_labels(),
            1,
            10,
            &IngestLimits::default(),
        )
        .expect("ingest");
    assert_eq!(stats.series_created, 1);
    let names = head.label_names(&[], ALL).expect("names");
    assert_eq!(
        names,
        ["__name__", "__profile_type__", "language", "node"],
        "{names:?}"
    );
}

/// A sample label whose value differs from the series label of its name
/// still keeps that value, as `exported_<name>`, on its own series.
#[test]
fn a_sample_label_conflicting_with_its_series_label_is_exported() {
    let mut head = Head::new();
    let stats = head
        .ingest(
            &node_labelled_profile(&["node-a", "node-b"]),
            &node_series_labels(),
            1,
            10,
            &IngestLimits::default(),
        )
        .expect("ingest");
    assert_eq!(stats.series_created, 2);
    assert_eq!(
        head.label_values("exported_node", &[], ALL)
            .expect("values"),
        ["node-b"]
    );
    assert_eq!(
        head.label_values("node", &[], ALL).expect("values"),
        ["node-a"]
    );
    let names = head.label_names(&[], ALL).expect("names");
    assert!(!names.iter().any(|n| n == "exported_language"), "{names:?}");
}

/// The series label bytes a check plans for `profile` under `labels`,
/// read from the refusal of a zero budget.
fn planned_label_bytes(profile: &Profile, labels: &LabelSet) -> usize {
    let limits = IngestLimits {
        max_series_label_bytes_per_profile: 0,
        ..IngestLimits::default()
    };
    match Head::new().check_ingest(profile, labels, 10, &limits) {
        Err(IngestError::SeriesLabelsTooLarge { bytes, .. }) => bytes,
        other => panic!("expected SeriesLabelsTooLarge, got {other:?}"),
    }
}

/// The series label byte budget counts what is built: a redundant sample
/// label costs nothing, an exported one its name with the prefix, in the
/// set and in its one typed copy.
#[test]
fn the_series_label_budget_counts_only_the_labels_built() {
    let labels = node_series_labels();
    let mut b = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    let f = b.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let loc = b.location(0, 0x1000, &[(f, 1)]);
    b.sample(&[loc], &[1], &[]);
    let bare = kiln_pprof::decode(
        &kiln_pprof::encode_gzip(&b.finish()),
        &DecodeLimits::default(),
    )
    .expect("decodes");
    let bare_bytes = planned_label_bytes(&bare, &labels);
    assert_eq!(
        planned_label_bytes(&node_labelled_profile(&["node-a"]), &labels),
        bare_bytes
    );
    assert_eq!(
        planned_label_bytes(&node_labelled_profile(&["node-b"]), &labels),
        bare_bytes + 2 * label_bytes("exported_node", "node-b")
    );
}

/// The profile type's strings come from the client like any label: a
/// sample type of 4 KiB is refused, not stored as a series label that every
/// later listing of its range carries.
#[test]
fn a_profile_type_longer_than_a_label_value_is_refused() {
    let long_type = "t".repeat(4096);
    let mut b = ProfileBuilder::new(&[(long_type.as_str(), "nanoseconds")]);
    let f = b.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let loc = b.location(0, 0x1000, &[(f, 1)]);
    b.sample(&[loc], &[1], &[]);
    let profile = kiln_pprof::decode(
        &kiln_pprof::encode_gzip(&b.finish()),
        &DecodeLimits::default(),
    )
    .expect("decodes");
    let labels = long_labels(1, 1);
    let limits = IngestLimits::default();
    let mut head = Head::new();
    let check = head.check_ingest(&profile, &labels, 10, &limits);
    assert!(
        matches!(&check, Err(IngestError::LabelValueTooLong { name, limit, .. })
            if name == "__profile_type__" && *limit == limits.max_label_value_bytes),
        "{check:?}"
    );
    assert!(head.ingest(&profile, &labels, 1, 10, &limits).is_err());
    assert!(head.is_empty());
}
