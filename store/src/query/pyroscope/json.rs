//! Connect JSON for the querier messages: protobuf JSON names
//! (lowerCamelCase, original names accepted too), int64 as strings or
//! numbers on input and strings on output, enums by name or number.

use std::fmt;
use std::marker::PhantomData;

use kiln_api::querier::v1 as q;
use kiln_api::types::v1 as t;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

mod fields;
mod replies;

pub use replies::{
    diff_response, names_response, pprof_response, profile_stats_response, profile_types_response,
    select_merge_span_profile_response, select_merge_stacktraces_response, select_series_response,
    series_response,
};

use fields::{StackTraceSelector, StringList, double, enumeration, int64, string};

use super::exemplars::MAX_PROFILE_IDS;
use super::{MAX_GROUP_BY_ENTRIES, MAX_MATCHER_SETS, MAX_SERIES_LABEL_NAMES};
use crate::error::ApiError;
use crate::query::spans::MAX_SELECTED_IDS;

// Requests are read straight into their messages, field by field: a value
// tree of the whole body first would cost some 32 bytes per two-byte
// `0,` of a list nobody asked for, so a small gzipped body could take
// gigabytes. Unknown fields are skipped without being kept, and every list
// is refused as soon as it passes its cap, while it is read.

/// A querier request message read from Connect JSON.
trait JsonMessage: Default {
    /// The message's protobuf name, for errors.
    const NAME: &'static str;

    /// Reads the value of `key` into the message when `key` names one of
    /// its fields (in protobuf JSON's lowerCamelCase or the original
    /// spelling); `Ok(false)` for any other key, whose value is skipped.
    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error>;
}

/// Parses a JSON body into `M`; an empty body is the empty message.
fn parse<M: JsonMessage>(body: &[u8]) -> Result<M, ApiError> {
    let bad = |message: String| ApiError::BadMessage {
        message_type: M::NAME,
        message,
    };
    let Some(first) = body.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Ok(M::default());
    };
    if *first != b'{' {
        return Err(bad("the body must be a JSON object".to_owned()));
    }
    let mut reader = serde_json::Deserializer::from_slice(body);
    let message = MessageSeed::<M>(PhantomData)
        .deserialize(&mut reader)
        .map_err(|e| bad(e.to_string()))?;
    reader.end().map_err(|e| bad(e.to_string()))?;
    message.ok_or_else(|| bad("the body must be a JSON object".to_owned()))
}

/// Reads one message object (`None` for `null`, as a field left unset).
struct MessageSeed<M>(PhantomData<M>);

impl<'de, M: JsonMessage> DeserializeSeed<'de> for MessageSeed<M> {
    type Value = Option<M>;

    fn deserialize<D: de::Deserializer<'de>>(self, reader: D) -> Result<Self::Value, D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de, M: JsonMessage> Visitor<'de> for MessageSeed<M> {
    type Value = Option<M>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} object", M::NAME)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut message = M::default();
        while let Some(key) = map.next_key::<String>()? {
            if !message.read_field(&key, &mut map)? {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(message))
    }
}

