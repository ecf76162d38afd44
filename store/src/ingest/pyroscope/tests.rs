use super::*;

const NOW: i64 = 1_795_310_560_000;

fn params(query: &str) -> IngestParams {
    parse_ingest_params(query, None, NOW).unwrap()
}

#[test]
fn query_parameters_of_the_rust_client_parse() {
    let p = params(
        "name=fixture.rust.app.cpu%7Bendpoint%3D%2Fa%2Cenv%3Dtest%7D&from=1795310910&until=1795310920&format=folded&sampleRate=100&spyName=pyroscope-rs",
    );
    assert_eq!(p.name.app, "fixture.rust.app");
    assert_eq!(p.from_ms, Some(1_795_310_910_000));
    assert_eq!(p.until_ms, Some(1_795_310_920_000));
    assert_eq!(p.format, BodyFormat::Folded);
    assert_eq!(p.spy_name.as_deref(), Some("pyroscope-rs"));
}

#[test]
fn format_defaults_follow_pyroscope() {
    assert_eq!(params("name=a").format, BodyFormat::Folded);
    let p = parse_ingest_params("name=a", Some("multipart/form-data; boundary=x"), NOW).unwrap();
    assert_eq!(p.format, BodyFormat::Multipart);
    assert_eq!(params("name=a&format=lines").format, BodyFormat::Lines);
    assert_eq!(params("name=a&sampleRate=abc").sample_rate, 100);
    assert_eq!(params("name=a&sampleRate=0").sample_rate, 100);
    assert_eq!(params("name=a&from=now-1h").from_ms, Some(NOW - 3_600_000));
}

#[test]
fn bad_parameters_are_named() {
    let cases = [
        ("from=1", "query parameter `name` is required"),
        ("name=a&format=jfr", "format \"jfr\" is not supported"),
        ("name=a&from=soon", "invalid `from`"),
        (
            "name=a&from=20&until=10",
            "`until` (10000 ms) is before `from`",
        ),
        ("name=a&aggregationType=max", "invalid `aggregationType`"),
    ];
    for (query, expected) in cases {
        let err = parse_ingest_params(query, None, NOW).unwrap_err();
        assert!(err.to_string().contains(expected), "{query}: {err}");
    }
}

#[test]
fn folded_cpu_upload_is_scaled_to_nanoseconds_and_labelled() {
    let p = params(
        "name=app.cpu%7Benv%3Dtest%7D&from=1795310910&until=1795310920&sampleRate=100&spyName=rbspy",
    );
    let upload = build_upload(
        &p,
        IngestBody::Raw(b"main;work 3\nmain 1".to_vec()),
        &DecodeLimits::default(),
        &mut |_| Ok(()),
    )
    .unwrap();
    assert_eq!(upload.labels.get(NAME_LABEL), Some("process_cpu"));
    assert_eq!(upload.labels.get(SERVICE_NAME_LABEL), Some("app"));
    assert_eq!(upload.labels.get("env"), Some("test"));
    assert_eq!(upload.labels.get(SPY_LABEL), Some("rbspy"));
    assert_eq!(upload.time_ms, Some(1_795_310_910_000));
    assert_eq!(upload.duration_nanos, Some(10_000_000_000));
    let profile = kiln_pprof::decode(&upload.pprof, &DecodeLimits::default()).unwrap();
    let total: i64 = profile.samples().iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 4 * 10_000_000);
    assert_eq!(profile.string(profile.sample_types()[0].r#type), "cpu");
}

#[test]
fn pprof_upload_without_suffix_is_named_from_its_sample_types() {
    let mut builder = kiln_pprof::ProfileBuilder::new(&[("inuse_space", "bytes")]);
    let f = builder.function(&kiln_pprof::FunctionSpec {
        name: "alloc".into(),
        ..Default::default()
    });
    let loc = builder.location(0, 0, &[(f, 0)]);
    builder.sample(&[loc], &[64], &[]);
    let bytes = kiln_pprof::encode_gzip(&builder.finish());
    let upload = build_upload(
        &params("name=svc%7Bregion%3Deu%7D&format=pprof"),
        IngestBody::Raw(bytes),
        &DecodeLimits::default(),
        &mut |_| Ok(()),
    )
    .unwrap();
    assert_eq!(upload.labels.get(NAME_LABEL), Some("memory"));
    assert_eq!(upload.labels.get("region"), Some("eu"));
    assert_eq!(upload.time_ms, None);
}

#[test]
fn garbage_pprof_and_folded_bodies_are_refused_clearly() {
    let err = build_upload(
        &params("name=a&format=pprof"),
        IngestBody::Raw(b"hello world".to_vec()),
        &DecodeLimits::default(),
        &mut |_| Ok(()),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("body is not a valid pprof profile"),
        "{err}"
    );
    let err = build_upload(
        &params("name=a"),
        IngestBody::Raw(b"a;b 1\nc notanumber".to_vec()),
        &DecodeLimits::default(),
        &mut |_| Ok(()),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "folded body: line 2: count \"notanumber\" is not a non-negative integer"
    );
}

/// Issue 17: a body is decoded (or built) once, by the server, and the
/// store gets that profile with the bytes it logs, which replay decodes
/// to the same profile.
#[test]
fn every_upload_carries_the_profile_its_logged_bytes_decode_to() {
    let heap = |alloc: i64| {
        let mut builder =
            kiln_pprof::ProfileBuilder::new(&[("alloc_space", "bytes"), ("inuse_space", "bytes")]);
        let f = builder.function(&kiln_pprof::FunctionSpec {
            name: "grow".into(),
            ..Default::default()
        });
        let loc = builder.location(0, 0x10, &[(f, 3)]);
        builder.sample(&[loc], &[alloc, 5], &[]);
        kiln_pprof::encode_gzip(&builder.finish())
    };
    let limits = DecodeLimits::default();
    let bodies = [
        (
            "name=a&format=folded",
            IngestBody::Raw(b"main;work 3\nmain 1".to_vec()),
        ),
        (
            "name=a&format=lines",
            IngestBody::Raw(b"main;work\nmain".to_vec()),
        ),
        ("name=a&format=pprof", IngestBody::Raw(heap(7))),
        (
            "name=a",
            IngestBody::Multipart(MultipartParts {
                profile: heap(1000),
                prev_profile: Some(heap(600)),
                sample_type_config: None,
            }),
        ),
    ];
    for (query, body) in bodies {
        let mut reserved = 0;
        let upload = build_upload(&params(query), body, &limits, &mut |bytes| {
            reserved += bytes;
            Ok(())
        })
        .unwrap();
        let decoded = upload.decoded.expect("decoded by the server");
        let logged = kiln_pprof::decode(&upload.pprof, &limits).unwrap();
        assert_eq!(decoded.to_message(), logged.into_raw(), "{query}");
        assert!(reserved > 0, "{query}: its memory is in the ingest budget");
    }
}

/// Folded text is checked by the limits a pprof body meets, as a
/// message, since it is never decoded: over them it is a 422.
#[test]
fn folded_text_over_the_pprof_limits_is_refused_as_unprocessable() {
    let limits = DecodeLimits {
        max_table_entries: 2,
        ..DecodeLimits::default()
    };
    let err = build_upload(
        &params("name=a&format=folded"),
        IngestBody::Raw(b"main;work;more 3".to_vec()),
        &limits,
        &mut |_| Ok(()),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            IngestError::BadConversion {
                format: "folded",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.reason(), "limit_exceeded");
    let status = crate::error::ApiError::Ingest { source: err }.http_status();
    assert_eq!(status, axum::http::StatusCode::UNPROCESSABLE_ENTITY);
}
