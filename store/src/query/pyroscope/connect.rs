//! `POST /querier.v1.QuerierService/{method}` over the Connect protocol:
//! `application/json` or `application/proto` bodies (gzip or identity),
//! answered in the same encoding; errors in Connect's JSON error shape.

mod body;
mod proto_scan;

use std::time::Instant;

use axum::extract::{Path, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use kiln_api::types::v1 as t;
use prost::Message;

pub use body::MAX_QUERY_BODY_BYTES;
use proto_scan::{Field, Rule, Shape};

use super::exemplars::MAX_PROFILE_IDS;
use super::{LabelNameScheme, Query, json};
use super::{MAX_CALL_SITES, MAX_GROUP_BY_ENTRIES, MAX_MATCHER_SETS, MAX_SERIES_LABEL_NAMES};
use crate::error::ApiError;
use crate::query::budget::QueryReservation;
use crate::query::group_by::within_deadline;
use crate::query::spans::MAX_SELECTED_IDS;
use crate::state::AppState;
use crate::wire::content_type::media_type;

/// The body encodings Connect unary calls use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Json,
    Proto,
}

/// The metrics endpoint name of a method (fixed strings for label values);
/// `None` for a method Kiln does not serve.
fn endpoint(method: &str) -> Option<&'static str> {
    Some(match method {
        "ProfileTypes" => "querier_profile_types",
        "LabelNames" => "querier_label_names",
        "LabelValues" => "querier_label_values",
        "Series" => "querier_series",
        "SelectMergeStacktraces" => "querier_select_merge_stacktraces",
        "SelectMergeSpanProfile" => "querier_select_merge_span_profile",
        "SelectMergeProfile" => "querier_select_merge_profile",
        "SelectSeries" => "querier_select_series",
        "Diff" => "querier_diff",
        "GetProfileStats" => "querier_get_profile_stats",
        _ => return None,
    })
}

/// The handler for every querier method.
pub async fn querier(
    State(state): State<AppState>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    let started = Instant::now();
    let endpoint = endpoint(&method).unwrap_or("querier_other");
    // Held until the answer is built, given back on every way out.
    let mut reservation = QueryReservation::default();
    let result = serve(&state, &method, request, &mut reservation).await;
    state.metrics().record_query(endpoint, started.elapsed());
    match result {
        Ok(response) => response,
        Err(err) => {
            state.metrics().record_rejection(endpoint, err.reason());
            tracing::debug!(error = %err, method, "querier call refused");
            err.into_connect_response()
        }
    }
}

/// Reads the body into the query budget, then takes a query slot and runs
/// the method within one deadline for all the store visits it makes.
async fn serve(
    state: &AppState,
    method: &str,
    request: Request,
    reservation: &mut QueryReservation,
) -> Result<Response, ApiError> {
    let (parts, request_body) = request.into_parts();
    let content_encoding = body::content_encoding(&parts.headers)?;
    // Each byte kept is reserved first: the body itself, and for a plain
    // body one more for what is parsed from it (strings are copied out of
    // it); a gzip body's parsed copy is reserved as it inflates.
    let copies = match content_encoding {
        body::ContentEncoding::Identity => 2,
        body::ContentEncoding::Gzip => 1,
    };
    let mut reserve =
        |bytes: usize| state.reserve_query_memory(reservation, bytes.saturating_mul(copies));
    let raw = body::read(
        request_body,
        MAX_QUERY_BODY_BYTES,
        state.body_read_timeout(),
        &mut reserve,
    )
    .await?;
    // Refused only once the body is in: an answer sent before it is read
    // makes the server close a kept-alive connection with the body unread,
    // and a client that reuses it (Grafana's Go client) sees a reset, not
    // the refusal.
    if endpoint(method).is_none() {
        return Err(ApiError::Unimplemented {
            what: format!(
                "querier.v1.QuerierService/{}",
                method.chars().take(60).collect::<String>()
            ),
        });
    }
    let encoding = encoding(&parts.headers)?;
    let store = state.store()?;
    let bytes = match content_encoding {
        body::ContentEncoding::Identity => raw,
        body::ContentEncoding::Gzip => body::inflate(raw, MAX_QUERY_BODY_BYTES, &mut |bytes| {
            state.reserve_query_memory(reservation, bytes.saturating_mul(2))
        })?,
    };
    // Only now, with the whole body in, is a slot taken: a slow sender
    // holds none while it sends.
    let _slot = state.admit_query()?;
    let names = LabelNameScheme::from_accept(
        parts
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
    );
    let query = Query {
        store,
        symbolizer: state.symbolizer(),
    };
    within_deadline(store, call(query, encoding, method, &bytes, names)).await
}

