//! Connect JSON for the querier replies, written straight from the reply
//! messages: no value tree is built first, so a flame graph of a million
//! nodes costs its JSON text, not some 60 bytes more per number as well.
//! int64s are written as strings, as protobuf JSON does.

use std::fmt::Display;

use kiln_api::querier::v1 as q;
use kiln_api::types::v1 as t;
use kiln_pprof::proto as pprof;
use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};

use crate::error::ApiError;

/// A number written as a JSON string.
struct Text<T>(T);

impl<T: Display> Serialize for Text<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

/// A list of numbers written as JSON strings.
struct Texts<'a, T>(&'a [T]);

impl<T: Display> Serialize for Texts<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&Text(item))?;
        }
        seq.end()
    }
}

/// Items written one by one through a function, without collecting them.
struct Each<'a, T, F>(&'a [T], F);

/// `items`, each written as `map` makes it (which may borrow from it).
fn each<'a, T, R: Serialize, F: Fn(&'a T) -> R>(items: &'a [T], map: F) -> Each<'a, T, F> {
    Each(items, map)
}

impl<'a, T, R: Serialize, F: Fn(&'a T) -> R> Serialize for Each<'a, T, F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&(self.1)(item))?;
        }
        seq.end()
    }
}

/// The JSON text of `reply`.
fn text(reply: &impl Serialize) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(reply).map_err(|e| ApiError::Worker {
        work: "writing the JSON reply",
        message: e.to_string(),
    })
}

#[derive(Serialize)]
struct Pair<'a> {
    name: &'a str,
    value: &'a str,
}

fn pairs(labels: &[t::LabelPair]) -> impl Serialize + '_ {
    each(labels, |l| Pair {
        name: &l.name,
        value: &l.value,
    })
}

#[derive(Serialize)]
struct Level<'a> {
    values: Texts<'a, i64>,
}

fn levels(levels: &[q::Level]) -> impl Serialize + '_ {
    each(levels, |l| Level {
        values: Texts(&l.values),
    })
}

/// `querier.v1.ProfileTypesResponse`.
pub fn profile_types_response(r: &q::ProfileTypesResponse) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ProfileType<'a> {
        #[serde(rename = "ID")]
        id: &'a str,
        name: &'a str,
        sample_type: &'a str,
        sample_unit: &'a str,
        period_type: &'a str,
        period_unit: &'a str,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Reply<T> {
        profile_types: T,
    }
    text(&Reply {
        profile_types: each(&r.profile_types, |p| ProfileType {
            id: &p.id,
            name: &p.name,
            sample_type: &p.sample_type,
            sample_unit: &p.sample_unit,
            period_type: &p.period_type,
            period_unit: &p.period_unit,
        }),
    })
}

/// `types.v1.LabelNamesResponse` and `LabelValuesResponse`.
pub fn names_response(names: &[String]) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    struct Reply<'a> {
        names: &'a [String],
    }
    text(&Reply { names })
}

/// `querier.v1.SeriesResponse`.
pub fn series_response(r: &q::SeriesResponse) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    struct Labels<T> {
        labels: T,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Reply<T> {
        labels_set: T,
    }
    text(&Reply {
        labels_set: each(&r.labels_set, |s| Labels {
            labels: pairs(&s.labels),
        }),
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FlameGraph<'a, L> {
    names: &'a [String],
    levels: L,
    total: Text<i64>,
    max_self: Text<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    left_ticks: Option<Text<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    right_ticks: Option<Text<i64>>,
}

#[derive(Serialize)]
struct GraphReply<T> {
    flamegraph: T,
}

/// `querier.v1.SelectMergeStacktracesResponse`.
pub fn select_merge_stacktraces_response(
    r: &q::SelectMergeStacktracesResponse,
) -> Result<Vec<u8>, ApiError> {
    flame_graph_reply(r.flamegraph.as_ref())
}

/// `querier.v1.SelectMergeSpanProfileResponse`, the same shape.
pub fn select_merge_span_profile_response(
    r: &q::SelectMergeSpanProfileResponse,
) -> Result<Vec<u8>, ApiError> {
    flame_graph_reply(r.flamegraph.as_ref())
}

fn flame_graph_reply(graph: Option<&q::FlameGraph>) -> Result<Vec<u8>, ApiError> {
    let empty = q::FlameGraph::default();
    let graph = graph.unwrap_or(&empty);
    text(&GraphReply {
        flamegraph: FlameGraph {
            names: &graph.names,
            levels: levels(&graph.levels),
            total: Text(graph.total),
            max_self: Text(graph.max_self),
            left_ticks: None,
            right_ticks: None,
        },
    })
}

/// `querier.v1.DiffResponse`.
pub fn diff_response(r: &q::DiffResponse) -> Result<Vec<u8>, ApiError> {
    let empty = q::FlameGraphDiff::default();
    let graph = r.flamegraph.as_ref().unwrap_or(&empty);
    text(&GraphReply {
        flamegraph: FlameGraph {
            names: &graph.names,
            levels: levels(&graph.levels),
            total: Text(graph.total),
            max_self: Text(graph.max_self),
            left_ticks: Some(Text(graph.left_ticks)),
            right_ticks: Some(Text(graph.right_ticks)),
        },
    })
}

/// `querier.v1.SelectSeriesResponse`.
pub fn select_series_response(r: &q::SelectSeriesResponse) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Exemplar<'a, L> {
        timestamp: Text<i64>,
        profile_id: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        span_id: &'a str,
        value: Text<i64>,
        labels: L,
    }
    #[derive(Serialize)]
    struct Point<E> {
        value: f64,
        timestamp: Text<i64>,
        // Protobuf JSON leaves an empty list out.
        #[serde(skip_serializing_if = "Option::is_none")]
        exemplars: Option<E>,
    }
    #[derive(Serialize)]
    struct Series<L, P> {
        labels: L,
        points: P,
    }
    #[derive(Serialize)]
    struct Reply<T> {
        series: T,
    }
    text(&Reply {
        series: each(&r.series, |s| Series {
            labels: pairs(&s.labels),
            points: each(&s.points, |p| Point {
                value: p.value,
                timestamp: Text(p.timestamp),
                exemplars: (!p.exemplars.is_empty()).then(|| {
                    each(&p.exemplars, |e| Exemplar {
                        timestamp: Text(e.timestamp),
                        profile_id: &e.profile_id,
                        span_id: &e.span_id,
                        value: Text(e.value),
                        labels: pairs(&e.labels),
                    })
                }),
            }),
        }),
    })
}

