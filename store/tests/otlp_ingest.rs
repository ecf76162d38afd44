//! OTLP profiles export against a real `kiln-store`: the same profile
//! encoded in every supported `v1development` wire layout ingests with the
//! same totals (HTTP and gRPC), a body of an unsupported layout is refused
//! with a reason, and malformed bodies (gzip bomb, truncation, huge
//! dictionaries, out-of-range indices) hit the existing limits and auth.

use std::io::Write;

use kiln_api::kiln::otlp::{v1_7, v1_8, v1_9, v1_10};
use kiln_api::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceResponse;
use kiln_api::opentelemetry::proto::common::v1::{AnyValue, KeyValue, any_value};
use kiln_api::opentelemetry::proto::resource::v1::Resource;
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{HttpResponse, enc, flamegraph_names, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// Total of the test profile: `main -> hot_loop` 30 ms, `main -> cold_path` 10 ms.
const TOTAL: i64 = 40_000_000;

/// The span the hot sample ran in, by its `link_table` entry: its id as
/// bytes and as OpenTelemetry's hex text.
const SPAN_ID: [u8; 8] = [0x9a, 0x51, 0x71, 0x83, 0xf2, 0x6a, 0x08, 0x9d];
const SPAN_HEX: &str = "9a517183f26a089d";
const TRACE_ID: [u8; 16] = [0x11; 16];

/// Strings shared by every layout's dictionary.
const STRINGS: [&str; 7] = [
    "",
    "cpu",
    "nanoseconds",
    "main",
    "hot_loop",
    "cold_path",
    "app.go",
];

fn resource(service: &str) -> Resource {
    let text = |key: &str, value: &str| KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        key_strindex: 0,
    };
    Resource {
        attributes: vec![
            text("service.name", service),
            text("k8s.namespace.name", "shop"),
            text("k8s.pod.name", "checkout-0"),
        ],
        dropped_attributes_count: 0,
    }
}

fn strings() -> Vec<String> {
    STRINGS.iter().map(|s| (*s).to_owned()).collect()
}

