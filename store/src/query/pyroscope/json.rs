//! Connect JSON for the querier messages: protobuf JSON names
//! (lowerCamelCase, original names accepted too), int64 as strings or
//! numbers on input and strings on output, enums by name or number.

use kiln_api::querier::v1 as q;
use kiln_api::types::v1 as t;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// A JSON object being read as one request message.
struct Object<'a> {
    message: &'static str,
    map: &'a Map<String, Value>,
}

impl<'a> Object<'a> {
    fn parse(message: &'static str, value: &'a Value) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self { message, map }),
            _ => Err(bad(message, "the body must be a JSON object".to_owned())),
        }
    }

    /// The value of the first of `names` present and not null.
    fn get(&self, names: &[&str]) -> Option<&'a Value> {
        names
            .iter()
            .find_map(|n| self.map.get(*n).filter(|v| !v.is_null()))
    }

    fn int64(&self, names: &[&str]) -> Result<Option<i64>, ApiError> {
        let Some(value) = self.get(names) else {
            return Ok(None);
        };
        let parsed = match value {
            Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
            Value::String(s) => s.trim().parse::<i64>().ok(),
            _ => None,
        };
        parsed
            .map(Some)
            .ok_or_else(|| bad(self.message, format!("`{}` must be an integer", names[0])))
    }

    fn double(&self, names: &[&str]) -> Result<f64, ApiError> {
        match self.get(names) {
            None => Ok(0.0),
            Some(Value::Number(n)) => Ok(n.as_f64().unwrap_or(0.0)),
            Some(Value::String(s)) => s
                .trim()
                .parse::<f64>()
                .map_err(|_| bad(self.message, format!("`{}` must be a number", names[0]))),
            Some(_) => Err(bad(
                self.message,
                format!("`{}` must be a number", names[0]),
            )),
        }
    }

    fn string(&self, names: &[&str]) -> Result<String, ApiError> {
        match self.get(names) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(bad(
                self.message,
                format!("`{}` must be a string", names[0]),
            )),
        }
    }

    fn strings(&self, names: &[&str]) -> Result<Vec<String>, ApiError> {
        match self.get(names) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_str().map(str::to_owned).ok_or_else(|| {
                        bad(self.message, format!("`{}` must hold strings", names[0]))
                    })
                })
                .collect(),
            Some(_) => Err(bad(self.message, format!("`{}` must be a list", names[0]))),
        }
    }

    /// An enum given by name (from `variants`) or by number.
    fn enumeration(
        &self,
        names: &[&str],
        variants: &[(&str, i32)],
    ) -> Result<Option<i32>, ApiError> {
        match self.get(names) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    bad(
                        self.message,
                        format!("`{}` is not a valid enum number", names[0]),
                    )
                }),
            Some(Value::String(s)) => variants
                .iter()
                .find(|(name, _)| name == s)
                .map(|(_, number)| Some(*number))
                .ok_or_else(|| {
                    bad(
                        self.message,
                        format!("`{}` has unknown value {s:?}", names[0]),
                    )
                }),
            Some(_) => Err(bad(
                self.message,
                format!("`{}` must be an enum name", names[0]),
            )),
        }
    }

    /// True when a stack trace selector with content is present.
    fn has_stack_trace_selector(&self) -> bool {
        self.get(&["stackTraceSelector", "stack_trace_selector"])
            .is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty()))
    }
}

fn bad(message_type: &'static str, message: String) -> ApiError {
    ApiError::BadMessage {
        message_type,
        message,
    }
}

/// Parses a JSON body.
pub fn parse_body(body: &[u8], message: &'static str) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_slice(body).map_err(|e| bad(message, e.to_string()))
}

/// `querier.v1.ProfileTypesRequest`.
pub fn profile_types_request(v: &Value) -> Result<q::ProfileTypesRequest, ApiError> {
    let o = Object::parse("querier.v1.ProfileTypesRequest JSON", v)?;
    Ok(q::ProfileTypesRequest {
        start: o.int64(&["start"])?.unwrap_or(0),
        end: o.int64(&["end"])?.unwrap_or(0),
    })
}

