use super::*;

fn cpu() -> ProfileType {
    ProfileType {
        name: "process_cpu".into(),
        sample_type: "cpu".into(),
        sample_unit: "nanoseconds".into(),
        period_type: "cpu".into(),
        period_unit: "nanoseconds".into(),
        delta: true,
    }
}

fn memory(sample_type: &str, unit: &str) -> ProfileType {
    ProfileType {
        name: "memory".into(),
        sample_type: sample_type.into(),
        sample_unit: unit.into(),
        period_type: "space".into(),
        period_unit: "bytes".into(),
        delta: false,
    }
}

#[test]
fn full_selector_with_every_operator_parses() {
    let parsed = parse_selector(
        r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{pod="x", ns!="kube-system",service.name=~"check.*" , env!~'dev|test',}"#,
    )
    .unwrap();
    let selector = parsed.resolve(&[]).unwrap();
    assert_eq!(selector.profile_type, cpu());
    let ops: Vec<(&str, MatchOp, &str)> = selector
        .matchers
        .iter()
        .map(|m| (m.name.as_str(), m.op, m.value.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("pod", MatchOp::Equal, "x"),
            ("ns", MatchOp::NotEqual, "kube-system"),
            ("service.name", MatchOp::Regex, "check.*"),
            ("env", MatchOp::NotRegex, "dev|test"),
        ]
    );
}

