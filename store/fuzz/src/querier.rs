//! Request bodies of Pyroscope's `querier.v1.QuerierService` over Connect,
//! which any pod may send the store without a token: JSON or protobuf,
//! parsed into the typed request, then every check the handler makes
//! before it reads the store (time range, node budget, selector and
//! matcher parsing, and for `SelectSeries` its grouping).
//!
//! Input for `connect`: byte 0 picks the method (low seven bits) and the
//! encoding (top bit set: protobuf), the rest is the body. Input for
//! `select_series`: byte 0's top bit picks the encoding, the rest is a
//! `SelectSeriesRequest` body.

use std::sync::OnceLock;

use kiln_api::querier::v1 as q;
use kiln_api::types::v1 as t;
use kiln_engine::model::{Label, LabelSet};
use kiln_store::error::ApiError;
use kiln_store::query::group_by::{MAX_GROUP_LABELS, MAX_GROUPS, group_by_list, series_groups};
use kiln_store::query::pyroscope::connect::decode_proto_request;
use kiln_store::query::pyroscope::{
    MAX_CALL_SITES, MAX_GROUP_BY_ENTRIES, MAX_MATCHER_SETS, MAX_SERIES_LABEL_NAMES, json,
    max_nodes, range_ms, step_ms,
};
use kiln_store::query::selector::parse_selector;
use kiln_store::query::spans::{MAX_SELECTED_IDS, SpanSelector};
use prost::Message;

/// The methods, by the index byte 0 picks.
pub const METHODS: [&str; 10] = [
    "ProfileTypes",
    "LabelNames",
    "LabelValues",
    "Series",
    "SelectMergeStacktraces",
    "SelectMergeProfile",
    "SelectSeries",
    "Diff",
    "GetProfileStats",
    "SelectMergeSpanProfile",
];

/// A request body parsed into its typed message.
enum Request {
    ProfileTypes(q::ProfileTypesRequest),
    LabelNames(t::LabelNamesRequest),
    LabelValues(t::LabelValuesRequest),
    Series(q::SeriesRequest),
    Stacktraces(q::SelectMergeStacktracesRequest),
    Profile(q::SelectMergeProfileRequest),
    SelectSeries(q::SelectSeriesRequest),
    Diff(q::DiffRequest),
    Stats,
    SpanProfile(q::SelectMergeSpanProfileRequest),
}

/// Parses `body` as `method`'s request, JSON or protobuf, as the handler
/// does.
fn parse(method: &str, proto: bool, body: &[u8]) -> Result<Request, ApiError> {
    fn decode<M: Message + Default>(
        method: &str,
        proto: bool,
        body: &[u8],
        from_json: impl FnOnce(&[u8]) -> Result<M, ApiError>,
    ) -> Result<M, ApiError> {
        if proto {
            decode_proto_request(method, body)
        } else {
            from_json(body)
        }
    }
    Ok(match method {
        "ProfileTypes" => {
            Request::ProfileTypes(decode(method, proto, body, json::profile_types_request)?)
        }
        "LabelNames" => {
            Request::LabelNames(decode(method, proto, body, json::label_names_request)?)
        }
        "LabelValues" => {
            Request::LabelValues(decode(method, proto, body, json::label_values_request)?)
        }
        "Series" => Request::Series(decode(method, proto, body, json::series_request)?),
        "SelectMergeStacktraces" => Request::Stacktraces(decode(
            method,
            proto,
            body,
            json::select_merge_stacktraces_request,
        )?),
        "SelectMergeProfile" => Request::Profile(decode(
            method,
            proto,
            body,
            json::select_merge_profile_request,
        )?),
        "SelectSeries" => {
            Request::SelectSeries(decode(method, proto, body, json::select_series_request)?)
        }
        "Diff" => Request::Diff(decode(method, proto, body, json::diff_request)?),
        "SelectMergeSpanProfile" => Request::SpanProfile(decode(
            method,
            proto,
            body,
            json::select_merge_span_profile_request,
        )?),
        _ => Request::Stats,
    })
}

/// Parses a selector as the handler does; a refusal must say why.
fn selector(text: &str) {
    if let Err(error) = parse_selector(text) {
        assert!(!error.to_string().is_empty());
    }
}