/// `types.v1.GetProfileStatsResponse`.
pub fn profile_stats_response(r: &t::GetProfileStatsResponse) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Reply {
        data_ingested: bool,
        oldest_profile_time: Text<i64>,
        newest_profile_time: Text<i64>,
    }
    text(&Reply {
        data_ingested: r.data_ingested,
        oldest_profile_time: Text(r.oldest_profile_time),
        newest_profile_time: Text(r.newest_profile_time),
    })
}

/// pprof's strings, kept as bytes, written as the strings upstream's
/// `repeated string` field holds (invalid UTF-8 replaced).
struct StringTable<'a>(&'a [Vec<u8>]);

impl Serialize for StringTable<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for bytes in self.0 {
            seq.serialize_element(&String::from_utf8_lossy(bytes))?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct ValueType {
    r#type: Text<i64>,
    unit: Text<i64>,
}

fn value_type(v: &pprof::ValueType) -> ValueType {
    ValueType {
        r#type: Text(v.r#type),
        unit: Text(v.unit),
    }
}

/// `google.v1.Profile` (pprof) in protobuf JSON.
pub fn pprof_response(p: &pprof::Profile) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Label {
        key: Text<i64>,
        str: Text<i64>,
        num: Text<i64>,
        num_unit: Text<i64>,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Sample<'a, L> {
        location_id: Texts<'a, u64>,
        value: Texts<'a, i64>,
        label: L,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Mapping {
        id: Text<u64>,
        memory_start: Text<u64>,
        memory_limit: Text<u64>,
        file_offset: Text<u64>,
        filename: Text<i64>,
        build_id: Text<i64>,
        has_functions: bool,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Line {
        function_id: Text<u64>,
        line: Text<i64>,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Location<L> {
        id: Text<u64>,
        mapping_id: Text<u64>,
        address: Text<u64>,
        line: L,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Function {
        id: Text<u64>,
        name: Text<i64>,
        system_name: Text<i64>,
        filename: Text<i64>,
        start_line: Text<i64>,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Reply<'a, ST, SA, MA, LO, FU> {
        sample_type: ST,
        sample: SA,
        mapping: MA,
        location: LO,
        function: FU,
        string_table: StringTable<'a>,
        time_nanos: Text<i64>,
        duration_nanos: Text<i64>,
        period_type: Option<ValueType>,
        period: Text<i64>,
    }
    text(&Reply {
        sample_type: each(&p.sample_type, value_type),
        sample: each(&p.sample, |s| Sample {
            location_id: Texts(&s.location_id),
            value: Texts(&s.value),
            label: each(&s.label, |l| Label {
                key: Text(l.key),
                str: Text(l.str),
                num: Text(l.num),
                num_unit: Text(l.num_unit),
            }),
        }),
        mapping: each(&p.mapping, |m| Mapping {
            id: Text(m.id),
            memory_start: Text(m.memory_start),
            memory_limit: Text(m.memory_limit),
            file_offset: Text(m.file_offset),
            filename: Text(m.filename),
            build_id: Text(m.build_id),
            has_functions: m.has_functions,
        }),
        location: each(&p.location, |l| Location {
            id: Text(l.id),
            mapping_id: Text(l.mapping_id),
            address: Text(l.address),
            line: each(&l.line, |x| Line {
                function_id: Text(x.function_id),
                line: Text(x.line),
            }),
        }),
        function: each(&p.function, |f| Function {
            id: Text(f.id),
            name: Text(f.name),
            system_name: Text(f.system_name),
            filename: Text(f.filename),
            start_line: Text(f.start_line),
        }),
        string_table: StringTable(&p.string_table),
        time_nanos: Text(p.time_nanos),
        duration_nanos: Text(p.duration_nanos),
        period_type: p.period_type.as_ref().map(value_type),
        period: Text(p.period),
    })
}

#[cfg(test)]
mod tests;