impl JsonMessage for q::ProfileTypesRequest {
    const NAME: &'static str = "querier.v1.ProfileTypesRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl JsonMessage for t::LabelNamesRequest {
    const NAME: &'static str = "types.v1.LabelNamesRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "matchers" => self.matchers = matchers(map)?,
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl JsonMessage for t::LabelValuesRequest {
    const NAME: &'static str = "types.v1.LabelValuesRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "name" => self.name = string(map, "name")?,
            "matchers" => self.matchers = matchers(map)?,
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl JsonMessage for q::SeriesRequest {
    const NAME: &'static str = "querier.v1.SeriesRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "matchers" => self.matchers = matchers(map)?,
            "labelNames" | "label_names" => {
                self.label_names = StringList {
                    field: "labelNames",
                    max: MAX_SERIES_LABEL_NAMES,
                }
                .read(map)?;
            }
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `matchers` of LabelNames, LabelValues and Series: each is a query of
/// its own.
fn matchers<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Vec<String>, A::Error> {
    StringList {
        field: "matchers",
        max: MAX_MATCHER_SETS,
    }
    .read(map)
}

const FORMATS: [(&str, i32); 3] = [
    ("PROFILE_FORMAT_UNSPECIFIED", 0),
    ("PROFILE_FORMAT_FLAMEGRAPH", 1),
    ("PROFILE_FORMAT_TREE", 2),
];

const EXEMPLAR_TYPES: [(&str, i32); 4] = [
    ("EXEMPLAR_TYPE_UNSPECIFIED", 0),
    ("EXEMPLAR_TYPE_NONE", 1),
    ("EXEMPLAR_TYPE_INDIVIDUAL", 2),
    ("EXEMPLAR_TYPE_SPAN", 3),
];

const AGGREGATIONS: [(&str, i32); 2] = [
    ("TIME_SERIES_AGGREGATION_TYPE_SUM", 0),
    ("TIME_SERIES_AGGREGATION_TYPE_AVERAGE", 1),
];

impl JsonMessage for q::SelectMergeStacktracesRequest {
    const NAME: &'static str = "querier.v1.SelectMergeStacktracesRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "profileTypeID" | "profile_typeID" => {
                self.profile_type_id = string(map, "profileTypeID")?;
            }
            "labelSelector" | "label_selector" => {
                self.label_selector = string(map, "labelSelector")?;
            }
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            "maxNodes" | "max_nodes" => self.max_nodes = int64(map, "maxNodes")?,
            "format" => self.format = enumeration(map, "format", &FORMATS)?.unwrap_or(0),
            "stackTraceSelector" | "stack_trace_selector" => {
                self.stack_trace_selector = map.next_value_seed(StackTraceSelector)?;
            }
            "profileIdSelector" | "profile_id_selector" => {
                self.profile_id_selector = profile_ids(map)?;
            }
            "traceIdSelector" | "trace_id_selector" => {
                self.trace_id_selector = ids(map, "traceIdSelector")?;
            }
            "spanSelector" | "span_selector" => {
                self.span_selector = ids(map, "spanSelector")?;
            }
            "async" => refuse_async(map)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A list of span or trace ids, refused past its cap while read.
fn ids<'de, A: MapAccess<'de>>(map: &mut A, field: &'static str) -> Result<Vec<String>, A::Error> {
    StringList {
        field,
        max: MAX_SELECTED_IDS,
    }
    .read(map)
}

/// An async query request is refused when set (`null` is unset): Kiln
/// answers every query at once.
fn refuse_async<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    if map.next_value::<Option<IgnoredAny>>()?.is_none() {
        return Ok(());
    }
    Err(de::Error::custom(format!(
        "`async` is not supported by Kiln: it asks for {}",
        super::connect::ASYNC_ASKS_FOR
    )))
}

/// A profile id selector, refused past its cap while read; each id is
/// checked when the request is answered.
fn profile_ids<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Vec<String>, A::Error> {
    StringList {
        field: "profileIdSelector",
        max: MAX_PROFILE_IDS,
    }
    .read(map)
}

impl JsonMessage for q::SelectMergeSpanProfileRequest {
    const NAME: &'static str = "querier.v1.SelectMergeSpanProfileRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "profileTypeID" | "profile_typeID" => {
                self.profile_type_id = string(map, "profileTypeID")?;
            }
            "labelSelector" | "label_selector" => {
                self.label_selector = string(map, "labelSelector")?;
            }
            "spanSelector" | "span_selector" => {
                self.span_selector = ids(map, "spanSelector")?;
            }
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            "maxNodes" | "max_nodes" => self.max_nodes = int64(map, "maxNodes")?,
            "format" => self.format = enumeration(map, "format", &FORMATS)?.unwrap_or(0),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl JsonMessage for q::SelectMergeProfileRequest {
    const NAME: &'static str = "querier.v1.SelectMergeProfileRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "profileTypeID" | "profile_typeID" => {
                self.profile_type_id = string(map, "profileTypeID")?;
            }
            "labelSelector" | "label_selector" => {
                self.label_selector = string(map, "labelSelector")?;
            }
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            "maxNodes" | "max_nodes" => self.max_nodes = int64(map, "maxNodes")?,
            "stackTraceSelector" | "stack_trace_selector" => {
                self.stack_trace_selector = map.next_value_seed(StackTraceSelector)?;
            }
            "profileIdSelector" | "profile_id_selector" => {
                self.profile_id_selector = profile_ids(map)?;
            }
            "traceIdSelector" | "trace_id_selector" => {
                self.trace_id_selector = ids(map, "traceIdSelector")?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl JsonMessage for q::SelectSeriesRequest {
    const NAME: &'static str = "querier.v1.SelectSeriesRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "profileTypeID" | "profile_typeID" => {
                self.profile_type_id = string(map, "profileTypeID")?;
            }
            "labelSelector" | "label_selector" => {
                self.label_selector = string(map, "labelSelector")?;
            }
            "start" => self.start = int64(map, "start")?.unwrap_or(0),
            "end" => self.end = int64(map, "end")?.unwrap_or(0),
            "groupBy" | "group_by" => {
                self.group_by = StringList {
                    field: "groupBy",
                    max: MAX_GROUP_BY_ENTRIES,
                }
                .read(map)?;
            }
            "step" => self.step = double(map, "step")?,
            "aggregation" => self.aggregation = enumeration(map, "aggregation", &AGGREGATIONS)?,
            "stackTraceSelector" | "stack_trace_selector" => {
                self.stack_trace_selector = map.next_value_seed(StackTraceSelector)?;
            }
            "limit" => self.limit = int64(map, "limit")?,
            "exemplarType" | "exemplar_type" => {
                self.exemplar_type =
                    enumeration(map, "exemplarType", &EXEMPLAR_TYPES)?.unwrap_or(0);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl JsonMessage for q::DiffRequest {
    const NAME: &'static str = "querier.v1.DiffRequest JSON";

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        let side = || MessageSeed::<q::SelectMergeStacktracesRequest>(PhantomData);
        match key {
            "left" => self.left = map.next_value_seed(side())?,
            "right" => self.right = map.next_value_seed(side())?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `querier.v1.ProfileTypesRequest`.
pub fn profile_types_request(body: &[u8]) -> Result<q::ProfileTypesRequest, ApiError> {
    parse(body)
}

/// `types.v1.LabelNamesRequest`.
pub fn label_names_request(body: &[u8]) -> Result<t::LabelNamesRequest, ApiError> {
    parse(body)
}

/// `types.v1.LabelValuesRequest`.
pub fn label_values_request(body: &[u8]) -> Result<t::LabelValuesRequest, ApiError> {
    parse(body)
}

/// `querier.v1.SeriesRequest`.
pub fn series_request(body: &[u8]) -> Result<q::SeriesRequest, ApiError> {
    parse(body)
}

/// `querier.v1.SelectMergeStacktracesRequest`.
pub fn select_merge_stacktraces_request(
    body: &[u8],
) -> Result<q::SelectMergeStacktracesRequest, ApiError> {
    parse(body)
}

/// `querier.v1.SelectMergeSpanProfileRequest`.
pub fn select_merge_span_profile_request(
    body: &[u8],
) -> Result<q::SelectMergeSpanProfileRequest, ApiError> {
    parse(body)
}

/// `querier.v1.SelectMergeProfileRequest`.
pub fn select_merge_profile_request(body: &[u8]) -> Result<q::SelectMergeProfileRequest, ApiError> {
    parse(body)
}

/// `querier.v1.SelectSeriesRequest`.
pub fn select_series_request(body: &[u8]) -> Result<q::SelectSeriesRequest, ApiError> {
    parse(body)
}

/// `querier.v1.DiffRequest`.
pub fn diff_request(body: &[u8]) -> Result<q::DiffRequest, ApiError> {
    parse(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::pyroscope::MAX_CALL_SITES;

    #[test]
    fn grafana_style_requests_parse_with_string_int64s_and_enum_names() {
        let body = br#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "labelSelector":"{service_name=\"app\"}","start":"1700000000000","end":1700000060000,
            "maxNodes":"16384","format":"PROFILE_FORMAT_FLAMEGRAPH"}"#;
        let request = select_merge_stacktraces_request(body).unwrap();
        assert_eq!(
            request.profile_type_id,
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        assert_eq!(request.label_selector, "{service_name=\"app\"}");
        assert_eq!(request.start, 1_700_000_000_000);
        assert_eq!(request.end, 1_700_000_060_000);
        assert_eq!(request.max_nodes, Some(16_384));
        assert_eq!(request.format, 1);
        assert!(request.stack_trace_selector.is_none());
        let series = select_series_request(
            br#"{"profile_typeID":"a:b:c:d:e","groupBy":["pod"],"step":15,"aggregation":"TIME_SERIES_AGGREGATION_TYPE_AVERAGE","limit":null}"#,
        )
        .unwrap();
        assert_eq!(series.profile_type_id, "a:b:c:d:e");
        assert_eq!(series.group_by, vec!["pod".to_owned()]);
        assert_eq!(series.step, 15.0);
        assert_eq!(series.aggregation, Some(1));
        assert_eq!(series.limit, None);
        let diff = diff_request(
            br#"{"left":{"profileTypeID":"a","start":"5"},"right":{"label_selector":"{}","stackTraceSelector":{"callSite":[]}},"extra":[1,[2,{"x":3}]]}"#,
        )
        .unwrap();
        assert_eq!(diff.left.as_ref().map(|l| l.start), Some(5));
        let right = diff.right.unwrap();
        assert_eq!(right.label_selector, "{}");
        assert!(
            right.stack_trace_selector.is_some(),
            "present, so refused later"
        );
        let names = label_names_request(b"  ").unwrap();
        assert_eq!(names, t::LabelNamesRequest::default());
        let names = label_names_request(br#"{"matchers":null,"start":1.7e12,"end":null}"#).unwrap();
        assert!(names.matchers.is_empty());
        assert_eq!((names.start, names.end), (1_700_000_000_000, 0));
    }

    #[test]
    fn bad_json_fields_say_which_field() {
        let err = label_values_request(br#"{"name": 3}"#).unwrap_err();
        assert!(err.to_string().contains("`name` must be a string"), "{err}");
        let err = profile_types_request(br#"{"start": "soon"}"#).unwrap_err();
        assert!(
            err.to_string().contains("`start` must be an integer"),
            "{err}"
        );
        let err =
            select_merge_stacktraces_request(br#"{"format": "PROFILE_FORMAT_DOT"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown value"), "{err}");
        let err = label_names_request(br#"{"matchers": "{}"}"#).unwrap_err();
        assert!(
            err.to_string().contains("`matchers` must be a list"),
            "{err}"
        );
        let err = label_names_request(br#"{"matchers": [1]}"#).unwrap_err();
        assert!(err.to_string().contains("list of strings"), "{err}");
        let err = profile_types_request(br#"{"start": [1]}"#).unwrap_err();
        assert!(
            err.to_string().contains("`start` must be an integer"),
            "{err}"
        );
        assert!(profile_types_request(b"{").is_err());
        assert!(profile_types_request(b"[1,2]").is_err());
        assert!(profile_types_request(b"null").is_err());
        assert!(profile_types_request(b"{} {}").is_err());
    }

    /// A list of `count` copies of `item`, as the JSON of field `field`.
    fn list_body(field: &str, item: &str, count: usize) -> Vec<u8> {
        let mut body = format!("{{\"{field}\":[");
        for i in 0..count {
            if i > 0 {
                body.push(',');
            }
            body.push_str(item);
        }
        body.push_str("]}");
        body.into_bytes()
    }

    #[test]
    fn lists_are_refused_past_their_caps_while_read() {
        let at_cap = list_body("matchers", "\"{}\"", MAX_MATCHER_SETS);
        assert_eq!(
            label_names_request(&at_cap).unwrap().matchers.len(),
            MAX_MATCHER_SETS
        );
        for (field, max) in [
            ("matchers", MAX_MATCHER_SETS),
            ("labelNames", MAX_SERIES_LABEL_NAMES),
        ] {
            let over = list_body(field, "\"x\"", max + 1);
            let err = series_request(&over).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("more than {max} entries")),
                "{err}"
            );
        }
        let over = list_body("groupBy", "\"pod\"", 1_000_000);
        let err = select_series_request(&over).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("`groupBy` holds more than {MAX_GROUP_BY_ENTRIES}")),
            "{err}"
        );
        let over = list_body("stackTraceSelector", "0", MAX_CALL_SITES + 1);
        assert!(select_merge_profile_request(&over).is_err());
    }

    #[test]
    fn profile_id_selectors_are_read_in_either_spelling_within_their_cap() {
        let id = "018c2b5e-3f00-7000-8000-000000000400";
        for body in [
            format!(r#"{{"profileIdSelector":["{id}"]}}"#),
            format!(r#"{{"profile_id_selector":["{id}"]}}"#),
        ] {
            let read = select_merge_stacktraces_request(body.as_bytes()).expect("read");
            assert_eq!(read.profile_id_selector, vec![id.to_owned()]);
            let read = select_merge_profile_request(body.as_bytes()).expect("read");
            assert_eq!(read.profile_id_selector, vec![id.to_owned()]);
        }
        let over = list_body("profileIdSelector", "\"x\"", MAX_PROFILE_IDS + 1);
        let err = select_merge_stacktraces_request(&over).unwrap_err();
        assert!(err.to_string().contains("profileIdSelector"), "{err}");
        assert_eq!(err.http_status(), 400, "{err}");
    }

    #[test]
    fn unknown_fields_are_skipped_whatever_they_hold() {
        // A list of a million zeros in a field no message has: skipped
        // without being kept (it would be some 32 MB as a value tree).
        let body = list_body("x", "0", 1_000_000);
        let request = label_names_request(&body).unwrap();
        assert_eq!(request, t::LabelNamesRequest::default());
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        // Skipped by a loop, not by recursion: no stack is at risk.
        assert!(label_names_request(deep.as_bytes()).is_ok());
        let deep = format!(
            "{{\"matchers\":{}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(label_names_request(deep.as_bytes()).is_err());
    }
}
