//! The outer messages of every ingest protocol against a real `kiln-store`:
//! requests that are small on the wire but decode into gigabytes (an OTLP
//! stack of eight million entries referred to by 200 samples, millions of
//! empty WriteRaw and Push series) are refused with a client error before
//! they are decoded, the store's peak memory stays near the body's size,
//! and a good upload is stored afterwards.

use std::io::Write as _;

use bytes::{Buf as _, BufMut as _};
use kiln_api::kiln::otlp::v1_8;
use kiln_api::parca::profilestore::v1alpha1::profile_store_service_client::ProfileStoreServiceClient;
use kiln_api::parca::profilestore::v1alpha1::{
    Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest,
};
use kiln_pprof::{FunctionSpec, ProfileBuilder, encode_gzip};
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{HttpResponse, enc, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// Empty series in the amplification bodies: 2 bytes each, just under the
/// default 32 MiB request limit.
const EMPTY_SERIES: usize = 16_700_000;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data).expect("gzip in memory");
    encoder.finish().expect("gzip in memory")
}

/// The store's peak resident memory so far, in bytes (`VmHWM`).
fn peak_rss(store: &StoreProcess) -> u64 {
    let pid = store.pid().expect("the store runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Asserts the store answers `/healthz` and has not grown past `limit`
/// bytes of peak memory; prints the peak.
fn assert_alive_and_small(store: &StoreProcess, what: &str, limit: u64) {
    let health = get(store.addr, "/healthz");
    assert_eq!(health.status, 200, "alive after {what}");
    let peak = peak_rss(store);
    let _ = writeln!(
        std::io::stderr(),
        "{what}: store peak RSS {} MiB",
        peak >> 20
    );
    assert!(
        peak < limit,
        "{what}: peak RSS {} MiB, over {} MiB",
        peak >> 20,
        limit >> 20
    );
}

/// Peak memory the store may reach in these tests: its own baseline and a
/// few copies of a 32 MiB body; decoding the hostile bodies would take
/// gigabytes.
const PEAK_LIMIT: u64 = 400 << 20;

/// A CPU profile with one stack, `main`, 10 ms.
fn cpu_profile() -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now_nanos(), 10_000_000_000);
    let main = builder.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let location = builder.location(0, 0x1000, &[(main, 1)]);
    builder.sample(&[location], &[10_000_000], &[]);
    encode_gzip(&builder.finish())
}

