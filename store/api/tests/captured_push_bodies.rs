//! The generated Push types decode what the real `pyroscope-io` 1.4.0 client
//! sent (captured in `../shared/testdata/clients`), so the field numbers match.

use std::io::{Read, Write};
use std::path::PathBuf;

use kiln_api::push::v1::PushRequest;
use prost::Message;

fn capture_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/testdata/clients/python-pyroscope-io-1.4.0");
    if dir.is_dir() {
        Some(dir)
    } else {
        let _ = writeln!(std::io::stderr(), "skipping: {} is absent", dir.display());
        None
    }
}

fn decode_capture(dir: &std::path::Path, name: &str) -> PushRequest {
    let gz = std::fs::read(dir.join(name)).expect("read the capture");
    let mut body = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
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