fn checked<T>(result: Result<T, ApiError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            assert!(!error.to_string().is_empty());
            None
        }
    }
}

/// A stack trace selector is read (then refused) within its cap.
fn call_sites(selector: Option<&t::StackTraceSelector>) {
    assert!(selector.is_none_or(|s| s.call_site.len() <= MAX_CALL_SITES));
}

/// Every check of a merge request that precedes the store.
fn merge_checks(
    profile_type: &str,
    label_selector: &str,
    start: i64,
    end: i64,
    nodes: Option<i64>,
) {
    let _ = checked(range_ms(start, end));
    assert!(max_nodes(nodes) >= 1);
    selector(&format!("{}{}", profile_type.trim(), label_selector.trim()));
}

/// The `connect` target.
pub fn connect(data: &[u8]) {
    let [selector_byte, body @ ..] = data else {
        return;
    };
    let method = METHODS[usize::from(selector_byte & 0x7f) % METHODS.len()];
    let Some(request) = checked(parse(method, selector_byte & 0x80 != 0, body)) else {
        return;
    };
    match request {
        Request::ProfileTypes(r) => {
            let _ = checked(range_ms(r.start, r.end));
        }
        Request::LabelNames(r) => matcher_checks(&r.matchers, r.start, r.end),
        Request::LabelValues(r) => matcher_checks(&r.matchers, r.start, r.end),
        Request::Series(r) => {
            assert!(r.label_names.len() <= MAX_SERIES_LABEL_NAMES);
            matcher_checks(&r.matchers, r.start, r.end);
        }
        Request::Stacktraces(r) => {
            call_sites(r.stack_trace_selector.as_ref());
            span_checks(&r.span_selector, &r.trace_id_selector);
            merge_checks(
                &r.profile_type_id,
                &r.label_selector,
                r.start,
                r.end,
                r.max_nodes,
            );
        }
        Request::Profile(r) => {
            call_sites(r.stack_trace_selector.as_ref());
            span_checks(&[], &r.trace_id_selector);
            merge_checks(
                &r.profile_type_id,
                &r.label_selector,
                r.start,
                r.end,
                r.max_nodes,
            );
        }
        Request::SelectSeries(r) => select_series_checks(&r),
        Request::Diff(r) => {
            for side in [r.left, r.right].into_iter().flatten() {
                call_sites(side.stack_trace_selector.as_ref());
                merge_checks(
                    &side.profile_type_id,
                    &side.label_selector,
                    side.start,
                    side.end,
                    side.max_nodes,
                );
            }
        }
        Request::Stats => {}
        Request::SpanProfile(r) => {
            span_checks(&r.span_selector, &[]);
            merge_checks(
                &r.profile_type_id,
                &r.label_selector,
                r.start,
                r.end,
                r.max_nodes,
            );
        }
    }
}

/// Span and trace ids are read within their cap, and each is a number or
/// refused with a reason.
fn span_checks(span_ids: &[String], trace_ids: &[String]) {
    assert!(span_ids.len() <= MAX_SELECTED_IDS && trace_ids.len() <= MAX_SELECTED_IDS);
    let spans = checked(SpanSelector::span_ids(
        span_ids.iter().map(String::as_str),
        "span_selector",
    ));
    if let Some(Some(spans)) = spans {
        assert!(span_ids.iter().all(|id| spans.matches(id.trim())));
    }
    let _ = checked(SpanSelector::trace_ids(
        trace_ids.iter().map(String::as_str),
        "trace_id_selector",
    ));
}

fn matcher_checks(matchers: &[String], start: i64, end: i64) {
    assert!(matchers.len() <= MAX_MATCHER_SETS);
    let _ = checked(range_ms(start, end));
    for text in matchers {
        selector(text);
    }
}

/// The `select_series` target.
pub fn select_series(data: &[u8]) {
    let [encoding, body @ ..] = data else {
        return;
    };
    if let Some(Request::SelectSeries(request)) =
        checked(parse("SelectSeries", encoding & 0x80 != 0, body))
    {
        select_series_checks(&request);
    }
}