/// `types.v1.LabelNamesRequest`.
pub fn label_names_request(v: &Value) -> Result<t::LabelNamesRequest, ApiError> {
    let o = Object::parse("types.v1.LabelNamesRequest JSON", v)?;
    Ok(t::LabelNamesRequest {
        matchers: o.strings(&["matchers"])?,
        start: o.int64(&["start"])?.unwrap_or(0),
        end: o.int64(&["end"])?.unwrap_or(0),
    })
}

/// `types.v1.LabelValuesRequest`.
pub fn label_values_request(v: &Value) -> Result<t::LabelValuesRequest, ApiError> {
    let o = Object::parse("types.v1.LabelValuesRequest JSON", v)?;
    Ok(t::LabelValuesRequest {
        name: o.string(&["name"])?,
        matchers: o.strings(&["matchers"])?,
        start: o.int64(&["start"])?.unwrap_or(0),
        end: o.int64(&["end"])?.unwrap_or(0),
    })
}

/// `querier.v1.SeriesRequest`.
pub fn series_request(v: &Value) -> Result<q::SeriesRequest, ApiError> {
    let o = Object::parse("querier.v1.SeriesRequest JSON", v)?;
    Ok(q::SeriesRequest {
        matchers: o.strings(&["matchers"])?,
        label_names: o.strings(&["labelNames", "label_names"])?,
        start: o.int64(&["start"])?.unwrap_or(0),
        end: o.int64(&["end"])?.unwrap_or(0),
    })
}

const FORMATS: [(&str, i32); 3] = [
    ("PROFILE_FORMAT_UNSPECIFIED", 0),
    ("PROFILE_FORMAT_FLAMEGRAPH", 1),
    ("PROFILE_FORMAT_TREE", 2),
];

/// A present, non-empty stack trace selector (Kiln refuses those).
fn selector_marker(o: &Object<'_>) -> Option<t::StackTraceSelector> {
    o.has_stack_trace_selector().then(|| t::StackTraceSelector {
        call_site: vec![t::Location {
            name: "(set)".to_owned(),
        }],
        go_pgo: None,
    })
}

/// `querier.v1.SelectMergeStacktracesRequest`.
pub fn select_merge_stacktraces_request(
    v: &Value,
) -> Result<q::SelectMergeStacktracesRequest, ApiError> {
    let o = Object::parse("querier.v1.SelectMergeStacktracesRequest JSON", v)?;
    Ok(q::SelectMergeStacktracesRequest {
        profile_type_id: o.string(&["profileTypeID", "profile_typeID"])?,
        label_selector: o.string(&["labelSelector", "label_selector"])?,
        start: o.int64(&["start"])?.unwrap_or(0),
        end: o.int64(&["end"])?.unwrap_or(0),
        max_nodes: o.int64(&["maxNodes", "max_nodes"])?,
        format: o.enumeration(&["format"], &FORMATS)?.unwrap_or(0),
        stack_trace_selector: selector_marker(&o),
    })
}

/// `querier.v1.SelectMergeProfileRequest`.
pub fn select_merge_profile_request(v: &Value) -> Result<q::SelectMergeProfileRequest, ApiError> {
    let o = Object::parse("querier.v1.SelectMergeProfileRequest JSON", v)?;
    Ok(q::SelectMergeProfileRequest {
        profile_type_id: o.string(&["profileTypeID", "profile_typeID"])?,
        label_selector: o.string(&["labelSelector", "label_selector"])?,
        start: o.int64(&["start"])?.unwrap_or(0),
        end: o.int64(&["end"])?.unwrap_or(0),
        max_nodes: o.int64(&["maxNodes", "max_nodes"])?,
        stack_trace_selector: selector_marker(&o),
    })
}

