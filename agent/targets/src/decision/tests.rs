use std::collections::HashMap;

use super::*;
use crate::file::Target;
use crate::selector::LabelSelector;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn target(source: &str, namespace: &str, require_annotation: bool, hz: u32) -> Target {
    Target {
        source: source.to_owned(),
        namespace: namespace.to_owned(),
        selector: LabelSelector::default(),
        require_annotation,
        containers: Vec::new(),
        sampling_hz: hz,
        labels: BTreeMap::new(),
        pod_annotations: BTreeMap::new(),
        pprof_scrape: None,
    }
}

fn decide(
    file: &TargetsFile,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    container: &str,
) -> Decision {
    file.decide(&PodView {
        namespace,
        labels,
        annotations,
        container,
    })
}

fn plan(decision: Decision) -> ProfilingPlan {
    match decision {
        Decision::Profile(plan) => plan,
        Decision::Skip(reason) => panic!("expected a plan, got skip {reason:?}"),
    }
}

#[test]
fn a_pod_is_scraped_as_the_first_matching_target_by_source_asks() {
    use crate::scrape::{PprofProfile, PprofScrape};
    let scrape = |port| PprofScrape {
        port: crate::PprofPort::Number(port),
        path_prefix: "/debug/pprof".to_owned(),
        profiles: vec![PprofProfile::Heap],
        interval_seconds: 15,
        timeout_seconds: 5,
    };
    let mut b = target("shop/b", "shop", false, 19);
    b.pprof_scrape = Some(scrape(7000));
    let mut a = target("shop/a", "shop", false, 19);
    a.pprof_scrape = Some(scrape(6060));
    let plain = target("shop/0", "shop", false, 19);
    let none = map(&[]);
    for file in [
        TargetsFile::new([b.clone(), a.clone(), plain.clone()]),
        TargetsFile::new([plain.clone(), a.clone(), b.clone()]),
    ] {
        let chosen = plan(decide(&file, "shop", &none, &none, "app")).pprof_scrape;
        assert_eq!(chosen.map(|s| s.port), Some(crate::PprofPort::Number(6060)));
    }
    let unscraped = TargetsFile::new([plain]);
    assert_eq!(
        plan(decide(&unscraped, "shop", &none, &none, "app")).pprof_scrape,
        None
    );
}

#[test]
fn unannotated_pod_without_targets_is_skipped() {
    let file = TargetsFile::new([]);
    let decision = decide(&file, "default", &map(&[]), &map(&[]), "app");
    assert_eq!(decision, Decision::Skip(SkipReason::NotSelected));
}

#[test]
fn annotated_pod_without_targets_uses_agent_default_rate() {
    let file = TargetsFile::new([]);
    let annotations = map(&[(ANNOTATION_ENABLED, "true")]);
    let plan = plan(decide(&file, "default", &map(&[]), &annotations, "app"));
    assert_eq!(plan.sampling_hz, None);
    assert!(plan.matched_targets.is_empty());
}

#[test]
fn target_requiring_annotation_ignores_unannotated_pods() {
    let file = TargetsFile::new([target("shop/t", "shop", true, 49)]);
    let decision = decide(&file, "shop", &map(&[]), &map(&[]), "app");
    assert_eq!(decision, Decision::Skip(SkipReason::NotSelected));
    let annotations = map(&[(ANNOTATION_ENABLED, "true")]);
    let plan = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
    assert_eq!(plan.sampling_hz, Some(49));
    assert_eq!(plan.matched_targets, vec!["shop/t"]);
}

#[test]
fn target_without_annotation_requirement_selects_by_labels_only() {
    let mut t = target("shop/t", "shop", false, 19);
    t.selector.match_labels = map(&[("app", "checkout")]);
    t.labels = map(&[("team", "payments")]);
    let file = TargetsFile::new([t]);
    let plan = plan(decide(
        &file,
        "shop",
        &map(&[("app", "checkout")]),
        &map(&[]),
        "server",
    ));
    assert_eq!(plan.labels, map(&[("team", "payments")]));
    let other = decide(&file, "shop", &map(&[("app", "cart")]), &map(&[]), "server");
    assert_eq!(other, Decision::Skip(SkipReason::NotSelected));
}

#[test]
fn target_only_selects_its_own_namespace() {
    let file = TargetsFile::new([target("shop/t", "shop", false, 19)]);
    let decision = decide(&file, "default", &map(&[]), &map(&[]), "app");
    assert_eq!(decision, Decision::Skip(SkipReason::NotSelected));
}

#[test]
fn container_list_restricts_containers() {
    let mut t = target("shop/t", "shop", false, 19);
    t.containers = vec!["server".into()];
    let file = TargetsFile::new([t]);
    assert!(matches!(
        decide(&file, "shop", &map(&[]), &map(&[]), "server"),
        Decision::Profile(_)
    ));
    assert_eq!(
        decide(&file, "shop", &map(&[]), &map(&[]), "istio-proxy"),
        Decision::Skip(SkipReason::NotSelected)
    );
}

#[test]
fn explicit_opt_out_beats_every_target() {
    let file = TargetsFile::new([target("shop/t", "shop", false, 19)]);
    let annotations = map(&[(ANNOTATION_ENABLED, "False")]);
    assert_eq!(
        decide(&file, "shop", &map(&[]), &annotations, "app"),
        Decision::Skip(SkipReason::OptedOut)
    );
}

