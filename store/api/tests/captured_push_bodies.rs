//! The generated Push types decode what the real `pyroscope-io` 1.x client
//! sends, so the field numbers match: bodies it sends at test time to a
//! listener here, and, where present, the ones captured in
//! `../shared/testdata/clients`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;

use kiln_api::push::v1::PushRequest;
use prost::Message;

fn capture_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/clients/python-pyroscope-io-1.4.0");
    if dir.is_dir() {
        Some(dir)
    } else {
        let _ = writeln!(std::io::stderr(), "SKIPPED: {} is absent", dir.display());
        None
    }
}

fn decode_capture(dir: &std::path::Path, name: &str) -> PushRequest {
    decode_gzipped_push(&std::fs::read(dir.join(name)).expect("read the capture"))
}

fn decode_gzipped_push(gz: &[u8]) -> PushRequest {
    let mut body = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut body)
        .expect("the capture is gzipped");
    PushRequest::decode(body.as_slice()).expect("the capture is a PushRequest")
}

#[test]
fn python_client_push_decodes_to_labelled_series_with_pprof_samples() {
    let Some(dir) = capture_dir() else { return };
    let request = decode_capture(&dir, "push-cpu-001.body");
    assert_eq!(request.series.len(), 1);
    let series = &request.series[0];
    let label = |name: &str| {
        series
            .labels
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.value.as_str())
    };
    assert_eq!(label("__name__"), Some("process_cpu"));
    assert_eq!(label("service_name"), Some("fixture.python.app"));
    assert_eq!(
        label("otel.scope.name"),
        Some("com.grafana.pyroscope/python")
    );
    assert_eq!(series.samples.len(), 1);
    // Uncompressed pprof: field 1 (sample_type), length-delimited.
    assert_eq!(series.samples[0].raw_profile.first(), Some(&0x0a));
    assert_eq!(series.samples[0].id.len(), 36, "a UUID string");
}

#[test]
fn python_client_push_with_memory_carries_two_series() {
    let Some(dir) = capture_dir() else { return };
    let request = decode_capture(&dir, "push-cpu-mem-001.body");
    let mut names: Vec<&str> = request
        .series
        .iter()
        .flat_map(|s| s.labels.iter())
        .filter(|l| l.name == "__name__")
        .map(|l| l.value.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["memory", "process_cpu"]);
}

#[test]
fn write_raw_request_round_trips_through_protobuf() {
    use kiln_api::parca::profilestore::v1alpha1::{
        ExecutableInfo, Label, LabelSet, LoadSegment, RawProfileSeries, RawSample, WriteRawRequest,
    };
    let request = WriteRawRequest {
        series: vec![RawProfileSeries {
            labels: Some(LabelSet {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                }],
            }),
            samples: vec![RawSample {
                raw_profile: vec![0x1f, 0x8b],
                executable_info: vec![ExecutableInfo {
                    elf_type: 3,
                    load_segment: Some(LoadSegment {
                        offset: 0x1000,
                        vaddr: 0x401000,
                    }),
                }],
            }],
        }],
        normalized: true,
        ..Default::default()
    };
    let bytes = request.encode_to_vec();
    // series is field 2, length-delimited: tag byte 0x12.
    assert_eq!(bytes[0], 0x12);
    assert_eq!(
        WriteRawRequest::decode(bytes.as_slice()).expect("decodes"),
        request
    );
}

/// Answers HTTP/1.1 requests on one connection with an empty 200, sending
/// each request's path and body to `bodies`, until the client closes it.
fn serve_connection(stream: TcpStream, bodies: &mpsc::Sender<(String, Vec<u8>)>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("read a header");
            if header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().expect("a content-length number");
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("read the body");
        // Sent before answering: the client waits for the answer, so every
        // body is in the channel by the time the client exits.
        let _ = bodies.send((path, body));
        writer
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/proto\r\ncontent-length: 0\r\n\r\n",
            )
            .expect("answer");
    }
}

/// The same checks on what the client sends now, so they do not depend on
/// `../shared` being checked out (issue 13). The venv is created by
/// `./kiln-dev test` under `$KILN_TOOLS_DIR`.
#[test]
fn live_python_client_push_decodes_to_cpu_and_memory_series_with_pprof_samples() {
    let tools = std::env::var("KILN_TOOLS_DIR").unwrap_or_else(|_| "/var/tmp/kiln-tools".into());
    let python = PathBuf::from(tools).join("pyroscope-io-1/bin/python");
    if !python.is_file() {
        assert!(
            std::env::var("CI").is_err(),
            "{} is required in CI: ./kiln-dev test creates it",
            python.display()
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {} is absent; no live pyroscope-io Push body was checked",
            python.display()
        );
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let (sender, bodies) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            serve_connection(stream, &sender);
        }
    });
    let program =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pyroscope_push_app.py");
    let output = Command::new(&python)
        .arg(&program)
        .arg(&url)
        .arg("kiln.api.live.app")
        .arg("3")
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "the client program failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let requests: Vec<(String, Vec<u8>)> = bodies.try_iter().collect();
    assert!(!requests.is_empty(), "the client sent nothing");
    let mut cpu_series = 0;
    let mut memory_series = 0;
    for (path, body) in &requests {
        assert_eq!(path, "/push.v1.PusherService/Push");
        let request = decode_gzipped_push(body);
        for series in &request.series {
            let label = |name: &str| {
                series
                    .labels
                    .iter()
                    .find(|l| l.name == name)
                    .map(|l| l.value.as_str())
            };
            assert_eq!(label("service_name"), Some("kiln.api.live.app"));
            assert_eq!(label("env"), Some("ci"));
            assert_eq!(
                label("otel.scope.name"),
                Some("com.grafana.pyroscope/python")
            );
            match label("__name__") {
                Some("process_cpu") => cpu_series += 1,
                Some("memory") => memory_series += 1,
                other => panic!("an unexpected series name {other:?}"),
            }
            assert!(!series.samples.is_empty());
            for sample in &series.samples {
                // Uncompressed pprof: field 1 (sample_type), length-delimited.
                assert_eq!(sample.raw_profile.first(), Some(&0x0a));
                assert_eq!(sample.id.len(), 36, "a UUID string");
            }
        }
    }
    assert!(
        cpu_series > 0 && memory_series > 0,
        "cpu {cpu_series}, memory {memory_series}"
    );
}
