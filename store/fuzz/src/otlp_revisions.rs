//! OTLP profiles at every wire revision the store accepts, all the way in:
//! the bytes are decoded as each `v1development` layout, the layouts that
//! fit are compared, and the batch becomes checked pprof profiles that a
//! head ingests, as the store does with an export. The seeds are one
//! export per revision, each of which only that revision reads, so the
//! fuzzer starts inside every layout's decoder rather than only the one
//! its mutations happen to fit.

use kiln_api::kiln::otlp::{v1_8, v1_9, v1_10};
use kiln_api::opentelemetry::proto::common::v1::{AnyValue, KeyValue, any_value};
use kiln_api::opentelemetry::proto::resource::v1::Resource;
use kiln_engine::{Head, IngestLimits};
use kiln_pprof::DecodeLimits;
use kiln_store::config::Limits;
use kiln_store::ingest::otlp::model::uploads_from_batch;
use kiln_store::ingest::otlp::{OtlpLimits, decode_export};
use prost::Message;

use crate::NOW_MS;

/// Runs the target on `data`.
pub fn otlp_revisions(data: &[u8]) {
    let limits = OtlpLimits::default();
    let export = match decode_export(data, &limits) {
        Ok(export) => export,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            assert!(!error.reason().is_empty());
            return;
        }
    };
    assert!(
        !export.revisions.is_empty(),
        "an accepted export names the revisions that read it"
    );
    let uploads = match uploads_from_batch(
        &export.batch,
        &Limits::default(),
        &limits,
        &DecodeLimits::default(),
        &mut |_| Ok(()),
    ) {
        Ok(uploads) => uploads,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let mut head = Head::new();
    for upload in uploads {
        match upload {
            Ok(upload) => {
                let Some(decoded) = upload.decoded.as_ref() else {
                    panic!("an OTLP upload is handed over decoded");
                };
                let ingested = head.ingest(
                    decoded,
                    &upload.labels,
                    upload.time_ms.unwrap_or(NOW_MS),
                    upload.duration_nanos.unwrap_or(0),
                    &IngestLimits::default(),
                );
                if let Err(error) = ingested {
                    assert!(!error.to_string().is_empty());
                }
            }
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
}

/// One export per revision: the checked-in 1.7 body, and 1.8, 1.9 and
/// 1.10 bodies built here, each set apart by the fields its layout alone
/// reads (1.8's `profile_id` in field 8, 1.9's `dropped_attributes_count`
/// there, 1.10's renumbered sample values).
pub fn seeds() -> Vec<Vec<u8>> {
    let time = NOW_MS as u64 * 1_000_000;
    let v1_8 = v1_8::ExportRequest {
        dictionary: Some(dictionary()),
        resource_profiles: vec![v1_8::ResourceProfiles {
            resource: Some(resource()),
            scope_profiles: vec![v1_8::ScopeProfiles {
                profiles: vec![v1_8::Profile {
                    sample_type: value_type(),
                    sample: samples_v1_8(),
                    time_unix_nano: time,
                    duration_nano: 10_000_000_000,
                    period_type: value_type(),
                    period: 10_000_000,
                    profile_id: vec![9; 16],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let v1_9 = v1_9::ExportRequest {
        dictionary: Some(dictionary()),
        resource_profiles: vec![v1_9::ResourceProfiles {
            resource: Some(resource()),
            scope_profiles: vec![v1_9::ScopeProfiles {
                profiles: vec![v1_9::Profile {
                    sample_type: value_type(),
                    samples: samples_v1_8(),
                    time_unix_nano: time,
                    duration_nano: 10_000_000_000,
                    period_type: value_type(),
                    period: 10_000_000,
                    dropped_attributes_count: 2,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let samples_v1_10 = samples_v1_8()
        .into_iter()
        .map(|s| v1_10::Sample {
            stack_index: s.stack_index,
            attribute_indices: s.attribute_indices,
            values: s.values,
            ..Default::default()
        })
        .collect();
    let v1_10 = v1_10::ExportRequest {
        dictionary: Some(dictionary()),
        resource_profiles: vec![v1_10::ResourceProfiles {
            resource: Some(resource()),
            scope_profiles: vec![v1_10::ScopeProfiles {
                profiles: vec![v1_10::Profile {
                    sample_type: value_type(),
                    samples: samples_v1_10,
                    time_unix_nano: time,
                    duration_nano: 10_000_000_000,
                    period_type: value_type(),
                    period: 10_000_000,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    vec![
        include_bytes!("../../tests/fixtures/otlp/v1_7.bin").to_vec(),
        v1_8.encode_to_vec(),
        v1_9.encode_to_vec(),
        v1_10.encode_to_vec(),
    ]
}

/// The strings the dictionary indexes.
const STRINGS: [&str; 10] = [
    "",
    "cpu",
    "nanoseconds",
    "main",
    "serve",
    "parse",
    "inlined_helper",
    "app.go",
    "thread.name",
    "worker-1",
];

/// The 1.8+ dictionary (1.9 and 1.10 share it): stack 1 is
/// `parse <- serve <- main`, stack 2 `inlined_helper+serve <- main`.
fn dictionary() -> v1_8::ProfilesDictionary {
    let function = |name: i32| v1_8::Function {
        name_strindex: name,
        filename_strindex: 7,
        start_line: i64::from(name),
        ..Default::default()
    };
    let line = |function_index: i32| v1_8::Line {
        function_index,
        line: 10 + i64::from(function_index),
        column: 0,
    };
    let location = |lines: Vec<v1_8::Line>| v1_8::Location {
        mapping_index: 1,
        address: 0x1000,
        lines,
        ..Default::default()
    };
    v1_8::ProfilesDictionary {
        mapping_table: vec![
            v1_8::Mapping::default(),
            v1_8::Mapping {
                memory_start: 0x1000,
                memory_limit: 0x9000,
                filename_strindex: 7,
                ..Default::default()
            },
        ],
        location_table: vec![
            v1_8::Location::default(),
            location(vec![line(1)]),
            location(vec![line(2)]),
            location(vec![line(3)]),
            location(vec![line(4), line(2)]),
        ],
        function_table: vec![
            v1_8::Function::default(),
            function(3),
            function(4),
            function(5),
            function(6),
        ],
        string_table: STRINGS.iter().map(|s| (*s).to_owned()).collect(),
        attribute_table: vec![
            v1_8::KeyValueAndUnit::default(),
            v1_8::KeyValueAndUnit {
                key_strindex: 8,
                value: Some(text("worker-1")),
                unit_strindex: 0,
            },
        ],
        stack_table: vec![
            v1_8::Stack::default(),
            v1_8::Stack {
                location_indices: vec![3, 2, 1],
            },
            v1_8::Stack {
                location_indices: vec![4, 1],
            },
        ],
        ..Default::default()
    }
}

fn value_type() -> Option<v1_8::ValueType> {
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
            attribute_indices: vec![1],
            ..Default::default()
        },
        v1_8::Sample {
            stack_index: 2,
            values: vec![10_000_000],
            ..Default::default()
        },
    ]
}

fn text(value: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(value.to_owned())),
    }
}

fn resource() -> Resource {
    let attribute = |key: &str, value: &str| KeyValue {
        key: key.to_owned(),
        value: Some(text(value)),
        ..Default::default()
    };
    Resource {
        attributes: vec![
            attribute("service.name", "fuzz"),
            attribute("k8s.namespace.name", "shop"),
        ],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use kiln_store::ingest::otlp::Revision;

    use super::*;

    #[test]
    fn each_seed_is_read_by_its_own_revision_and_ingests() {
        let expected = [
            vec![Revision::V1_7],
            vec![Revision::V1_8],
            vec![Revision::V1_9],
            vec![Revision::V1_10],
        ];
        for (seed, revisions) in seeds().iter().zip(expected) {
            let export = decode_export(seed, &OtlpLimits::default());
            let Ok(export) = export else {
                panic!("{revisions:?}: {:?}", export.err());
            };
            assert_eq!(export.revisions, revisions);
            let uploads = uploads_from_batch(
                &export.batch,
                &Limits::default(),
                &OtlpLimits::default(),
                &DecodeLimits::default(),
                &mut |_| Ok(()),
            );
            let Ok(uploads) = uploads else {
                panic!("{revisions:?}: {:?}", uploads.err());
            };
            assert!(!uploads.is_empty());
            assert!(uploads.iter().all(Result::is_ok), "{revisions:?}");
        }
    }
}