#[test]
fn highest_target_rate_wins_and_annotation_overrides_it() {
    let file = TargetsFile::new([
        target("shop/slow", "shop", false, 19),
        target("shop/fast", "shop", false, 99),
    ]);
    let plan_by_targets = plan(decide(&file, "shop", &map(&[]), &map(&[]), "app"));
    assert_eq!(plan_by_targets.sampling_hz, Some(99));
    assert_eq!(
        plan_by_targets.matched_targets,
        vec!["shop/fast", "shop/slow"]
    );
    let annotations = map(&[(ANNOTATION_SAMPLING_HZ, "7")]);
    let overridden = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
    assert_eq!(overridden.sampling_hz, Some(7));
}

#[test]
fn first_target_in_order_wins_label_conflicts() {
    let mut a = target("shop/a", "shop", false, 19);
    a.labels = map(&[("team", "alpha")]);
    let mut b = target("shop/b", "shop", false, 19);
    b.labels = map(&[("team", "beta"), ("tier", "web")]);
    let plan = plan(decide(
        &TargetsFile::new([b, a]),
        "shop",
        &map(&[]),
        &map(&[]),
        "app",
    ));
    assert_eq!(plan.labels, map(&[("team", "alpha"), ("tier", "web")]));
}

#[test]
fn bad_annotation_values_are_reported_not_fatal() {
    let file = TargetsFile::new([target("shop/t", "shop", false, 19)]);
    let annotations = map(&[
        (ANNOTATION_ENABLED, "yes please"),
        (ANNOTATION_SAMPLING_HZ, "100000"),
    ]);
    let plan = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
    assert_eq!(plan.sampling_hz, Some(19));
    let keys: Vec<_> = plan.ignored_annotations.iter().map(|i| i.key).collect();
    assert_eq!(keys, vec![ANNOTATION_ENABLED, ANNOTATION_SAMPLING_HZ]);
}

#[test]
fn service_name_annotation_becomes_a_label() {
    let file = TargetsFile::new([]);
    let annotations = map(&[
        (ANNOTATION_ENABLED, "true"),
        (ANNOTATION_SERVICE_NAME, "checkout"),
    ]);
    let plan = plan(decide(&file, "shop", &map(&[]), &annotations, "app"));
    assert_eq!(plan.labels, map(&[("service_name", "checkout")]));
}

#[test]
fn hash_maps_work_as_label_sources() {
    let labels: HashMap<String, String> =
        [("app".to_owned(), "x".to_owned())].into_iter().collect();
    let annotations: HashMap<String, String> = HashMap::new();
    let mut t = target("a/t", "a", false, 19);
    t.selector.match_labels = map(&[("app", "x")]);
    let decision = TargetsFile::new([t]).decide(&PodView {
        namespace: "a",
        labels: &labels,
        annotations: &annotations,
        container: "c",
    });
    assert!(matches!(decision, Decision::Profile(_)));
}

fn relay(uid: &str, annotations: &[(&str, &str)]) -> Target {
    let mut relay = target(&format!("shop/pods/{uid}"), "shop", false, 19);
    relay
        .selector
        .match_labels
        .insert("io.kubernetes.pod.uid".into(), uid.into());
    relay.pod_annotations = map(annotations);
    relay
}

#[test]
fn relayed_annotations_opt_in_exactly_the_selected_pod_with_its_rate_and_service() {
    let file = TargetsFile::new([relay(
        "uid-1",
        &[
            (ANNOTATION_ENABLED, "true"),
            (ANNOTATION_SAMPLING_HZ, "97"),
            (ANNOTATION_SERVICE_NAME, "cart"),
        ],
    )]);
    let selected = map(&[("io.kubernetes.pod.uid", "uid-1")]);
    let p = plan(decide(&file, "shop", &selected, &map(&[]), "app"));
    assert_eq!(p.sampling_hz, Some(97));
    assert_eq!(
        p.labels.get("service_name").map(String::as_str),
        Some("cart")
    );
    assert!(p.matched_targets.is_empty(), "a relay is not a target");
    let other = map(&[("io.kubernetes.pod.uid", "uid-2")]);
    assert_eq!(
        decide(&file, "shop", &other, &map(&[]), "app"),
        Decision::Skip(SkipReason::NotSelected)
    );
    assert_eq!(
        decide(&file, "default", &selected, &map(&[]), "app"),
        Decision::Skip(SkipReason::NotSelected)
    );
}

#[test]
fn relayed_annotations_win_over_stale_sandbox_annotations() {
    let file = TargetsFile::new([relay("uid-1", &[(ANNOTATION_ENABLED, "true")])]);
    let selected = map(&[("io.kubernetes.pod.uid", "uid-1")]);
    let stale = map(&[(ANNOTATION_ENABLED, "false")]);
    assert!(matches!(
        decide(&file, "shop", &selected, &stale, "app"),
        Decision::Profile(_)
    ));
}

#[test]
fn relay_entry_rate_does_not_compete_with_real_targets() {
    let mut high = relay("uid-1", &[(ANNOTATION_ENABLED, "true")]);
    high.sampling_hz = 1000;
    let file = TargetsFile::new([high, target("shop/all", "shop", true, 49)]);
    let selected = map(&[("io.kubernetes.pod.uid", "uid-1")]);
    let p = plan(decide(&file, "shop", &selected, &map(&[]), "app"));
    assert_eq!(p.sampling_hz, Some(49));
    assert_eq!(p.matched_targets, vec!["shop/all".to_owned()]);
}
