use super::*;

fn text(key: &str, value: &str) -> Attribute {
    Attribute {
        key: key.into(),
        value: AttributeValue::Text(value.into()),
    }
}

#[test]
fn resource_attributes_become_kubernetes_labels() {
    let labels = series_labels(
        &[
            text("service.name", "checkout"),
            text("k8s.namespace.name", "shop"),
            text("k8s.pod.name", "checkout-0"),
            text("container.name", "app"),
            text("host.name", "node-1"),
            text("process.runtime.name", "go"),
            text("weird-key/x", "v"),
        ],
        &[],
        "process_cpu",
    );
    let get = |n: &str| labels.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    assert_eq!(get("service_name"), Some("checkout"));
    assert_eq!(get("namespace"), Some("shop"));
    assert_eq!(get("pod"), Some("checkout-0"));
    assert_eq!(get("container"), Some("app"));
    assert_eq!(get("node"), Some("node-1"));
    assert_eq!(get("process.runtime.name"), Some("go"));
    assert_eq!(get("weird_key_x"), Some("v"));
    assert_eq!(get("__name__"), Some("process_cpu"));
    // The well-known ones keep their own names too.
    assert_eq!(get("service.name"), Some("checkout"));
    assert_eq!(get("k8s.namespace.name"), Some("shop"));
    assert_eq!(get("k8s.pod.name"), Some("checkout-0"));
    assert_eq!(get("container.name"), Some("app"));
    assert_eq!(get("host.name"), Some("node-1"));
}

#[test]
fn a_resource_without_service_name_is_unknown_service() {
    let labels = series_labels(&[], &[], "wall");
    assert!(labels.contains(&("service_name".into(), "unknown_service".into())));
}

#[test]
fn timestamps_alone_count_events_and_mismatches_are_refused() {
    assert_eq!(sample_values(&[], 3, 1, (0, 0)).unwrap(), vec![3]);
    assert_eq!(sample_values(&[2, 5], 2, 1, (0, 0)).unwrap(), vec![7]);
    assert_eq!(sample_values(&[1, 2], 0, 2, (0, 0)).unwrap(), vec![1, 2]);
    for (values, timestamps, types) in [(&[][..], 0, 1), (&[1, 2][..], 3, 1), (&[1][..], 0, 2)] {
        let err = sample_values(values, timestamps, types, (1, 2)).unwrap_err();
        assert_eq!(err.reason(), "otlp_bad_sample", "{err}");
    }
}

#[test]
fn label_names_are_made_valid() {
    assert_eq!(label_name_for_attribute("9lives"), "_9lives");
    assert_eq!(label_name_for_attribute(""), "_");
    assert_eq!(label_name_for_attribute("a.b_c"), "a.b_c");
}