fn encoding(headers: &axum::http::HeaderMap) -> Result<Encoding, ApiError> {
    let content_type = media_type(headers);
    match content_type.as_str() {
        "application/json" => Ok(Encoding::Json),
        "application/proto" | "application/protobuf" | "application/x-protobuf" => {
            Ok(Encoding::Proto)
        }
        other => Err(ApiError::UnsupportedMediaType {
            content_type: other.chars().take(60).collect(),
            expected: "application/json or application/proto (Connect unary)",
        }),
    }
}

static STACK_TRACE_SELECTOR: Shape = Shape {
    message: "types.v1.StackTraceSelector",
    fields: &[Field {
        number: 1,
        name: "callSite",
        rule: Rule::Repeated {
            max: MAX_CALL_SITES,
        },
    }],
};

const fn matchers(number: u64) -> Field {
    Field {
        number,
        name: "matchers",
        rule: Rule::Repeated {
            max: MAX_MATCHER_SETS,
        },
    }
}

const fn stack_trace_selector(number: u64) -> Field {
    Field {
        number,
        name: "stackTraceSelector",
        rule: Rule::Message(&STACK_TRACE_SELECTOR),
    }
}

static PROFILE_TYPES: Shape = Shape {
    message: "querier.v1.ProfileTypesRequest",
    fields: &[],
};
static LABEL_NAMES: Shape = Shape {
    message: "types.v1.LabelNamesRequest",
    fields: &[matchers(1)],
};
static LABEL_VALUES: Shape = Shape {
    message: "types.v1.LabelValuesRequest",
    fields: &[matchers(2)],
};
static SERIES: Shape = Shape {
    message: "querier.v1.SeriesRequest",
    fields: &[
        matchers(1),
        Field {
            number: 2,
            name: "labelNames",
            rule: Rule::Repeated {
                max: MAX_SERIES_LABEL_NAMES,
            },
        },
    ],
};
/// `profile_id_selector`: single profiles by their exemplar ids.
const fn profile_id_selector(number: u64) -> Field {
    Field {
        number,
        name: "profileIdSelector",
        rule: Rule::Repeated {
            max: MAX_PROFILE_IDS,
        },
    }
}

/// Why an async query request is refused, in both codecs.
pub const ASYNC_ASKS_FOR: &str =
    "an asynchronous query (Pyroscope's experimental polling); leave it unset";

/// A list of span or trace ids.
const fn ids(number: u64, name: &'static str) -> Field {
    Field {
        number,
        name,
        rule: Rule::Repeated {
            max: MAX_SELECTED_IDS,
        },
    }
}