/// The flame graph total of `service`'s CPU profiles in the last hour.
fn cpu_total(store: &StoreProcess, service: &str) -> i64 {
    let query = enc(&format!(r#"process_cpu{{service_name="{service}"}}"#));
    let graph = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
    );
    assert_eq!(graph.status, 200, "{}", graph.text());
    graph.json()["total"].as_i64().unwrap_or(0)
}

/// A 1.8 export whose one stack holds `depth` zero indices and whose one
/// profile has `samples` samples of that stack.
fn deep_stack_export(depth: usize, samples: usize) -> Vec<u8> {
    v1_8::ExportRequest {
        dictionary: Some(v1_8::ProfilesDictionary {
            string_table: vec![String::new()],
            location_table: vec![v1_8::Location::default()],
            stack_table: vec![v1_8::Stack {
                location_indices: vec![0; depth],
            }],
            ..Default::default()
        }),
        resource_profiles: vec![v1_8::ResourceProfiles {
            scope_profiles: vec![v1_8::ScopeProfiles {
                profiles: vec![v1_8::Profile {
                    sample: (0..samples)
                        .map(|_| v1_8::Sample {
                            values: vec![1],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// A good 1.8 export of `service`: `main`, 10 ms of CPU.
fn good_export(service: &str) -> Vec<u8> {
    let strings = ["", "cpu", "nanoseconds", "main", "service.name", service];
    v1_8::ExportRequest {
        dictionary: Some(v1_8::ProfilesDictionary {
            string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
            function_table: vec![
                v1_8::Function::default(),
                v1_8::Function {
                    name_strindex: 3,
                    ..Default::default()
                },
            ],
            location_table: vec![
                v1_8::Location::default(),
                v1_8::Location {
                    lines: vec![v1_8::Line {
                        function_index: 1,
                        line: 1,
                        column: 0,
                    }],
                    ..Default::default()
                },
            ],
            stack_table: vec![
                v1_8::Stack::default(),
                v1_8::Stack {
                    location_indices: vec![1],
                },
            ],
            ..Default::default()
        }),
        resource_profiles: vec![v1_8::ResourceProfiles {
            resource: Some(kiln_api::opentelemetry::proto::resource::v1::Resource {
                attributes: vec![kiln_api::opentelemetry::proto::common::v1::KeyValue {
                    key: "service.name".into(),
                    value: Some(kiln_api::opentelemetry::proto::common::v1::AnyValue {
                        value: Some(
                            kiln_api::opentelemetry::proto::common::v1::any_value::Value::StringValue(
                                service.into(),
                            ),
                        ),
                    }),
                    key_strindex: 0,
                }],
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![v1_8::ScopeProfiles {
                profiles: vec![v1_8::Profile {
                    sample_type: Some(v1_8::ValueType {
                        type_strindex: 1,
                        unit_strindex: 2,
                        aggregation_temporality: 0,
                    }),
                    sample: vec![v1_8::Sample {
                        stack_index: 1,
                        values: vec![10_000_000],
                        ..Default::default()
                    }],
                    time_unix_nano: u64::try_from(now_nanos()).unwrap_or(0),
                    duration_nano: 10_000_000_000,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn post(store: &StoreProcess, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
    http(store.addr, "POST", path, headers, body).expect("the store answers")
}

#[test]
fn an_otlp_stack_of_millions_referred_to_by_every_sample_is_refused_before_decoding() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let body = deep_stack_export(8_000_000, 200);
    let gzipped = gzip(&body);
    eprintln!(
        "deep stack export: {} bytes, {} gzipped",
        body.len(),
        gzipped.len()
    );
    let protobuf = ("Content-Type", "application/x-protobuf");
    for (name, sent, headers) in [
        ("plain", &body, vec![protobuf]),
        (
            "gzip",
            &gzipped,
            vec![protobuf, ("Content-Encoding", "gzip")],
        ),
    ] {
        let started = std::time::Instant::now();
        let response = post(&store, "/v1development/profiles", &headers, sent);
        eprintln!(
            "{name}: {} in {:?}: {}",
            response.status,
            started.elapsed(),
            response.text()
        );
        assert_eq!(response.status, 400, "{}", response.text());
        assert!(response.text().contains("stack"), "{}", response.text());
        assert_alive_and_small(&store, "a deep OTLP stack", PEAK_LIMIT);
    }
    // A stack at the limit is fine; one past it is refused.
    let response = post(
        &store,
        "/v1development/profiles",
        &[protobuf],
        &deep_stack_export(4097, 1),
    );
    assert_eq!(response.status, 400, "{}", response.text());
    let response = post(
        &store,
        "/v1development/profiles",
        &[protobuf],
        &good_export("otlp-after"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(cpu_total(&store, "otlp-after"), 10_000_000);
}

/// Sends a message's bytes as they are, and ignores the reply's.
#[derive(Debug, Clone, Copy, Default)]
struct RawBytes;

impl Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawBytes;
    type Decoder = RawBytes;

    fn encoder(&mut self) -> Self::Encoder {
        RawBytes
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawBytes
    }
}

impl Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawBytes {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

/// Sends `message` gzip-compressed to the gRPC method at `path`.
async fn grpc_raw(store: &StoreProcess, path: &'static str, message: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("valid url")
        .connect()
        .await
        .expect("connect over h2c");
    let mut grpc = tonic::client::Grpc::new(channel).send_compressed(CompressionEncoding::Gzip);
    grpc.ready().await.expect("ready");
    let started = std::time::Instant::now();
    let status = grpc
        .unary::<_, (), _>(
            tonic::Request::new(message),
            http::uri::PathAndQuery::from_static(path),
            RawBytes,
        )
        .await
        .expect_err("refused");
    let _ = writeln!(
        std::io::stderr(),
        "{path}: {status:?} in {:?}",
        started.elapsed()
    );
    status
}

fn good_write_raw(service: &str) -> WriteRawRequest {
    let label = |name: &str, value: &str| Label {
        name: name.into(),
        value: value.into(),
    };
    WriteRawRequest {
        series: vec![RawProfileSeries {
            labels: Some(LabelSet {
                labels: vec![
                    label("__name__", "process_cpu"),
                    label("service_name", service),
                ],
            }),
            samples: vec![RawSample {
                raw_profile: cpu_profile(),
                executable_info: vec![],
            }],
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn millions_of_empty_series_over_grpc_are_refused_before_decoding() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    // WriteRawRequest.series is field 2, PushRequest.series field 1.
    for (path, empty) in [
        (kiln_api::WRITE_RAW_PATH, [0x12, 0x00]),
        (kiln_api::PUSH_PATH, [0x0a, 0x00]),
    ] {
        let status = grpc_raw(&store, path, empty.repeat(EMPTY_SERIES)).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("series"), "{status:?}");
        assert_alive_and_small(&store, path, PEAK_LIMIT);
    }
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("valid url")
        .connect()
        .await
        .expect("connect over h2c");
    ProfileStoreServiceClient::new(channel)
        .send_compressed(CompressionEncoding::Gzip)
        .write_raw(good_write_raw("grpc-after"))
        .await
        .expect("a good WriteRaw is stored");
    assert_eq!(cpu_total(&store, "grpc-after"), 10_000_000);
}

#[test]
fn millions_of_empty_push_series_over_connect_are_refused_before_decoding() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let proto = gzip(&[0x0a, 0x00].repeat(EMPTY_SERIES));
    let mut json = b"{\"series\":[".to_vec();
    json.extend(b"{},".repeat(11_000_000));
    json.extend(b"{}]}");
    let json = gzip(&json);
    let gzip_header = ("Content-Encoding", "gzip");
    for (what, content_type, body) in [
        ("proto", "application/proto", &proto),
        ("json", "application/json", &json),
    ] {
        let started = std::time::Instant::now();
        let response = post(
            &store,
            kiln_api::PUSH_PATH,
            &[("Content-Type", content_type), gzip_header],
            body,
        );
        eprintln!(
            "Push {what} ({} bytes gzipped): {} in {:?}: {}",
            body.len(),
            response.status,
            started.elapsed(),
            response.text()
        );
        assert_eq!(response.status, 400, "{}", response.text());
        assert!(response.text().contains("series"), "{}", response.text());
        assert_alive_and_small(&store, what, PEAK_LIMIT);
    }
    let good = kiln_api::push::v1::PushRequest {
        series: vec![kiln_api::push::v1::RawProfileSeries {
            labels: vec![
                kiln_api::types::v1::LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                },
                kiln_api::types::v1::LabelPair {
                    name: "service_name".into(),
                    value: "push-after".into(),
                },
            ],
            samples: vec![kiln_api::push::v1::RawSample {
                raw_profile: cpu_profile(),
                id: String::new(),
            }],
        }],
    };
    let response = post(
        &store,
        kiln_api::PUSH_PATH,
        &[("Content-Type", "application/proto"), gzip_header],
        &gzip(&good.encode_to_vec()),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(cpu_total(&store, "push-after"), 10_000_000);
}

#[test]
fn a_gzip_body_is_held_to_the_ingest_budget_as_it_inflates() {
    // A budget whose ingest share is far below what the body inflates to:
    // inflating must stop at the budget, not run to the request limit.
    let store = StoreProcess::start(KILN_STORE, &["--memory-budget", "64Mi"]);
    let bomb = gzip(&vec![b'a'; 32 << 20]);
    for path in ["/ingest?name=bomb&format=folded", kiln_api::PUSH_PATH] {
        let response = post(
            &store,
            path,
            &[
                ("Content-Type", "application/proto"),
                ("Content-Encoding", "gzip"),
            ],
            &bomb,
        );
        eprintln!("{path}: {} {}", response.status, response.text());
        assert!(
            (400..500).contains(&response.status),
            "{path}: {} {}",
            response.status,
            response.text()
        );
        assert_alive_and_small(&store, path, PEAK_LIMIT);
    }
    let response = post(
        &store,
        "/ingest?name=gzip-after&format=folded",
        &[("Content-Encoding", "gzip")],
        &gzip(b"main 1\n"),
    );
    assert_eq!(response.status, 200, "{}", response.text());
}
