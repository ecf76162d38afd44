//! Decoding every layout: what each reads, and what each refuses.

use super::*;
use kiln_api::opentelemetry::proto::resource::v1::Resource;

fn text_attribute(key: i32, value: &str) -> v1_8::KeyValueAndUnit {
    v1_8::KeyValueAndUnit {
        key_strindex: key,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        unit_strindex: 0,
    }
}

/// One profile with the given 1.10 samples over a one-frame stack.
fn request_v1_10(samples: Vec<v1_10::Sample>) -> Vec<u8> {
    let dictionary = v1_8::ProfilesDictionary {
        string_table: vec![
            "".into(),
            "samples".into(),
            "count".into(),
            "f".into(),
            "thread.name".into(),
        ],
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
                    line: 0,
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
        attribute_table: vec![
            v1_8::KeyValueAndUnit::default(),
            text_attribute(4, "worker"),
        ],
        ..Default::default()
    };
    let vt = Some(v1_8::ValueType {
        type_strindex: 1,
        unit_strindex: 2,
        aggregation_temporality: 0,
    });
    v1_10::ExportRequest {
        dictionary: Some(dictionary),
        resource_profiles: vec![v1_10::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: String::new(),
                    key_strindex: 4,
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValueStrindex(3)),
                    }),
                }],
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![v1_10::ScopeProfiles {
                profiles: vec![v1_10::Profile {
                    sample_type: vt,
                    samples,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[test]
fn timestamp_only_samples_read_the_same_in_1_8_to_1_11() {
    // What profile-bee sends: stack index and timestamps, nothing else.
    let body = request_v1_10(vec![v1_10::Sample {
        stack_index: 1,
        timestamps_unix_nano: vec![1, 2, 3],
        ..Default::default()
    }]);
    let decoded = decode_export(&body, &OtlpLimits::default()).unwrap();
    assert_eq!(
        decoded.revisions,
        vec![Revision::V1_8, Revision::V1_9, Revision::V1_10]
    );
    assert_eq!(decoded.revision_label(), "1.8+1.9+1.10-1.11");
    let profile = &decoded.batch.resources[0].scopes[0].profiles[0];
    assert_eq!(profile.samples[0].values, vec![3]);
    // 1.10 string-table references in resource attributes are resolved.
    let attribute = &decoded.batch.resources[0].attributes[0];
    assert_eq!(attribute.key, "thread.name");
    assert_eq!(attribute.value, AttributeValue::Text("f".into()));
}

#[test]
fn values_in_field_4_are_only_1_10() {
    let body = request_v1_10(vec![v1_10::Sample {
        stack_index: 1,
        values: vec![5],
        attribute_indices: vec![1],
        ..Default::default()
    }]);
    let decoded = decode_export(&body, &OtlpLimits::default()).unwrap();
    assert_eq!(decoded.revisions, vec![Revision::V1_10]);
    let sample = &decoded.batch.resources[0].scopes[0].profiles[0].samples[0];
    assert_eq!(
        (sample.values.clone(), sample.attributes.clone()),
        (vec![5], vec![1])
    );
}

#[test]
fn a_body_two_layouts_read_differently_is_refused_as_ambiguous() {
    // 1.10 reads field 2 as attribute indices and counts the one
    // timestamp; 1.8 and 1.9 read field 2 as the value 1 with no
    // attributes. Same total, different samples: refuse to guess.
    let body = request_v1_10(vec![v1_10::Sample {
        stack_index: 1,
        attribute_indices: vec![1],
        timestamps_unix_nano: vec![9],
        ..Default::default()
    }]);
    let err = decode_export(&body, &OtlpLimits::default()).unwrap_err();
    assert_eq!(err.reason(), "otlp_ambiguous", "{err}");
    assert!(err.to_string().contains("1.8, 1.9, 1.10-1.11"), "{err}");
}

#[test]
fn an_index_outside_its_table_names_the_field() {
    let body = request_v1_10(vec![v1_10::Sample {
        stack_index: 1,
        values: vec![1],
        attribute_indices: vec![7],
        ..Default::default()
    }]);
    let err = decode_export(&body, &OtlpLimits::default()).unwrap_err();
    assert_eq!(
        err,
        OtlpError::IndexOutOfRange {
            field: "sample.attribute_indices",
            index: 7,
            table: "attribute_table",
            len: 2
        }
    );
}

/// A 1.8 request whose one stack holds `depth` zero indices, referred
/// to by `samples` samples.
fn deep_stack_request(depth: usize, samples: usize) -> Vec<u8> {
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

#[test]
fn a_stack_deeper_than_the_store_keeps_is_refused_before_anything_is_reserved() {
    let body = deep_stack_request(100_000, 200);
    let mut reserved = 0usize;
    let err = decode_export_reserving(&body, &OtlpLimits::default(), |bytes| {
        reserved += bytes;
        Ok::<(), ()>(())
    })
    .unwrap()
    .unwrap_err();
    assert_eq!(err.reason(), "otlp_stack_too_deep", "{err}");
    // Only 1.7 reads the body without a stack table, and reserves its
    // small decoded form; none reserves a copy per sample.
    assert!(reserved < 2 * body.len() + (1 << 16), "{reserved}");
    let limits = OtlpLimits::default();
    let at_limit = deep_stack_request(limits.max_stack_depth, 2);
    let decoded = decode_export(&at_limit, &limits).unwrap();
    let samples = &decoded.batch.resources[0].scopes[0].profiles[0].samples;
    assert_eq!(
        decoded.batch.dictionary.stack_locations.len(),
        limits.max_stack_depth
    );
    assert_eq!(
        decoded.batch.dictionary.stack(&samples[1]).len(),
        limits.max_stack_depth
    );
}

#[test]
fn a_refused_reservation_stops_before_decoding() {
    let body = request_v1_10(vec![v1_10::Sample {
        stack_index: 1,
        values: vec![5],
        ..Default::default()
    }]);
    let refused = decode_export_reserving(&body, &OtlpLimits::default(), |_| Err("busy"));
    assert_eq!(refused.err(), Some("busy"));
}

#[test]
fn samples_over_the_limit_are_refused_per_profile() {
    let body = deep_stack_request(1, 5);
    let limits = OtlpLimits {
        max_samples: 4,
        ..OtlpLimits::default()
    };
    let err = decode_export(&body, &limits).unwrap_err();
    assert_eq!(err.reason(), "otlp_too_many", "{err}");
}

/// Issue 51: a native frame the OpenTelemetry eBPF profiler sends is a
/// location with a mapping and no lines; the mapping's GNU build id
/// (`process.executable.build_id.gnu`) is kept so the store can name the
/// frame at query time. Other attributes, other keys and values that are
/// not hex name no build id.
#[test]
fn a_mappings_gnu_build_id_attribute_is_kept_for_symbolization() {
    let dictionary = v1_8::ProfilesDictionary {
        string_table: vec![
            "".into(),
            "samples".into(),
            "count".into(),
            "/usr/bin/xz".into(),
            "process.executable.build_id.gnu".into(),
            "process.executable.build_id.htlhash".into(),
        ],
        mapping_table: vec![
            v1_8::Mapping::default(),
            v1_8::Mapping {
                memory_start: 0x5555_0000_1000,
                memory_limit: 0x5555_0002_0000,
                file_offset: 0x1000,
                filename_strindex: 3,
                attribute_indices: vec![2, 1, 99],
            },
            v1_8::Mapping {
                filename_strindex: 3,
                attribute_indices: vec![3],
                ..Default::default()
            },
        ],
        location_table: vec![
            v1_8::Location::default(),
            v1_8::Location {
                mapping_index: 1,
                address: 0x5555_0000_1234,
                ..Default::default()
            },
        ],
        stack_table: vec![
            v1_8::Stack::default(),
            v1_8::Stack {
                location_indices: vec![1],
            },
        ],
        attribute_table: vec![
            v1_8::KeyValueAndUnit::default(),
            text_attribute(4, "ABB9E2D567CA6567D52511A241FBDB6B20F61AE5"),
            text_attribute(5, "0123456789abcdef0123456789abcdef"),
            text_attribute(4, "not hex"),
        ],
        ..Default::default()
    };
    let body = v1_10::ExportRequest {
        dictionary: Some(dictionary),
        resource_profiles: vec![v1_10::ResourceProfiles {
            scope_profiles: vec![v1_10::ScopeProfiles {
                profiles: vec![v1_10::Profile {
                    sample_type: Some(v1_8::ValueType {
                        type_strindex: 1,
                        unit_strindex: 2,
                        aggregation_temporality: 0,
                    }),
                    samples: vec![v1_10::Sample {
                        stack_index: 1,
                        values: vec![5],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec();
    let decoded = decode_export(&body, &OtlpLimits::default()).unwrap();
    let mappings = &decoded.batch.dictionary.mappings;
    assert_eq!(
        mappings[1].build_id,
        "abb9e2d567ca6567d52511a241fbdb6b20f61ae5"
    );
    assert_eq!(mappings[2].build_id, "", "a value that is not hex");
    assert!(decoded.batch.dictionary.locations[1].lines.is_empty());
}