static SELECT_MERGE_STACKTRACES: Shape = Shape {
    message: "querier.v1.SelectMergeStacktracesRequest",
    fields: &[
        stack_trace_selector(7),
        profile_id_selector(8),
        Field {
            number: 9,
            name: "async",
            rule: Rule::NotHonoured {
                asks_for: ASYNC_ASKS_FOR,
            },
        },
        ids(10, "traceIdSelector"),
        ids(11, "spanSelector"),
    ],
};
static SELECT_MERGE_SPAN_PROFILE: Shape = Shape {
    message: "querier.v1.SelectMergeSpanProfileRequest",
    fields: &[ids(3, "spanSelector")],
};
static SELECT_MERGE_PROFILE: Shape = Shape {
    message: "querier.v1.SelectMergeProfileRequest",
    fields: &[
        stack_trace_selector(6),
        profile_id_selector(7),
        ids(8, "traceIdSelector"),
    ],
};
static SELECT_SERIES: Shape = Shape {
    message: "querier.v1.SelectSeriesRequest",
    fields: &[
        Field {
            number: 5,
            name: "groupBy",
            rule: Rule::Repeated {
                max: MAX_GROUP_BY_ENTRIES,
            },
        },
        stack_trace_selector(8),
    ],
};
static DIFF: Shape = Shape {
    message: "querier.v1.DiffRequest",
    fields: &[
        Field {
            number: 1,
            name: "left",
            rule: Rule::Message(&SELECT_MERGE_STACKTRACES),
        },
        Field {
            number: 2,
            name: "right",
            rule: Rule::Message(&SELECT_MERGE_STACKTRACES),
        },
    ],
};

/// The wire shape of `method`'s request message.
fn shape(method: &str) -> Option<&'static Shape> {
    Some(match method {
        "ProfileTypes" => &PROFILE_TYPES,
        "LabelNames" => &LABEL_NAMES,
        "LabelValues" => &LABEL_VALUES,
        "Series" => &SERIES,
        "SelectMergeStacktraces" => &SELECT_MERGE_STACKTRACES,
        "SelectMergeSpanProfile" => &SELECT_MERGE_SPAN_PROFILE,
        "SelectMergeProfile" => &SELECT_MERGE_PROFILE,
        "SelectSeries" => &SELECT_SERIES,
        "Diff" => &DIFF,
        _ => return None,
    })
}

/// Decodes a protobuf body as `method`'s request message `M`, its repeated
/// fields counted against their caps on the wire first, so nothing past a
/// cap is ever allocated.
pub fn decode_proto_request<M: Message + Default>(
    method: &str,
    body: &[u8],
) -> Result<M, ApiError> {
    let shape = shape(method).ok_or_else(|| ApiError::Unimplemented {
        what: format!(
            "querier.v1.QuerierService/{}",
            method.chars().take(60).collect::<String>()
        ),
    })?;
    proto_scan::check(body, shape)?;
    M::decode(body).map_err(|e| ApiError::BadMessage {
        message_type: shape.message,
        message: e.to_string(),
    })
}

/// The request message, from JSON or protobuf, its lists within their
/// caps before anything of them is kept.
fn decode<M: Message + Default>(
    encoding: Encoding,
    method: &str,
    body: &[u8],
    from_json: impl FnOnce(&[u8]) -> Result<M, ApiError>,
) -> Result<M, ApiError> {
    match encoding {
        Encoding::Json => from_json(body),
        Encoding::Proto => decode_proto_request(method, body),
    }
}

/// The reply in the request's encoding.
fn reply<M: Message>(
    encoding: Encoding,
    message: &M,
    to_json: impl FnOnce(&M) -> Result<Vec<u8>, ApiError>,
) -> Result<Response, ApiError> {
    Ok(match encoding {
        Encoding::Json => (
            [(header::CONTENT_TYPE, "application/json")],
            to_json(message)?,
        )
            .into_response(),
        Encoding::Proto => (
            [(header::CONTENT_TYPE, "application/proto")],
            message.encode_to_vec(),
        )
            .into_response(),
    })
}