#[test]
fn quoted_label_names_hold_any_character() {
    let parsed =
        parse_selector(r#"process_cpu{"k8s.pod.name"="checkout-1", 'a b'!="c", pod="p"}"#).unwrap();
    let names: Vec<&str> = parsed.matchers.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["k8s.pod.name", "a b", "pod"]);
    let err = parse_selector(r#"process_cpu{""="x"}"#).unwrap_err();
    assert!(err.to_string().contains("not an empty one"), "{err}");
    assert!(parse_selector(r#"process_cpu{"open="x"}"#).is_err());
}

#[test]
fn abbreviated_type_resolves_when_unambiguous() {
    let known = [
        cpu(),
        memory("alloc_space", "bytes"),
        memory("inuse_space", "bytes"),
    ];
    let selector = parse_selector(r#"process_cpu{pod="x"}"#)
        .unwrap()
        .resolve(&known)
        .unwrap();
    assert_eq!(selector.profile_type, cpu());
    let selector = parse_selector("memory:inuse_space")
        .unwrap()
        .resolve(&known)
        .unwrap();
    assert_eq!(selector.profile_type, memory("inuse_space", "bytes"));
}

#[test]
fn ambiguous_and_unknown_types_list_the_choices() {
    let known = [
        cpu(),
        memory("alloc_space", "bytes"),
        memory("inuse_space", "bytes"),
    ];
    let err = parse_selector("memory")
        .unwrap()
        .resolve(&known)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("memory:alloc_space:bytes:space:bytes, memory:inuse_space"),
        "{err}"
    );
    let err = parse_selector("wall{}")
        .unwrap()
        .resolve(&known)
        .unwrap_err();
    assert_eq!(err.reason(), "selector_unknown_profile_type");
    assert!(err.to_string().contains("process_cpu:cpu"), "{err}");
}

#[test]
fn syntax_errors_name_the_position() {
    let err = parse_selector(r#"process_cpu{pod>"x"}"#).unwrap_err();
    assert_eq!(
        err.to_string(),
        "selector position 16: expected `=`, `!=`, `=~` or `!~`, found '>'"
    );
    let err = parse_selector(r#"process_cpu{pod="x""#).unwrap_err();
    assert_eq!(
        err,
        SelectorError::Syntax {
            position: 20,
            expected: "`,` or `}`",
            found: "the end of the selector".into()
        }
    );
    let err = parse_selector(r#"cpu{pod="x}"#).unwrap_err();
    assert!(
        matches!(err, SelectorError::Syntax { position: 9, .. }),
        "{err}"
    );
    let err = parse_selector(r#"{pod="x"}"#)
        .unwrap()
        .resolve(&[])
        .unwrap_err();
    assert!(
        matches!(err, SelectorError::Syntax { position: 1, .. }),
        "{err}"
    );
    let err = parse_selector(r#"{pod="x"} extra"#).unwrap_err();
    assert!(
        matches!(err, SelectorError::Syntax { position: 11, .. }),
        "{err}"
    );
    let err = parse_selector(r#"cpu{pod=x}"#).unwrap_err();
    assert!(
        matches!(err, SelectorError::Syntax { position: 9, .. }),
        "{err}"
    );
    let err = parse_selector(r#"cpu{pod="x"} extra"#).unwrap_err();
    assert!(
        matches!(err, SelectorError::Syntax { position: 14, .. }),
        "{err}"
    );
    let err = parse_selector("a:b:c:d:e:f").unwrap_err();
    assert!(
        matches!(err, SelectorError::BadProfileType { position: 11, .. }),
        "{err}"
    );
    let err = parse_selector("a:b:c:d:e:delta:g").unwrap_err();
    assert!(matches!(err, SelectorError::BadProfileType { .. }), "{err}");
}

#[test]
fn a_selector_holds_a_bounded_number_of_matchers_and_of_regexes() {
    let matchers = |count: usize, op: &str| {
        let list: Vec<String> = (0..count).map(|i| format!("l{i}{op}\"v\"")).collect();
        format!("cpu{{{}}}", list.join(","))
    };
    assert_eq!(
        parse_selector(&matchers(MAX_MATCHERS, "="))
            .unwrap()
            .matchers
            .len(),
        MAX_MATCHERS
    );
    let err = parse_selector(&matchers(MAX_MATCHERS + 1, "=")).unwrap_err();
    assert_eq!(err.reason(), "selector_too_many_matchers", "{err}");
    parse_selector(&matchers(MAX_REGEX_MATCHERS, "=~")).unwrap();
    let err = parse_selector(&matchers(MAX_REGEX_MATCHERS + 1, "!~")).unwrap_err();
    assert!(
        matches!(
            err,
            SelectorError::TooManyMatchers {
                limit: MAX_REGEX_MATCHERS,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn matchers_alone_parse_for_listings() {
    let parsed = parse_selector(r#" {service_name="app", env=~"prod|staging"}"#).unwrap();
    assert!(parsed.profile_type_parts.is_empty());
    assert_eq!(parsed.matchers.len(), 2);
}

#[test]
fn bad_regex_is_refused_at_its_position() {
    let err = parse_selector(r#"cpu{pod=~"(x"}"#).unwrap_err();
    assert!(
        matches!(err, SelectorError::BadRegex { position: 10, .. }),
        "{err}"
    );
}

/// A pattern costly to compile (nested counted repetitions) and an
/// over-long one are refused when the selector is parsed, before any
/// query work: many of them at once could otherwise take every core.
#[test]
fn heavy_and_long_regexes_are_refused_at_parse_time() {
    let err = parse_selector(r#"cpu{pod=~"(\\w{1,80}){1,80}"}"#).unwrap_err();
    assert!(err.to_string().contains("size limit"), "{err}");
    let long = format!(r#"cpu{{pod=~"{}"}}"#, "a".repeat(2000));
    let err = parse_selector(&long).unwrap_err();
    assert!(err.to_string().contains("over the limit of 1024"), "{err}");
}

#[test]
fn escapes_and_other_quotes_work() {
    let parsed = parse_selector(r#"cpu{a="q\"x\\", b='it''s', c=`raw\d`}"#);
    // `'it''s'` is two strings back to back, which is an error.
    assert!(parsed.is_err());
    let parsed = parse_selector(r#"cpu{a="q\"x\\", b='it\'s', c=`raw\d`}"#).unwrap();
    let values: Vec<&str> = parsed.matchers.iter().map(|m| m.value.as_str()).collect();
    assert_eq!(values, ["q\"x\\", "it's", "raw\\d"]);
}

#[test]
fn non_ascii_positions_count_characters() {
    let err = parse_selector("cpu{é=\"x\"}").unwrap_err();
    assert!(
        matches!(err, SelectorError::Syntax { position: 5, .. }),
        "{err}"
    );
}
