use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn pod(namespace: &str, name: &str, uid: &str, annotations: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid: Some(uid.to_owned()),
        annotations: Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..ObjectMeta::default()
    }
}

#[test]
fn annotated_pod_becomes_an_entry_selecting_its_uid_with_its_kiln_annotations() {
    let pods = [pod(
        "shop",
        "cart-1",
        "uid-1",
        &[
            ("profiles.kiln.dev/enabled", "true"),
            ("profiles.kiln.dev/sampling-hz", "97"),
            ("profiles.kiln.dev/service-name", "cart"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ],
    )];
    let relays = relay_targets(&pods);
    assert_eq!(relays.len(), 1);
    let relay = &relays[0];
    assert_eq!(relay.source, "shop/pods/cart-1");
    assert_eq!(relay.namespace, "shop");
    assert_eq!(
        relay.selector.match_labels,
        BTreeMap::from([("io.kubernetes.pod.uid".to_owned(), "uid-1".to_owned())])
    );
    assert!(!relay.require_annotation);
    assert_eq!(
        relay.pod_annotations.keys().collect::<Vec<_>>(),
        vec![
            "profiles.kiln.dev/enabled",
            "profiles.kiln.dev/sampling-hz",
            "profiles.kiln.dev/service-name"
        ]
    );
}

#[test]
fn unannotated_opted_out_deleting_and_uidless_pods_are_not_relayed() {
    let mut deleting = pod("a", "d", "uid-d", &[("profiles.kiln.dev/enabled", "true")]);
    deleting.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let pods = [
        pod("a", "plain", "uid-p", &[]),
        pod(
            "a",
            "off",
            "uid-o",
            &[("profiles.kiln.dev/enabled", "false")],
        ),
        pod(
            "a",
            "typo",
            "uid-t",
            &[("profiles.kiln.dev/enabled", "yes")],
        ),
        pod("a", "nouid", "", &[("profiles.kiln.dev/enabled", "true")]),
        deleting,
    ];
    assert_eq!(relay_targets(&pods), Vec::<Target>::new());
}

#[test]
fn entries_are_sorted_so_any_listing_order_gives_identical_bytes() {
    let on = [("profiles.kiln.dev/enabled", " True ")];
    let a = pod("b", "x", "uid-1", &on);
    let b = pod("a", "y", "uid-2", &on);
    let c = pod("a", "x", "uid-3", &on);
    let one = with_relays(
        &TargetsFile::new([]),
        &relay_targets(&[a.clone(), b.clone(), c.clone()]),
    );
    let two = with_relays(&TargetsFile::new([]), &relay_targets(&[c, a, b]));
    assert_eq!(one.to_json().unwrap(), two.to_json().unwrap());
    let sources: Vec<&str> = one.targets.iter().map(|t| t.source.as_str()).collect();
    assert_eq!(sources, vec!["a/pods/x", "a/pods/y", "b/pods/x"]);
}

fn annotated(namespace: &str, count: usize) -> Vec<ObjectMeta> {
    (0..count)
        .map(|i| {
            pod(
                namespace,
                &format!("p{i:05}"),
                &format!("uid-{namespace}-{i}"),
                &[("profiles.kiln.dev/enabled", "true")],
            )
        })
        .collect()
}

#[test]
fn relays_are_capped_in_all_and_per_namespace() {
    let pods: Vec<ObjectMeta> = (0..6)
        .flat_map(|n| annotated(&format!("ns{n}"), MAX_RELAYED_PODS_PER_NAMESPACE + 5))
        .collect();
    let relays = relay_targets(&pods);
    assert_eq!(relays.len(), MAX_RELAYED_PODS);
    assert_eq!(relays[0].source, "ns0/pods/p00000");
    for n in 0..4 {
        let from = relays
            .iter()
            .filter(|r| r.namespace == format!("ns{n}"))
            .count();
        assert!(from <= MAX_RELAYED_PODS_PER_NAMESPACE, "ns{n}: {from}");
    }
}

#[test]
fn three_thousand_pods_in_one_namespace_leave_room_for_ten_in_another() {
    let mut pods = annotated("aaa-busy", 3000);
    pods.extend(annotated("zzz-small", 10));
    let relays = relay_targets(&pods);
    let small = relays.iter().filter(|r| r.namespace == "zzz-small").count();
    let busy = relays.iter().filter(|r| r.namespace == "aaa-busy").count();
    assert_eq!((small, busy), (10, MAX_RELAYED_PODS_PER_NAMESPACE));
    let file = with_relays(&TargetsFile::new([]), &relays);
    assert!(file.to_json().expect("serializes").len() < kiln_targets::MAX_FILE_BYTES);
}

#[test]
fn the_file_is_cut_to_its_cap_from_the_busiest_namespace_and_says_how_much() {
    let note = "n".repeat(900);
    let mut pods: Vec<ObjectMeta> = (0..1500)
        .map(|i| {
            pod(
                &format!("busy{}", i % 4),
                &format!("p{i:05}"),
                &format!("uid-busy-{i}"),
                &[
                    ("profiles.kiln.dev/enabled", "true"),
                    ("profiles.kiln.dev/service-name", &note),
                ],
            )
        })
        .collect();
    pods.extend(annotated("small", 5));
    let relays = relay_targets(&pods);
    let uncut = with_relays(&TargetsFile::new([]), &relays);
    assert!(
        uncut.to_json().expect("json").len() > MAX_TARGETS_FILE_BYTES,
        "the test is over the cap"
    );
    let fitted = fit_targets(&TargetsFile::new([]), &relays);
    let size = fitted.file.to_json().expect("json").len();
    assert!(size <= MAX_TARGETS_FILE_BYTES, "{size} bytes");
    assert!(fitted.relays_left_out > 0);
    assert_eq!(fitted.targets_left_out, 0);
    assert_eq!(
        fitted.file.targets.len() + fitted.relays_left_out,
        relays.len()
    );
    let small = fitted
        .file
        .targets
        .iter()
        .filter(|t| t.namespace == "small")
        .count();
    assert_eq!(small, 5, "the small namespace keeps every pod");
    // Under the cap nothing is cut.
    let few = relay_targets(&annotated("shop", 10));
    let fitted = fit_targets(&TargetsFile::new([]), &few);
    assert_eq!((fitted.file.targets.len(), fitted.relays_left_out), (10, 0));
}

#[test]
fn pods_left_out_are_counted_per_namespace() {
    let huge = "x".repeat(MAX_RELAYED_ANNOTATION_BYTES);
    let mut pods = annotated("busy", MAX_RELAYED_PODS_PER_NAMESPACE + 7);
    pods.extend(annotated("small", 2));
    pods.push(pod(
        "small",
        "greedy",
        "uid-greedy",
        &[
            ("profiles.kiln.dev/enabled", "true"),
            ("profiles.kiln.dev/service-name", &huge),
        ],
    ));
    pods.push(pod("quiet", "plain", "uid-plain", &[]));
    let relays = relays(&pods);
    assert_eq!(relays.targets, relay_targets(&pods));
    assert_eq!(
        relays.left_out,
        BTreeMap::from([("busy".to_owned(), 7), ("small".to_owned(), 1)])
    );
}

#[test]
fn a_pod_with_a_huge_annotation_is_left_out_and_the_others_stay() {
    let huge = "x".repeat(250 * 1024);
    let mut pods = annotated("shop", 3);
    pods.push(pod(
        "shop",
        "greedy",
        "uid-greedy",
        &[
            ("profiles.kiln.dev/enabled", "true"),
            ("profiles.kiln.dev/service-name", &huge),
        ],
    ));
    let relays = relay_targets(&pods);
    assert_eq!(relays.len(), 3);
    assert!(relays.iter().all(|r| r.source != "shop/pods/greedy"));
}
