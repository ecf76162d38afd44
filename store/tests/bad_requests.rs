//! Every kind of bad request gets a 4xx (or a gRPC error status) whose
//! message says what is wrong, and none of them takes the server down.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kiln_api::push::v1::pusher_service_client::PusherServiceClient;
use kiln_api::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_api::types::v1::LabelPair;
use kiln_testkit::http::{enc, get, http};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).expect("gzip");
    encoder.finish().expect("gzip")
}

fn push_body(labels: &[(&str, &str)], raw_profile: &[u8]) -> Vec<u8> {
    PushRequest {
        series: vec![RawProfileSeries {
            labels: labels
                .iter()
                .map(|(n, v)| LabelPair {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
            samples: vec![RawSample {
                raw_profile: raw_profile.to_vec(),
                id: String::new(),
            }],
        }],
    }
    .encode_to_vec()
}

struct Case {
    method: &'static str,
    target: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    status: u16,
    message: &'static str,
}

fn case(
    method: &'static str,
    target: &str,
    headers: &[(&'static str, &'static str)],
    body: &[u8],
    status: u16,
    message: &'static str,
) -> Case {
    Case {
        method,
        target: target.to_owned(),
        headers: headers.to_vec(),
        body: body.to_vec(),
        status,
        message,
    }
}

#[test]
fn bad_http_requests_get_4xx_with_a_message_naming_the_problem() {
    let store = StoreProcess::start(KILN_STORE, &["--max-request-bytes", "4096"]);
    let proto = [("Content-Type", "application/proto")];
    let mut gzip_junk = gzip(b"hello world, this is not going to survive");
    gzip_junk.truncate(20);
    let otlp = [("Content-Type", "application/x-protobuf")];
    // Under the 4096-byte body limit compressed, far over it inflated.
    let zeros_bomb = gzip(&vec![0u8; 1 << 20]);
    // Query bodies are capped at 1 MiB inflated: one byte past it.
    let query_bomb = gzip(&vec![0u8; (1 << 20) + 1]);
    let cases = vec![
        case(
            "POST",
            "/ingest",
            &[],
            b"a 1",
            400,
            "query parameter `name` is required",
        ),
        case(
            "POST",
            "/ingest?name=app%7Ba%3Db",
            &[],
            b"a 1",
            400,
            "must end with `}`",
        ),
        case(
            "POST",
            "/ingest?name=app&from=yesterday",
            &[],
            b"a 1",
            400,
            "invalid `from`",
        ),
        case(
            "POST",
            "/ingest?name=app&from=20&until=10",
            &[],
            b"a 1",
            400,
            "is before `from`",
        ),
        case(
            "POST",
            "/ingest?name=app&format=jfr",
            &[],
            b"x",
            415,
            "format \"jfr\" is not supported",
        ),
        case(
            "POST",
            "/ingest?name=app&format=pprof",
            &[],
            b"garbage",
            422,
            "body is not a valid pprof profile",
        ),
        case(
            "POST",
            "/ingest?name=app",
            &[],
            b"main;work notanumber",
            422,
            "line 1: count \"notanumber\"",
        ),
        case(
            "POST",
            "/ingest?name=app",
            &[("Content-Encoding", "br")],
            b"x",
            415,
            "content encoding \"br\"",
        ),
        case(
            "POST",
            "/ingest?name=app",
            &[("Content-Encoding", "gzip")],
            &gzip_junk,
            400,
            "gzip request body is corrupt",
        ),
        case(
            "POST",
            "/ingest?name=app&format=pprof",
            &[("Content-Type", "multipart/form-data; boundary=XX")],
            b"--XX\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nhi\r\n--XX--\r\n",
            400,
            "`profile` field is missing",
        ),
        case(
            "POST",
            "/ingest?name=app",
            &[],
            &[b'a'; 5000],
            413,
            "exceeds the limit of 4096 bytes",
        ),
        case(
            "POST",
            "/push.v1.PusherService/Push",
            &proto,
            b"\xff\xff\xff",
            400,
            "not a valid push.v1.PushRequest protobuf",
        ),
        case(
            "POST",
            "/push.v1.PusherService/Push",
            &[("Content-Type", "text/plain")],
            b"x",
            415,
            "content type \"text/plain\"",
        ),
        case(
            "POST",
            "/push.v1.PusherService/Push",
            &proto,
            &push_body(&[("service_name", "x")], b"\x0a\x00"),
            400,
            "`__name__` label",
        ),
        case(
            "POST",
            "/push.v1.PusherService/Push",
            &proto,
            &push_body(&[("__name__", "process_cpu")], b"not pprof at all"),
            400,
            "invalid profile",
        ),
        case(
            "POST",
            "/push.v1.PusherService/Push",
            &[("Content-Type", "application/json")],
            b"{\"series\":7}",
            400,
            "push.v1.PushRequest JSON",
        ),
        case(
            "GET",
            "/api/v1/flamegraph",
            &[],
            b"",
            400,
            "invalid `query`",
        ),
        case(
            "GET",
            &format!(
                "/api/v1/flamegraph?query={}",
                enc(r#"process_cpu{pod>"x"}"#)
            ),
            &[],
            b"",
            400,
            "selector position 16: expected `=`",
        ),
        case(
            "GET",
            &format!("/api/v1/flamegraph?query={}", enc("no_such_type")),
            &[],
            b"",
            400,
            "no profile type matches \"no_such_type\"",
        ),
        case(
            "GET",
            "/api/v1/flamegraph?query=a:b:c:d:e&from=soon",
            &[],
            b"",
            400,
            "invalid `from`",
        ),
        case(
            "GET",
            "/api/v1/flamegraph?query=a:b:c:d:e&from=now&to=now-1h",
            &[],
            b"",
            400,
            "must be after `from`",
        ),
        case(
            "GET",
            "/api/v1/flamegraph?query=a:b:c:d:e&max_nodes=0",
            &[],
            b"",
            400,
            "invalid `max_nodes`",
        ),
        case(
            "GET",
            "/api/v1/timeline?query=a:b:c:d:e&step=soon",
            &[],
            b"",
            400,
            "invalid `step`",
        ),
        case(
            "GET",
            "/api/v1/diff?left_query=a:b:c:d:e&right_query=f:b:c:d:e",
            &[],
            b"",
            400,
            "differs from the left side",
        ),
        case(
            "GET",
            "/api/v1/nothing-here",
            &[],
            b"",
            404,
            "no such endpoint",
        ),
        case("GET", "/ingest", &[], b"", 405, "method GET is not allowed"),
        // OTLP profiles over HTTP.
        case(
            "POST",
            "/v1development/profiles",
            &otlp,
            b"\x0a\x20\x12",
            400,
            "does not decode as an OTLP profiles export",
        ),
        case(
            "POST",
            "/v1development/profiles",
            &[("Content-Type", "application/json")],
            b"{}",
            415,
            "OTLP JSON is not supported",
        ),
        case(
            "POST",
            "/v1development/profiles",
            &[
                ("Content-Type", "application/x-protobuf"),
                ("Content-Encoding", "gzip"),
            ],
            &zeros_bomb,
            413,
            "exceeds the limit",
        ),
        // Pyroscope's querier over Connect, and render.
        case(
            "POST",
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            &proto,
            b"\x0a\x10ab",
            400,
            "not a valid querier.v1.SelectMergeStacktracesRequest",
        ),
        case(
            "POST",
            "/querier.v1.QuerierService/LabelNames",
            &[
                ("Content-Type", "application/json"),
                ("Content-Encoding", "gzip"),
            ],
            &query_bomb,
            413,
            "exceeds the limit",
        ),
        case(
            "POST",
            "/querier.v1.QuerierService/LabelNames",
            &[("Content-Type", "text/plain")],
            b"{}",
            415,
            "application/json or application/proto",
        ),
        case(
            "GET",
            "/pyroscope/render?from=now-1h",
            &[],
            b"",
            400,
            "invalid `query`",
        ),
    ];
    for case in cases {
        let response = http(
            store.addr,
            case.method,
            &case.target,
            &case.headers,
            &case.body,
        )
        .expect("request");
        // The message travels as `error` (HTTP API) or `message` (Connect).
        let text = serde_json::from_slice::<serde_json::Value>(&response.body)
            .ok()
            .and_then(|v| {
                v.get("error")
                    .or_else(|| v.get("message"))
                    .and_then(|m| m.as_str().map(str::to_owned))
            })
            .unwrap_or_else(|| response.text());
        assert_eq!(
            response.status, case.status,
            "{} {}: {text}",
            case.method, case.target
        );
        assert!(
            text.contains(case.message),
            "{} {}: expected {:?} in {text}",
            case.method,
            case.target,
            case.message
        );
    }
    assert_eq!(get(store.addr, "/healthz").status, 200, "still serving");
    let metrics = get(store.addr, "/metrics").text();
    assert!(
        metrics.contains("kiln_rejected_requests_total{endpoint=\"ingest\",reason=\"bad_name\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grpc_push_gets_invalid_argument_and_oversized_messages_are_refused() {
    let store = StoreProcess::start(KILN_STORE, &["--max-request-bytes", "4096"]);
    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = PusherServiceClient::new(channel);
    let request = PushRequest::decode(
        push_body(&[("__name__", "process_cpu")], b"not pprof at all").as_slice(),
    )
    .expect("decode");
    let status = client.push(request).await.expect_err("bad pprof");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("invalid profile"),
        "{}",
        status.message()
    );
    let big =
        PushRequest::decode(push_body(&[("__name__", "process_cpu")], &[7u8; 10_000]).as_slice())
            .expect("decode");
    let status = client.push(big).await.expect_err("too big");
    assert!(
        status.message().contains("message length too large"),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_guard_writes_and_reads_when_configured() {
    // The write token from a file (as the operator mounts a Secret), the
    // read token from the environment: tokens are never flags (a flag shows in `/proc/*/cmdline` to every process on the host).
    let token_dir = tempfile::tempdir().expect("temp dir");
    let write_token_file = token_dir.path().join("write-token");
    std::fs::write(&write_token_file, "w-secret\n").expect("write token file");
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &[
            "--write-tokens-file",
            write_token_file.to_str().expect("utf-8 path"),
        ],
        &[("KILN_READ_TOKENS", "r-secret")],
    );
    let folded = b"main;work 3";
    let denied = http(store.addr, "POST", "/ingest?name=app", &[], folded).expect("ingest");
    assert_eq!(denied.status, 401, "{}", denied.text());
    assert!(
        denied
            .text()
            .contains("missing or invalid bearer token for writes")
    );
    let wrong = http(
        store.addr,
        "POST",
        "/ingest?name=app",
        &[("Authorization", "Bearer r-secret")],
        folded,
    )
    .expect("ingest");
    assert_eq!(wrong.status, 401, "a read token cannot write");
    let ok = http(
        store.addr,
        "POST",
        "/ingest?name=app",
        &[("Authorization", "Bearer w-secret")],
        folded,
    )
    .expect("ingest");
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(get(store.addr, "/api/v1/profile-types").status, 401);
    let read = http(
        store.addr,
        "GET",
        "/api/v1/profile-types",
        &[("Authorization", "Bearer r-secret")],
        b"",
    )
    .expect("query");
    assert_eq!(read.status, 200, "{}", read.text());
    assert_eq!(get(store.addr, "/metrics").status, 200, "metrics stay open");

    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = PusherServiceClient::new(channel);
    let status = client
        .push(PushRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
}

#[test]
fn overload_answers_429_instead_of_queueing() {
    let store = StoreProcess::start(KILN_STORE, &["--max-inflight", "1"]);
    // Hold the only slot: a request whose body never finishes arriving.
    let mut slow = TcpStream::connect(store.addr).expect("connect");
    slow.write_all(
        b"POST /ingest?name=app HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\nmain 1",
    )
    .expect("write");
    // Wait until the server reports the slot as taken (metrics are not
    // admission-controlled), so no probe races the slow request for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get(store.addr, "/metrics")
        .text()
        .contains("kiln_inflight_requests 1\n")
    {
        assert!(
            Instant::now() < deadline,
            "the slow request never took the slot"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let response = http(store.addr, "POST", "/ingest?name=app", &[], b"main 1").expect("ingest");
    assert_eq!(response.status, 429, "{}", response.text());
    assert!(
        response.text().contains("server overloaded"),
        "{}",
        response.text()
    );
    assert_eq!(response.header("retry-after"), Some("1"));
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response =
            http(store.addr, "POST", "/ingest?name=app", &[], b"main 1").expect("ingest");
        if response.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot never freed: {}",
            response.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Slowloris: a body that trickles holds its ingest slot only until the
/// body read timeout, then is refused with 408.
#[test]
fn a_body_that_does_not_arrive_within_the_body_read_timeout_gets_408() {
    let store = StoreProcess::start(KILN_STORE, &["--body-read-timeout", "1s"]);
    let mut slow = TcpStream::connect(store.addr).expect("connect");
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    slow.write_all(
        b"POST /ingest?name=app HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\nmain 1",
    )
    .expect("write");
    // Read until the reply's head and JSON body are in, or the server closes.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&reply).contains('}') {
        let read = slow
            .read(&mut chunk)
            .expect("a reply before the read timeout");
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&chunk[..read]);
    }
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("body_timeout"), "{reply}");
    let response = http(store.addr, "POST", "/ingest?name=app", &[], b"main 1").expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());
}
