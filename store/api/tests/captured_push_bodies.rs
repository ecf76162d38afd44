//! The generated Push types decode what the real `pyroscope-io` 1.x client
//! sends, so the field numbers match: bodies it sends at test time to a
//! listener here, and, where present, the ones captured in
//! `../shared/testdata/clients`.

use std::io::Read;
use std::path::PathBuf;
use std::process::Command;

use kiln_api::push::v1::PushRequest;
use kiln_testkit::fixtures::shared_testdata;
use kiln_testkit::recorder::Recorder;
use kiln_testkit::tools::venv_python;
use prost::Message;

fn capture_dir() -> Option<PathBuf> {
    shared_testdata("clients/python-pyroscope-io-1.4.0")
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

/// The same checks on what the client sends now, so they do not depend on
/// `../shared` being checked out (issue 13). The venv is created by
/// `./kiln-dev test` under `$KILN_TOOLS_DIR`.
#[test]
fn live_python_client_push_decodes_to_cpu_and_memory_series_with_pprof_samples() {
    let Some(python) = venv_python("pyroscope-io-1") else {
        return;
    };
    let recorder = Recorder::start();
    let program =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pyroscope_push_app.py");
    let output = Command::new(&python)
        .arg(&program)
        .arg(recorder.url())
        .arg("kiln.api.live.app")
        .arg("3")
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "the client program failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let requests = recorder.requests();
    assert!(!requests.is_empty(), "the client sent nothing");
    let mut cpu_series = 0;
    let mut memory_series = 0;
    let mut requests_with_both = 0;
    for recorded in &requests {
        assert_eq!(recorded.target, "/push.v1.PusherService/Push");
        let request = decode_gzipped_push(&recorded.body);
        // As push-cpu-mem-001 in ../shared: one request carries both series.
        let mut names: Vec<&str> = request
            .series
            .iter()
            .flat_map(|s| &s.labels)
            .filter(|l| l.name == "__name__")
            .map(|l| l.value.as_str())
            .collect();
        names.sort_unstable();
        requests_with_both += usize::from(names == ["memory", "process_cpu"]);
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
    assert!(
        requests_with_both > 0,
        "no request carried the memory and CPU series together"
    );
}