/// Locations 1..=3 are main, hot_loop, cold_path (0 is the null entry).
fn body_v1_7(service: &str) -> Vec<u8> {
    let function = |name| v1_7::Function {
        name_strindex: name,
        filename_strindex: 6,
        ..Default::default()
    };
    let location = |f| v1_7::Location {
        line: vec![v1_7::Line {
            function_index: f,
            line: 10,
            column: 0,
        }],
        ..Default::default()
    };
    let vt = v1_7::ValueType {
        type_strindex: 1,
        unit_strindex: 2,
        aggregation_temporality: 1,
    };
    let sample = |start, value, link_index| v1_7::Sample {
        locations_start_index: start,
        locations_length: 2,
        value: vec![value],
        link_index,
        ..Default::default()
    };
    v1_7::ExportRequest {
        dictionary: Some(v1_7::ProfilesDictionary {
            mapping_table: vec![v1_7::Mapping::default()],
            location_table: vec![
                v1_7::Location::default(),
                location(1),
                location(2),
                location(3),
            ],
            function_table: vec![
                v1_7::Function::default(),
                function(3),
                function(4),
                function(5),
            ],
            string_table: strings(),
            link_table: vec![
                v1_7::Link::default(),
                v1_7::Link {
                    trace_id: TRACE_ID.to_vec(),
                    span_id: SPAN_ID.to_vec(),
                },
            ],
            ..Default::default()
        }),
        resource_profiles: vec![v1_7::ResourceProfiles {
            resource: Some(resource(service)),
            scope_profiles: vec![v1_7::ScopeProfiles {
                profiles: vec![v1_7::Profile {
                    sample_type: vec![vt],
                    sample: vec![sample(0, 30_000_000, 1), sample(2, 10_000_000, 0)],
                    location_indices: vec![2, 1, 3, 1],
                    time_nanos: now_nanos(),
                    duration_nanos: 10_000_000_000,
                    period_type: Some(vt),
                    period: 10_000_000,
                    profile_id: vec![7; 16],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// The dictionary shared by 1.8, 1.9 and 1.10; stacks 1 and 2 are
/// `hot_loop <- main` and `cold_path <- main`.
fn dictionary_v1_8() -> v1_8::ProfilesDictionary {
    let function = |name| v1_8::Function {
        name_strindex: name,
        filename_strindex: 6,
        ..Default::default()
    };
    let location = |f| v1_8::Location {
        lines: vec![v1_8::Line {
            function_index: f,
            line: 10,
            column: 0,
        }],
        ..Default::default()
    };
    v1_8::ProfilesDictionary {
        mapping_table: vec![v1_8::Mapping::default()],
        location_table: vec![
            v1_8::Location::default(),
            location(1),
            location(2),
            location(3),
        ],
        function_table: vec![
            v1_8::Function::default(),
            function(3),
            function(4),
            function(5),
        ],
        string_table: strings(),
        link_table: vec![
            v1_8::Link::default(),
            v1_8::Link {
                trace_id: TRACE_ID.to_vec(),
                span_id: SPAN_ID.to_vec(),
            },
        ],
        stack_table: vec![
            v1_8::Stack::default(),
            v1_8::Stack {
                location_indices: vec![2, 1],
            },
            v1_8::Stack {
                location_indices: vec![3, 1],
            },
        ],
        ..Default::default()
    }
}

fn vt_v1_8() -> Option<v1_8::ValueType> {
    Some(v1_8::ValueType {
        type_strindex: 1,
        unit_strindex: 2,
        aggregation_temporality: 0,
    })
}

fn samples_v1_8() -> Vec<v1_8::Sample> {
    vec![
        v1_8::Sample {
            stack_index: 1,
            values: vec![30_000_000],
            link_index: 1,
            ..Default::default()
        },
        v1_8::Sample {
            stack_index: 2,
            values: vec![10_000_000],
            ..Default::default()
        },
    ]
}

fn body_v1_8(service: &str) -> Vec<u8> {
    v1_8::ExportRequest {
        dictionary: Some(dictionary_v1_8()),
        resource_profiles: vec![v1_8::ResourceProfiles {
            resource: Some(resource(service)),
            scope_profiles: vec![v1_8::ScopeProfiles {
                profiles: vec![v1_8::Profile {
                    sample_type: vt_v1_8(),
                    sample: samples_v1_8(),
                    time_unix_nano: now_nanos() as u64,
                    duration_nano: 10_000_000_000,
                    period_type: vt_v1_8(),
                    period: 10_000_000,
                    profile_id: vec![7; 16],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn body_v1_9(service: &str) -> Vec<u8> {
    v1_9::ExportRequest {
        dictionary: Some(dictionary_v1_8()),
        resource_profiles: vec![v1_9::ResourceProfiles {
            resource: Some(resource(service)),
            scope_profiles: vec![v1_9::ScopeProfiles {
                profiles: vec![v1_9::Profile {
                    sample_type: vt_v1_8(),
                    samples: samples_v1_8(),
                    time_unix_nano: now_nanos() as u64,
                    duration_nano: 10_000_000_000,
                    period_type: vt_v1_8(),
                    period: 10_000_000,
                    // Field 8 is dropped_attributes_count from 1.9 on (1.8:
                    // profile_id, bytes), which tells the two apart.
                    dropped_attributes_count: 1,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn body_v1_10(service: &str, samples: Vec<v1_10::Sample>) -> Vec<u8> {
    v1_10::ExportRequest {
        dictionary: Some(dictionary_v1_8()),
        resource_profiles: vec![v1_10::ResourceProfiles {
            resource: Some(resource(service)),
            scope_profiles: vec![v1_10::ScopeProfiles {
                profiles: vec![v1_10::Profile {
                    sample_type: vt_v1_8(),
                    samples,
                    time_unix_nano: now_nanos() as u64,
                    duration_nano: 10_000_000_000,
                    period_type: vt_v1_8(),
                    period: 10_000_000,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn samples_v1_10() -> Vec<v1_10::Sample> {
    vec![
        v1_10::Sample {
            stack_index: 1,
            values: vec![30_000_000],
            link_index: 1,
            ..Default::default()
        },
        v1_10::Sample {
            stack_index: 2,
            values: vec![10_000_000],
            ..Default::default()
        },
    ]
}

/// An export whose Profile is laid out as in opentelemetry-proto 1.5
/// (tables inside the profile: `location_table` = 4, `string_table` = 10),
/// hand-encoded because no supported layout can express it.
fn body_v1_5() -> Vec<u8> {
    use prost::encoding::{WireType, encode_key, encode_varint};
    fn field(tag: u32, payload: &[u8], out: &mut Vec<u8>) {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }
    let mut profile = Vec::new();
    field(4, &[0x10, 0x80, 0x20], &mut profile); // location_table[0] { address }
    field(10, b"cpu", &mut profile); // string_table
    let mut scope = Vec::new();
    field(2, &profile, &mut scope);
    let mut resource = Vec::new();
    field(2, &scope, &mut resource);
    let mut request = Vec::new();
    field(1, &resource, &mut request);
    request
}

fn post_otlp(store: &StoreProcess, body: &[u8], extra: &[(&str, &str)]) -> HttpResponse {
    let mut headers = vec![("Content-Type", "application/x-protobuf")];
    headers.extend_from_slice(extra);
    http(
        store.addr,
        "POST",
        "/v1development/profiles",
        &headers,
        body,
    )
    .expect("POST")
}

/// The flame graph of `service`'s test profile, of one span's samples
/// with `span`.
fn flamegraph_total(store: &StoreProcess, service: &str, span: Option<&str>) -> (i64, Vec<String>) {
    let query = format!(
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{{service_name=\"{service}\",namespace=\"shop\",pod=\"checkout-0\"}}"
    );
    let span = span.map(|id| format!("&span_id={id}")).unwrap_or_default();
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={}&from=now-1h{span}", enc(&query)),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    (
        json["total"].as_i64().unwrap_or(-1),
        flamegraph_names(&json),
    )
}

#[test]
fn every_supported_revision_ingests_with_the_same_totals() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let bodies = [
        ("svc-1-7", body_v1_7("svc-1-7"), "1.7"),
        ("svc-1-8", body_v1_8("svc-1-8"), "1.8"),
        ("svc-1-9", body_v1_9("svc-1-9"), "1.9"),
        (
            "svc-1-10",
            body_v1_10("svc-1-10", samples_v1_10()),
            "1.10-1.11",
        ),
    ];
    for (service, body, _) in &bodies {
        let response = post_otlp(&store, body, &[]);
        assert_eq!(response.status, 200, "{service}: {}", response.text());
        let reply = ExportProfilesServiceResponse::decode(response.body.as_slice()).unwrap();
        assert_eq!(reply.partial_success, None, "{service}");
    }
    for (service, _, _) in &bodies {
        let (total, names) = flamegraph_total(&store, service, None);
        assert_eq!(total, TOTAL, "{service}");
        for name in ["main", "hot_loop", "cold_path"] {
            assert!(names.iter().any(|n| n == name), "{service}: {names:?}");
        }
        // The hot sample's link names its span: a span profile of it is
        // the hot sample alone.
        let (total, names) = flamegraph_total(&store, service, Some(SPAN_HEX));
        assert_eq!(total, 30_000_000, "{service}: the linked span's samples");
        assert!(
            !names.iter().any(|n| n == "cold_path"),
            "{service}: {names:?}"
        );
    }
    let metrics = get(store.addr, "/metrics").text();
    for (_, _, revision) in &bodies {
        assert!(
            metrics.contains(&format!(
                "kiln_otlp_export_requests_total{{revision=\"{revision}\"}} 1"
            )),
            "{revision} not counted alone:\n{metrics}"
        );
    }
}

#[test]
fn a_body_of_an_unsupported_revision_is_refused_with_a_reason() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let response = post_otlp(&store, &body_v1_5(), &[]);
    assert_eq!(response.status, 400, "{}", response.text());
    let json = response.json();
    assert_eq!(json["reason"], "otlp_unsupported_revision");
    let message = json["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("1.7:") && message.contains("1.10-1.11:"),
        "{message}"
    );
}

#[test]
fn malformed_otlp_bodies_get_clear_errors_under_limits_and_auth() {
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &["--max-request-bytes", "4000000"],
        &[("KILN_WRITE_TOKENS", "secret")],
    );
    let auth = ("Authorization", "Bearer secret");
    let good = body_v1_10("svc-bad", samples_v1_10());

    let response = post_otlp(&store, &good, &[]);
    assert_eq!(response.status, 401, "no token");

    let truncated = &good[..good.len() / 2];
    let response = post_otlp(&store, truncated, &[auth]);
    assert_eq!(response.status, 400, "{}", response.text());
    assert_eq!(response.json()["reason"], "otlp_unsupported_revision");

    let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    bomb.write_all(&vec![0u8; 64 << 20]).unwrap();
    let bomb = bomb.finish().unwrap();
    let response = post_otlp(&store, &bomb, &[auth, ("Content-Encoding", "gzip")]);
    assert_eq!(response.status, 413, "{}", response.text());

    let mut huge = dictionary_v1_8();
    huge.string_table
        .extend((0..1_100_000).map(|_| String::new()));
    let body = v1_10::ExportRequest {
        dictionary: Some(huge),
        resource_profiles: Vec::new(),
    }
    .encode_to_vec();
    let response = post_otlp(&store, &body, &[auth]);
    assert_eq!(response.status, 400, "{}", response.text());
    assert_eq!(response.json()["reason"], "otlp_table_too_large");

    let out_of_range = body_v1_10(
        "svc-bad",
        vec![v1_10::Sample {
            stack_index: 99,
            values: vec![1],
            ..Default::default()
        }],
    );
    let response = post_otlp(&store, &out_of_range, &[auth]);
    assert_eq!(response.status, 400, "{}", response.text());
    let json = response.json();
    assert_eq!(json["reason"], "otlp_index_out_of_range", "{json}");
    assert!(
        json["error"]
            .as_str()
            .unwrap_or_default()
            .contains("stack_index = 99"),
        "{json}"
    );

    // A link to no entry, and a span id of the wrong length: refused with
    // the field named, never stored without its span.
    let dangling = body_v1_10(
        "svc-bad",
        vec![v1_10::Sample {
            stack_index: 1,
            values: vec![1],
            link_index: 7,
            ..Default::default()
        }],
    );
    let response = post_otlp(&store, &dangling, &[auth]);
    assert_eq!(response.status, 400, "{}", response.text());
    assert!(
        response.text().contains("link_index = 7"),
        "{}",
        response.text()
    );
    let mut short_span = dictionary_v1_8();
    short_span.link_table[1].span_id = vec![1, 2, 3, 4, 5];
    let body = v1_10::ExportRequest {
        dictionary: Some(short_span),
        resource_profiles: Vec::new(),
    }
    .encode_to_vec();
    let response = post_otlp(&store, &body, &[auth]);
    assert_eq!(response.status, 400, "{}", response.text());
    let json = response.json();
    assert_eq!(json["reason"], "otlp_bad_link", "{json}");
    assert!(
        json["error"]
            .as_str()
            .unwrap_or_default()
            .contains("link.span_id is 5 bytes"),
        "{json}"
    );

    let mut gzipped = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gzipped.write_all(&good).unwrap();
    let gzipped = gzipped.finish().unwrap();
    let response = post_otlp(&store, &gzipped, &[auth, ("Content-Encoding", "gzip")]);
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(flamegraph_total(&store, "svc-bad", None).0, TOTAL);
}

#[tokio::test]
async fn grpc_export_stores_and_refuses_like_http() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    let path = http::uri::PathAndQuery::from_static(kiln_api::OTLP_PROFILES_EXPORT_PATH);
    let mut call = async |request: v1_10::ExportRequest| {
        grpc.ready().await.unwrap();
        grpc.unary::<_, ExportProfilesServiceResponse, _>(
            tonic::Request::new(request),
            path.clone(),
            tonic_prost::ProstCodec::default(),
        )
        .await
    };
    let request =
        v1_10::ExportRequest::decode(body_v1_10("svc-grpc", samples_v1_10()).as_slice()).unwrap();
    let reply = call(request).await.expect("export accepted");
    assert_eq!(reply.into_inner().partial_success, None);
    assert_eq!(flamegraph_total(&store, "svc-grpc", None).0, TOTAL);

    let bad = v1_10::ExportRequest::decode(
        body_v1_10(
            "svc-grpc",
            vec![v1_10::Sample {
                stack_index: 1,
                ..Default::default()
            }],
        )
        .as_slice(),
    )
    .unwrap();
    let status = call(bad)
        .await
        .expect_err("a sample without values is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("neither values nor timestamps"),
        "{status:?}"
    );
}

#[tokio::test]
async fn grpc_export_is_bounded_after_gzip_and_needs_the_write_token() {
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &["--max-request-bytes", "4000000"],
        &[("KILN_WRITE_TOKENS", "secret")],
    );
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc =
        tonic::client::Grpc::new(channel).send_compressed(tonic::codec::CompressionEncoding::Gzip);
    let path = http::uri::PathAndQuery::from_static(kiln_api::OTLP_PROFILES_EXPORT_PATH);
    let mut call = async |request: v1_10::ExportRequest, token: Option<&str>| {
        let mut request = tonic::Request::new(request);
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        grpc.ready().await.unwrap();
        grpc.unary::<_, ExportProfilesServiceResponse, _>(
            request,
            path.clone(),
            tonic_prost::ProstCodec::default(),
        )
        .await
    };
    let good =
        v1_10::ExportRequest::decode(body_v1_10("svc-grpc-auth", samples_v1_10()).as_slice())
            .unwrap();
    let status = call(good.clone(), None).await.expect_err("no token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // 64 MB of one repeated string gzips to well under the limit; the
    // decompressed message is over it.
    let mut bomb = good.clone();
    if let Some(dictionary) = bomb.dictionary.as_mut() {
        dictionary.string_table.push("a".repeat(64 << 20));
    }
    let status = call(bomb, Some("secret"))
        .await
        .expect_err("over the size limit");
    assert!(
        status.code() == tonic::Code::ResourceExhausted
            && status.message().contains("decompressing"),
        "{status:?}"
    );

    call(good, Some("secret"))
        .await
        .expect("accepted with the token");
    assert_eq!(flamegraph_total(&store, "svc-grpc-auth", None).0, TOTAL);
}

#[test]
fn a_profile_the_store_refuses_after_others_were_kept_is_a_partial_success() {
    // One series per profile name: the second resource's series is over it.
    let store = StoreProcess::start(KILN_STORE, &["--max-series-per-profile-name", "1"]);
    let mut request =
        v1_10::ExportRequest::decode(body_v1_10("svc-kept", samples_v1_10()).as_slice()).unwrap();
    let mut second = request.resource_profiles[0].clone();
    second.resource = Some(resource("svc-refused"));
    request.resource_profiles.push(second);
    let response = post_otlp(&store, &request.encode_to_vec(), &[]);
    assert_eq!(response.status, 200, "{}", response.text());
    let reply = ExportProfilesServiceResponse::decode(response.body.as_slice()).unwrap();
    let partial = reply.partial_success.expect("a partial success");
    assert_eq!(partial.rejected_profiles, 1);
    assert!(!partial.error_message.is_empty());
    assert_eq!(flamegraph_total(&store, "svc-kept", None).0, TOTAL);
}

/// Bodies written by the official generated Python classes of PyPI
/// `opentelemetry-proto` 1.39.1 (1.7 layout), 1.42.1 (1.9) and 1.45.2
/// (1.10/1.11), so Kiln's own `.proto` files are checked against an
/// independent encoder (`tests/fixtures/otlp/generate.py`).
#[test]
fn bodies_from_the_official_python_classes_ingest_with_the_same_totals() {
    // The fixtures carry fixed times; keep them accepted as time passes.
    let store = StoreProcess::start(KILN_STORE, &["--retention", "36500d"]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/otlp");
    for (layout, revisions) in [("v1_7", "1.7"), ("v1_9", "1.8+1.9"), ("v1_10", "1.10-1.11")] {
        let body = std::fs::read(dir.join(format!("{layout}.bin"))).expect("fixture");
        let response = post_otlp(&store, &body, &[]);
        assert_eq!(response.status, 200, "{layout}: {}", response.text());
        let service = format!("py-{layout}");
        let query = format!(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{{service_name=\"{service}\",namespace=\"shop\"}}"
        );
        let response = get(
            store.addr,
            &format!(
                "/api/v1/flamegraph?query={}&from=1795300000&to=1795302000",
                enc(&query)
            ),
        );
        assert_eq!(response.status, 200, "{layout}: {}", response.text());
        let json = response.json();
        assert_eq!(json["total"].as_i64(), Some(TOTAL), "{layout}: {json}");
        let names = flamegraph_names(&json);
        assert!(names.iter().any(|n| n == "hot_loop"), "{layout}: {names:?}");
        let metrics = get(store.addr, "/metrics").text();
        assert!(
            metrics.contains(&format!(
                "kiln_otlp_export_requests_total{{revision=\"{revisions}\"}} 1"
            )),
            "{layout}: {metrics}"
        );
    }
}