/// What `SelectSeries` checks before it reads the store, then its grouping
/// over a fixed set of series, which may not pass the group cap.
fn select_series_checks(request: &q::SelectSeriesRequest) {
    call_sites(request.stack_trace_selector.as_ref());
    assert!(request.group_by.len() <= MAX_GROUP_BY_ENTRIES);
    let Some(group_by) = checked(group_by_list(request.group_by.clone())) else {
        return;
    };
    assert!(group_by.len() <= MAX_GROUP_LABELS);
    merge_checks(
        &request.profile_type_id,
        &request.label_selector,
        request.start,
        request.end,
        None,
    );
    if let Ok(range) = range_ms(request.start, request.end) {
        let _ = checked(step_ms(request.step, range));
    }
    if group_by.is_empty() {
        return;
    }
    if let Some(groups) = checked(series_groups(stored_series(), &group_by)) {
        assert!(groups.len() <= MAX_GROUPS);
        assert!(groups.iter().all(|key| key.len() == group_by.len()));
    }
}

/// Series as a store might hold them, for grouping: more distinct pods
/// than the group cap, so grouping by `pod` is refused.
fn stored_series() -> &'static [LabelSet] {
    static SERIES: OnceLock<Vec<LabelSet>> = OnceLock::new();
    SERIES.get_or_init(|| {
        (0..MAX_GROUPS + 8)
            .map(|i| {
                LabelSet::new(vec![
                    Label::new("__name__", "process_cpu"),
                    Label::new("service_name", format!("svc-{}", i % 4)),
                    Label::new("pod", format!("pod-{i}")),
                    Label::new("namespace", if i % 2 == 0 { "shop" } else { "ops" }),
                ])
            })
            .collect()
    })
}

/// JSON and protobuf bodies of every method, prefixed by their byte 0.
pub fn connect_seeds() -> Vec<Vec<u8>> {
    let json_bodies: [&str; 10] = [
        r#"{"start":"1795310000000","end":"1795310560000"}"#,
        r#"{"matchers":["{service_name=\"shop\"}"],"start":1795310000000,"end":1795310560000}"#,
        r#"{"name":"pod","matchers":["process_cpu{namespace=~\"sh.*\"}"]}"#,
        r#"{"matchers":["{}"],"labelNames":["pod","namespace"]}"#,
        r#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta","labelSelector":"{service_name=\"shop\"}","start":"1795310000000","end":"1795310560000","maxNodes":"64","format":"PROFILE_FORMAT_FLAMEGRAPH"}"#,
        r#"{"profile_typeID":"memory:inuse_space:bytes::","label_selector":"{}","max_nodes":16}"#,
        SELECT_SERIES_JSON,
        r#"{"left":{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds","labelSelector":"{pod=\"a\"}"},"right":{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds","labelSelector":"{pod!=\"a\"}","stackTraceSelector":{}}}"#,
        "{}",
        r#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds","labelSelector":"{}","spanSelector":["9a517183f26a089d","5A4FE264A9C987FE"],"start":"1795310000000","end":"1795310560000"}"#,
    ];
    let stacktraces = q::SelectMergeStacktracesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        label_selector: r#"{service_name="shop",pod=~"web-.*"}"#.into(),
        start: 1_795_310_000_000,
        end: 1_795_310_560_000,
        max_nodes: Some(64),
        format: 1,
        span_selector: vec!["9a517183f26a089d".into()],
        trace_id_selector: vec!["0af7651916cd43dd8448eb211c80319c".into()],
        ..Default::default()
    };
    let proto_bodies: [Vec<u8>; 10] = [
        q::ProfileTypesRequest {
            start: 1_795_310_000_000,
            end: 1_795_310_560_000,
        }
        .encode_to_vec(),
        t::LabelNamesRequest {
            matchers: vec![r#"{service_name="shop"}"#.into()],
            start: 0,
            end: 0,
        }
        .encode_to_vec(),
        t::LabelValuesRequest {
            name: "pod".into(),
            matchers: vec![r#"process_cpu{namespace=~"sh.*"}"#.into()],
            start: 0,
            end: 0,
        }
        .encode_to_vec(),
        q::SeriesRequest {
            matchers: vec!["{}".into()],
            label_names: vec!["pod".into()],
            start: 0,
            end: 0,
        }
        .encode_to_vec(),
        stacktraces.encode_to_vec(),
        q::SelectMergeProfileRequest {
            profile_type_id: "memory:inuse_space:bytes::".into(),
            label_selector: "{}".into(),
            max_nodes: Some(16),
            ..Default::default()
        }
        .encode_to_vec(),
        select_series_proto(),
        q::DiffRequest {
            left: Some(stacktraces.clone()),
            right: Some(q::SelectMergeStacktracesRequest {
                label_selector: "{}".into(),
                ..stacktraces
            }),
        }
        .encode_to_vec(),
        Vec::new(),
        q::SelectMergeSpanProfileRequest {
            profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            span_selector: vec!["9a517183f26a089d".into()],
            ..Default::default()
        }
        .encode_to_vec(),
    ];
    let mut seeds = Vec::new();
    for (i, (json, proto)) in json_bodies.iter().zip(proto_bodies).enumerate() {
        let index = i as u8;
        seeds.push([&[index], json.as_bytes()].concat());
        seeds.push([&[index | 0x80], proto.as_slice()].concat());
    }
    seeds
}

const SELECT_SERIES_JSON: &str = r#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds","labelSelector":"{namespace=\"shop\"}","start":"1795310000000","end":"1795310560000","groupBy":["service_name","pod"],"step":15,"aggregation":"TIME_SERIES_AGGREGATION_TYPE_SUM","limit":"10"}"#;

fn select_series_proto() -> Vec<u8> {
    q::SelectSeriesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        label_selector: r#"{namespace="shop"}"#.into(),
        start: 1_795_310_000_000,
        end: 1_795_310_560_000,
        group_by: vec!["service_name".into(), "pod".into()],
        step: 15.0,
        aggregation: Some(0),
        limit: Some(10),
        ..Default::default()
    }
    .encode_to_vec()
}