/// `querier.v1.SelectSeriesRequest`.
pub fn select_series_request(v: &Value) -> Result<q::SelectSeriesRequest, ApiError> {
    let o = Object::parse("querier.v1.SelectSeriesRequest JSON", v)?;
    Ok(q::SelectSeriesRequest {
        profile_type_id: o.string(&["profileTypeID", "profile_typeID"])?,
        label_selector: o.string(&["labelSelector", "label_selector"])?,
        start: o.int64(&["start"])?.unwrap_or(0),
        end: o.int64(&["end"])?.unwrap_or(0),
        group_by: o.strings(&["groupBy", "group_by"])?,
        step: o.double(&["step"])?,
        aggregation: o.enumeration(
            &["aggregation"],
            &[
                ("TIME_SERIES_AGGREGATION_TYPE_SUM", 0),
                ("TIME_SERIES_AGGREGATION_TYPE_AVERAGE", 1),
            ],
        )?,
        stack_trace_selector: selector_marker(&o),
        limit: o.int64(&["limit"])?,
    })
}

/// `querier.v1.DiffRequest`.
pub fn diff_request(v: &Value) -> Result<q::DiffRequest, ApiError> {
    let o = Object::parse("querier.v1.DiffRequest JSON", v)?;
    let side = |name: &str| -> Result<Option<q::SelectMergeStacktracesRequest>, ApiError> {
        o.get(&[name])
            .map(select_merge_stacktraces_request)
            .transpose()
    };
    Ok(q::DiffRequest {
        left: side("left")?,
        right: side("right")?,
    })
}

fn pairs(labels: &[t::LabelPair]) -> Value {
    Value::Array(
        labels
            .iter()
            .map(|l| json!({ "name": l.name, "value": l.value }))
            .collect(),
    )
}

fn levels(levels: &[q::Level]) -> Value {
    Value::Array(
        levels
            .iter()
            .map(|l| json!({ "values": l.values.iter().map(ToString::to_string).collect::<Vec<_>>() }))
            .collect(),
    )
}

/// `querier.v1.ProfileTypesResponse`.
pub fn profile_types_response(r: &q::ProfileTypesResponse) -> Value {
    let types: Vec<Value> = r
        .profile_types
        .iter()
        .map(|p| {
            json!({
                "ID": p.id, "name": p.name, "sampleType": p.sample_type,
                "sampleUnit": p.sample_unit, "periodType": p.period_type, "periodUnit": p.period_unit,
            })
        })
        .collect();
    json!({ "profileTypes": types })
}

/// `types.v1.LabelNamesResponse` and `LabelValuesResponse`.
pub fn names_response(names: &[String]) -> Value {
    json!({ "names": names })
}

/// `querier.v1.SeriesResponse`.
pub fn series_response(r: &q::SeriesResponse) -> Value {
    let sets: Vec<Value> = r
        .labels_set
        .iter()
        .map(|s| json!({ "labels": pairs(&s.labels) }))
        .collect();
    json!({ "labelsSet": sets })
}

/// `querier.v1.SelectMergeStacktracesResponse`.
pub fn select_merge_stacktraces_response(r: &q::SelectMergeStacktracesResponse) -> Value {
    let graph = r.flamegraph.clone().unwrap_or_default();
    json!({ "flamegraph": {
        "names": graph.names, "levels": levels(&graph.levels),
        "total": graph.total.to_string(), "maxSelf": graph.max_self.to_string(),
    }})
}

/// `querier.v1.DiffResponse`.
pub fn diff_response(r: &q::DiffResponse) -> Value {
    let graph = r.flamegraph.clone().unwrap_or_default();
    json!({ "flamegraph": {
        "names": graph.names, "levels": levels(&graph.levels),
        "total": graph.total.to_string(), "maxSelf": graph.max_self.to_string(),
        "leftTicks": graph.left_ticks.to_string(), "rightTicks": graph.right_ticks.to_string(),
    }})
}

/// `querier.v1.SelectSeriesResponse`.
pub fn select_series_response(r: &q::SelectSeriesResponse) -> Value {
    let series: Vec<Value> = r
        .series
        .iter()
        .map(|s| {
            let points: Vec<Value> = s
                .points
                .iter()
                .map(|p| json!({ "value": p.value, "timestamp": p.timestamp.to_string() }))
                .collect();
            json!({ "labels": pairs(&s.labels), "points": points })
        })
        .collect();
    json!({ "series": series })
}

