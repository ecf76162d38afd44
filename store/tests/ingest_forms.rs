//! The ingest forms no captured client exercises: Go-SDK-style multipart
//! with `prev_profile` and `sample_type_config`, `format=lines`, and Push
//! over Connect with a JSON body and gzip content encoding.

use std::io::Write;

use kiln_pprof::{FunctionSpec, ProfileBuilder, encode_gzip};
use kiln_testkit::http::{enc, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

fn heap_profile(alloc_space: i64, inuse_space: i64) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("alloc_space", "bytes"), ("inuse_space", "bytes")]);
    builder.period("space", "bytes", 524_288);
    let f = builder.function(&FunctionSpec {
        name: "main.allocateBuffers".into(),
        ..Default::default()
    });
    let loc = builder.location(0, 0x4010, &[(f, 12)]);
    builder.sample(&[loc], &[alloc_space, inuse_space], &[]);
    encode_gzip(&builder.finish())
}

fn multipart(parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, data) in parts {
        write!(
            body,
            "--BOUNDARY\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .expect("write");
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"--BOUNDARY--\r\n");
    body
}

fn total(store: &StoreProcess, selector: &str) -> i64 {
    let response = get(
        store.addr,
        &format!("/api/v1/flamegraph?query={}&from=now-1h", enc(selector)),
    );
    assert_eq!(response.status, 200, "{selector}: {}", response.text());
    response.json()["total"].as_i64().expect("total")
}

#[test]
fn go_style_multipart_stores_the_growth_of_cumulative_types() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let config = br#"{"alloc_space":{"units":"bytes","cumulative":true},"inuse_space":{"units":"bytes","aggregation":"average"}}"#;
    let body = multipart(&[
        ("profile", &heap_profile(10_000, 4_000)),
        ("prev_profile", &heap_profile(6_000, 3_000)),
        ("sample_type_config", config),
    ]);
    let response = http(
        store.addr,
        "POST",
        &format!(
            "/ingest?name={}&from=now-10s&until=now&spyName=gospy",
            enc("goapp{env=prod,otel.scope.name=com.grafana.pyroscope/go}")
        ),
        &[("Content-Type", "multipart/form-data; boundary=BOUNDARY")],
        &body,
    )
    .expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        total(
            &store,
            r#"memory:alloc_space{service_name="goapp", env="prod"}"#
        ),
        4_000,
        "alloc_space is cumulative: 10000 - 6000"
    );
    assert_eq!(
        total(&store, r#"memory:inuse_space{pyroscope_spy="gospy"}"#),
        4_000,
        "inuse_space is not cumulative"
    );
}

#[test]
fn a_gauges_timeline_averages_its_profiles_and_a_cumulative_types_sums_them() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let config = br#"{"alloc_space":{"units":"bytes","cumulative":true},"inuse_space":{"units":"bytes","aggregation":"average"}}"#;
    // Two scrapes of one process, within one step: in use 4000 then 2000
    // bytes; 1000 and then 500 more bytes allocated.
    for (from, inuse, alloc_before, alloc_now) in [
        ("now-40s", 4_000, 9_000, 10_000),
        ("now-20s", 2_000, 10_000, 10_500),
    ] {
        let body = multipart(&[
            ("profile", &heap_profile(alloc_now, inuse)),
            ("prev_profile", &heap_profile(alloc_before, 0)),
            ("sample_type_config", config),
        ]);
        let response = http(
            store.addr,
            "POST",
            &format!(
                "/ingest?name={}&from={from}&until={from}&spyName=gospy",
                enc("goapp{env=prod}")
            ),
            &[("Content-Type", "multipart/form-data; boundary=BOUNDARY")],
            &body,
        )
        .expect("ingest");
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let timeline = |query: &str, extra: &str| {
        let response = get(
            store.addr,
            &format!(
                "/api/v1/timeline?query={}&from=now-1h&step=2h{extra}",
                enc(query)
            ),
        );
        assert_eq!(response.status, 200, "{}", response.text());
        let body = response.json();
        let values: Vec<i64> = body["timeline"]["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_i64().expect("value"))
            .collect();
        (
            body["aggregation"]
                .as_str()
                .expect("aggregation")
                .to_owned(),
            values,
        )
    };
    let inuse = r#"memory:inuse_space{service_name="goapp"}"#;
    assert_eq!(timeline(inuse, ""), ("average".to_owned(), vec![3_000]));
    assert_eq!(
        timeline(inuse, "&aggregation=sum"),
        ("sum".to_owned(), vec![6_000])
    );
    let alloc = r#"memory:alloc_space{service_name="goapp"}"#;
    assert_eq!(timeline(alloc, ""), ("sum".to_owned(), vec![1_500]));
    let bad = get(
        store.addr,
        &format!(
            "/api/v1/timeline?query={}&from=now-1h&aggregation=max",
            enc(inuse)
        ),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
}

#[test]
fn lines_format_counts_each_stack_line_once() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let response = http(
        store.addr,
        "POST",
        "/ingest?name=linesapp.cpu&format=lines&sampleRate=100&from=now-10s&until=now",
        &[],
        b"main;tick\nmain;tick\nmain;tock\n",
    )
    .expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        total(&store, r#"process_cpu{service_name="linesapp"}"#),
        3 * 10_000_000
    );
}

#[test]
fn connect_push_accepts_json_and_gzipped_protobuf() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder.period("cpu", "nanoseconds", 10_000_000);
    let f = builder.function(&FunctionSpec {
        name: "json_pushed".into(),
        ..Default::default()
    });
    let loc = builder.location(0, 0, &[(f, 0)]);
    builder.sample(&[loc], &[20_000_000], &[]);
    let profile = builder.finish().encode_to_vec();
    let base64 = base64_encode(&profile);
    let json = format!(
        r#"{{"series":[{{"labels":[{{"name":"__name__","value":"process_cpu"}},{{"name":"service_name","value":"jsonapp"}}],"samples":[{{"rawProfile":"{base64}","ID":"1"}}]}}]}}"#
    );
    let response = http(
        store.addr,
        "POST",
        "/push.v1.PusherService/Push",
        &[("Content-Type", "application/json")],
        json.as_bytes(),
    )
    .expect("push");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.text(), "{}");

    let request = kiln_api::push::v1::PushRequest {
        series: vec![kiln_api::push::v1::RawProfileSeries {
            labels: vec![
                kiln_api::types::v1::LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                },
                kiln_api::types::v1::LabelPair {
                    name: "service_name".into(),
                    value: "jsonapp".into(),
                },
            ],
            samples: vec![kiln_api::push::v1::RawSample {
                raw_profile: profile,
                id: "2".into(),
            }],
        }],
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&request.encode_to_vec()).expect("gzip");
    let response = http(
        store.addr,
        "POST",
        "/push.v1.PusherService/Push",
        &[
            ("Content-Type", "application/proto"),
            ("Content-Encoding", "gzip"),
        ],
        &gz.finish().expect("gzip"),
    )
    .expect("push");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("application/proto"));
    assert_eq!(
        total(&store, r#"process_cpu{service_name="jsonapp"}"#),
        40_000_000
    );
}

fn base64_encode(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