/// `SelectSeries` bodies in both encodings.
pub fn select_series_seeds() -> Vec<Vec<u8>> {
    vec![
        [&[0u8], SELECT_SERIES_JSON.as_bytes()].concat(),
        [&[0x80u8], select_series_proto().as_slice()].concat(),
        [
            &[0u8],
            br#"{"groupBy":["namespace"],"step":"0.5"}"#.as_slice(),
        ]
        .concat(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_a_json_and_a_protobuf_seed_that_parses() {
        let seeds = connect_seeds();
        assert_eq!(seeds.len(), 2 * METHODS.len());
        for seed in &seeds {
            let method = METHODS[usize::from(seed[0] & 0x7f)];
            let parsed = parse(method, seed[0] & 0x80 != 0, &seed[1..]);
            assert!(parsed.is_ok(), "{method}: {:?}", parsed.err());
        }
        for seed in select_series_seeds() {
            let Ok(Request::SelectSeries(request)) =
                parse("SelectSeries", seed[0] & 0x80 != 0, &seed[1..])
            else {
                panic!("a SelectSeries seed parses");
            };
            assert!(group_by_list(request.group_by).is_ok());
        }
    }

    #[test]
    fn grouping_past_the_group_cap_is_refused_not_built() {
        let by_pod = series_groups(stored_series(), &["pod".to_owned()]);
        assert!(by_pod.is_err());
        let by_service = series_groups(stored_series(), &["service_name".to_owned()]);
        assert_eq!(by_service.map(|groups| groups.len()).ok(), Some(4));
    }

    #[test]
    fn a_group_by_list_of_one_name_a_thousand_times_is_refused_while_parsed() {
        let names = vec!["pod".to_owned(); 1000];
        let json = format!(r#"{{"groupBy":{}}}"#, serde_json::json!(names));
        let proto = q::SelectSeriesRequest {
            group_by: names,
            ..Default::default()
        }
        .encode_to_vec();
        for (proto, body) in [(false, json.into_bytes()), (true, proto)] {
            match parse("SelectSeries", proto, &body) {
                Ok(Request::SelectSeries(request)) => {
                    panic!("{} entries were kept", request.group_by.len())
                }
                Ok(_) => panic!("parsed as another method"),
                Err(error) => assert!(error.to_string().contains("group"), "{error}"),
            }
        }
    }
}