/// `types.v1.GetProfileStatsResponse`.
pub fn profile_stats_response(r: &t::GetProfileStatsResponse) -> Value {
    json!({
        "dataIngested": r.data_ingested,
        "oldestProfileTime": r.oldest_profile_time.to_string(),
        "newestProfileTime": r.newest_profile_time.to_string(),
    })
}

/// `google.v1.Profile` (pprof) in protobuf JSON.
pub fn pprof_response(p: &kiln_pprof::proto::Profile) -> Value {
    let ints = |v: &[i64]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    let uints = |v: &[u64]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    let value_type = |v: &kiln_pprof::proto::ValueType| json!({ "type": v.r#type.to_string(), "unit": v.unit.to_string() });
    json!({
        "sampleType": p.sample_type.iter().map(value_type).collect::<Vec<_>>(),
        "sample": p.sample.iter().map(|s| json!({
            "locationId": uints(&s.location_id),
            "value": ints(&s.value),
            "label": s.label.iter().map(|l| json!({
                "key": l.key.to_string(), "str": l.str.to_string(),
                "num": l.num.to_string(), "numUnit": l.num_unit.to_string(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "mapping": p.mapping.iter().map(|m| json!({
            "id": m.id.to_string(), "memoryStart": m.memory_start.to_string(),
            "memoryLimit": m.memory_limit.to_string(), "fileOffset": m.file_offset.to_string(),
            "filename": m.filename.to_string(), "buildId": m.build_id.to_string(),
            "hasFunctions": m.has_functions,
        })).collect::<Vec<_>>(),
        "location": p.location.iter().map(|l| json!({
            "id": l.id.to_string(), "mappingId": l.mapping_id.to_string(),
            "address": l.address.to_string(),
            "line": l.line.iter().map(|x| json!({
                "functionId": x.function_id.to_string(), "line": x.line.to_string(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "function": p.function.iter().map(|f| json!({
            "id": f.id.to_string(), "name": f.name.to_string(),
            "systemName": f.system_name.to_string(), "filename": f.filename.to_string(),
            "startLine": f.start_line.to_string(),
        })).collect::<Vec<_>>(),
        "stringTable": p.string_table,
        "timeNanos": p.time_nanos.to_string(),
        "durationNanos": p.duration_nanos.to_string(),
        "periodType": p.period_type.as_ref().map(value_type),
        "period": p.period.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grafana_style_requests_parse_with_string_int64s_and_enum_names() {
        let body = br#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "labelSelector":"{service_name=\"app\"}","start":"1700000000000","end":1700000060000,
            "maxNodes":"16384","format":"PROFILE_FORMAT_FLAMEGRAPH"}"#;
        let request = select_merge_stacktraces_request(&parse_body(body, "x").unwrap()).unwrap();
        assert_eq!(
            request.profile_type_id,
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        assert_eq!(request.start, 1_700_000_000_000);
        assert_eq!(request.end, 1_700_000_060_000);
        assert_eq!(request.max_nodes, Some(16_384));
        assert_eq!(request.format, 1);
        let series = select_series_request(&parse_body(
            br#"{"profile_typeID":"a:b:c:d:e","groupBy":["pod"],"step":15,"aggregation":"TIME_SERIES_AGGREGATION_TYPE_AVERAGE"}"#,
            "x",
        ).unwrap())
        .unwrap();
        assert_eq!(series.group_by, vec!["pod".to_owned()]);
        assert_eq!(series.step, 15.0);
        assert_eq!(series.aggregation, Some(1));
    }

    #[test]
    fn bad_json_fields_say_which_field() {
        let err = label_values_request(&json!({ "name": 3 })).unwrap_err();
        assert!(err.to_string().contains("`name` must be a string"), "{err}");
        let err = profile_types_request(&json!({ "start": "soon" })).unwrap_err();
        assert!(
            err.to_string().contains("`start` must be an integer"),
            "{err}"
        );
        let err = select_merge_stacktraces_request(&json!({ "format": "PROFILE_FORMAT_DOT" }))
            .unwrap_err();
        assert!(err.to_string().contains("unknown value"), "{err}");
        assert!(parse_body(b"{", "x").is_err());
        assert_eq!(parse_body(b"", "x").unwrap(), json!({}));
    }
}
