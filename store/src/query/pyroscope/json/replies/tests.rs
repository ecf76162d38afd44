use serde_json::{Value, json};

use super::*;

fn parsed(bytes: Result<Vec<u8>, ApiError>) -> Value {
    serde_json::from_slice(&bytes.unwrap()).unwrap()
}

#[test]
fn replies_keep_protobuf_json_names_and_int64_strings() {
    let graph = q::SelectMergeStacktracesResponse {
        flamegraph: Some(q::FlameGraph {
            names: vec!["total".to_owned(), "main".to_owned()],
            levels: vec![q::Level {
                values: vec![0, 45, 0, 0],
            }],
            total: 45,
            max_self: 30,
        }),
        tree: Vec::new(),
    };
    assert_eq!(
        parsed(select_merge_stacktraces_response(&graph)),
        json!({"flamegraph": {"names": ["total", "main"],
            "levels": [{"values": ["0", "45", "0", "0"]}], "total": "45", "maxSelf": "30"}})
    );
    let diff = q::DiffResponse {
        flamegraph: Some(q::FlameGraphDiff {
            left_ticks: 5,
            right_ticks: 40,
            ..Default::default()
        }),
    };
    let diff = parsed(diff_response(&diff));
    assert_eq!(diff["flamegraph"]["leftTicks"], "5");
    assert_eq!(diff["flamegraph"]["rightTicks"], "40");
    let series = q::SelectSeriesResponse {
        series: vec![t::Series {
            labels: vec![t::LabelPair {
                name: "env".to_owned(),
                value: "prod".to_owned(),
            }],
            points: vec![
                t::Point {
                    value: 1.5,
                    timestamp: 1_700_000_000_000,
                    exemplars: vec![],
                },
                t::Point {
                    value: 2.0,
                    timestamp: 1_700_000_010_000,
                    exemplars: vec![t::Exemplar {
                        timestamp: 1_700_000_012_345,
                        profile_id: "018bcfe5-6839-7000-8000-000000000400".to_owned(),
                        span_id: String::new(),
                        value: 2,
                        labels: vec![t::LabelPair {
                            name: "pod".to_owned(),
                            value: "a".to_owned(),
                        }],
                    }],
                },
            ],
        }],
    };
    assert_eq!(
        parsed(select_series_response(&series)),
        json!({"series": [{"labels": [{"name": "env", "value": "prod"}],
            "points": [{"value": 1.5, "timestamp": "1700000000000"},
                {"value": 2.0, "timestamp": "1700000010000",
                 "exemplars": [{"timestamp": "1700000012345",
                    "profileId": "018bcfe5-6839-7000-8000-000000000400",
                    "value": "2", "labels": [{"name": "pod", "value": "a"}]}]}]}]})
    );
    let types = q::ProfileTypesResponse {
        profile_types: vec![t::ProfileType {
            id: "a:b:c:d:e".to_owned(),
            name: "a".to_owned(),
            ..Default::default()
        }],
    };
    let types = parsed(profile_types_response(&types));
    assert_eq!(types["profileTypes"][0]["ID"], "a:b:c:d:e");
    assert_eq!(types["profileTypes"][0]["sampleType"], "");
    let stats = parsed(profile_stats_response(&t::GetProfileStatsResponse {
        data_ingested: true,
        oldest_profile_time: 1,
        newest_profile_time: 2,
    }));
    assert_eq!(
        stats,
        json!({"dataIngested": true, "oldestProfileTime": "1", "newestProfileTime": "2"})
    );
    assert_eq!(
        parsed(names_response(&["a".to_owned()])),
        json!({"names": ["a"]})
    );
}

#[test]
fn pprof_replies_write_every_table() {
    let profile = pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        sample: vec![pprof::Sample {
            location_id: vec![1],
            value: vec![7],
            label: Vec::new(),
        }],
        string_table: vec![Vec::new(), b"cpu".to_vec(), b"nanoseconds".to_vec()],
        period: 10,
        ..Default::default()
    };
    let reply = parsed(pprof_response(&profile));
    assert_eq!(reply["sampleType"], json!([{"type": "1", "unit": "2"}]));
    assert_eq!(
        reply["sample"],
        json!([{"locationId": ["1"], "value": ["7"], "label": []}])
    );
    assert_eq!(reply["stringTable"][1], "cpu");
    assert_eq!(reply["period"], "10");
    assert_eq!(reply["periodType"], Value::Null);
}