async fn call(
    query: Query<'_>,
    encoding: Encoding,
    method: &str,
    body: &[u8],
    names: LabelNameScheme,
) -> Result<Response, ApiError> {
    let store = query.store;
    Ok(match method {
        "ProfileTypes" => {
            let request = decode(encoding, method, body, json::profile_types_request)?;
            let response = super::profile_types(store, request).await?;
            reply(encoding, &response, json::profile_types_response)?
        }
        "LabelNames" => {
            let request = decode(encoding, method, body, json::label_names_request)?;
            let response = t::LabelNamesResponse {
                names: super::label_names(store, request, names).await?,
            };
            reply(encoding, &response, |r| json::names_response(&r.names))?
        }
        "LabelValues" => {
            let request = decode(encoding, method, body, json::label_values_request)?;
            let response = t::LabelValuesResponse {
                names: super::label_values(store, request).await?,
            };
            reply(encoding, &response, |r| json::names_response(&r.names))?
        }
        "Series" => {
            let request = decode(encoding, method, body, json::series_request)?;
            let response = super::series(store, request, names).await?;
            reply(encoding, &response, json::series_response)?
        }
        "SelectMergeStacktraces" => {
            let request = decode(
                encoding,
                method,
                body,
                json::select_merge_stacktraces_request,
            )?;
            let response = super::select_merge_stacktraces(query, request).await?;
            reply(encoding, &response, json::select_merge_stacktraces_response)?
        }
        "SelectMergeSpanProfile" => {
            let request = decode(
                encoding,
                method,
                body,
                json::select_merge_span_profile_request,
            )?;
            let response = super::select_merge_span_profile(query, request).await?;
            reply(
                encoding,
                &response,
                json::select_merge_span_profile_response,
            )?
        }
        "SelectMergeProfile" => {
            let request = decode(encoding, method, body, json::select_merge_profile_request)?;
            let profile = super::select_merge_profile(query, request).await?;
            reply(encoding, &profile, json::pprof_response)?
        }
        "SelectSeries" => {
            let request = decode(encoding, method, body, json::select_series_request)?;
            let response = super::select_series(store, request).await?;
            reply(encoding, &response, json::select_series_response)?
        }
        "Diff" => {
            let request = decode(encoding, method, body, json::diff_request)?;
            let response = super::diff(query, request).await?;
            reply(encoding, &response, json::diff_response)?
        }
        "GetProfileStats" => {
            // The request message is empty; its bytes are not decoded.
            let response = super::profile_stats(store).await?;
            reply(encoding, &response, json::profile_stats_response)?
        }
        other => {
            return Err(ApiError::Unimplemented {
                what: format!(
                    "querier.v1.QuerierService/{}",
                    other.chars().take(60).collect::<String>()
                ),
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use kiln_api::querier::v1 as q;

    use super::*;

    #[test]
    fn profile_id_selectors_are_read_within_their_cap() {
        // `profile_id_selector`: field 8 of SelectMergeStacktracesRequest,
        // 7 of SelectMergeProfileRequest.
        let id = "018c2b5e-3f00-7000-8000-000000000400";
        let read = decode_proto_request::<q::SelectMergeStacktracesRequest>(
            "SelectMergeStacktraces",
            &q::SelectMergeStacktracesRequest {
                profile_id_selector: vec![id.to_owned()],
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .expect("one id");
        assert_eq!(read.profile_id_selector, vec![id.to_owned()]);
        let over = q::SelectMergeProfileRequest {
            profile_id_selector: vec![id.to_owned(); MAX_PROFILE_IDS + 1],
            ..Default::default()
        }
        .encode_to_vec();
        let err = decode_proto_request::<q::SelectMergeProfileRequest>("SelectMergeProfile", &over)
            .unwrap_err();
        assert!(err.to_string().contains("profileIdSelector"), "{err}");
        // In a Diff, each side is checked.
        let side = q::SelectMergeStacktracesRequest {
            profile_id_selector: vec![id.to_owned(); MAX_PROFILE_IDS + 1],
            ..Default::default()
        };
        let diff = q::DiffRequest {
            left: None,
            right: Some(side),
        }
        .encode_to_vec();
        assert!(decode_proto_request::<q::DiffRequest>("Diff", &diff).is_err());
    }
}
