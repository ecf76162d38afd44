use super::*;
use crate::wire::time::DEFAULT_RANGE_MS;

#[test]
fn max_nodes_follows_pyroscope() {
    assert_eq!(max_nodes(None), DEFAULT_MAX_NODES);
    assert_eq!(max_nodes(Some(0)), DEFAULT_MAX_NODES);
    assert_eq!(max_nodes(Some(-1)), MAX_MAX_NODES);
    assert_eq!(max_nodes(Some(100)), 100);
    assert_eq!(max_nodes(Some(i64::MAX)), MAX_MAX_NODES);
}

#[test]
fn ranges_default_and_include_the_end() {
    let range = range_ms(1_000, 2_000).unwrap();
    assert_eq!((range.start_ms, range.end_ms), (1_000, 2_001));
    let range = range_ms(0, 10_000_000).unwrap();
    assert_eq!(range.start_ms, 10_000_000 - DEFAULT_RANGE_MS);
    assert!(range_ms(5, 5).is_err());
}

#[test]
fn steps_come_from_seconds_or_the_range() {
    let range = TimeRange {
        start_ms: 0,
        end_ms: 3_600_000,
    };
    assert_eq!(step_ms(15.0, range).unwrap(), 15_000);
    assert_eq!(step_ms(0.0, range).unwrap(), 36_000);
    assert!(step_ms(f64::NAN, range).is_err());
}

#[test]
fn dotted_names_are_listed_only_to_clients_that_can_quote_them() {
    use LabelNameScheme::{Legacy, Utf8};
    for (accept, scheme) in [
        ("application/json; allow-utf8-labelnames=true", Utf8),
        ("*/*;allow-utf8-labelnames=true", Utf8),
        (
            "application/json, */*; Allow-UTF8-LabelNames=\"true\"",
            Utf8,
        ),
        ("application/json", Legacy),
        ("application/json; allow-utf8-labelnames=false", Legacy),
        ("", Legacy),
    ] {
        assert_eq!(LabelNameScheme::from_accept(accept), scheme, "{accept:?}");
    }
    assert!(Legacy.shows("service_name") && Legacy.shows("__name__"));
    assert!(!Legacy.shows("k8s.pod.name") && !Legacy.shows("9lives"));
    assert!(Utf8.shows("k8s.pod.name"));
}
