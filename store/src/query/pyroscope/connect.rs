//! `POST /querier.v1.QuerierService/{method}` over the Connect protocol:
//! `application/json` or `application/proto` bodies (gzip or identity),
//! answered in the same encoding; errors in Connect's JSON error shape.

use std::time::Instant;

use axum::extract::{Path, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use kiln_api::types::v1 as t;
use kiln_storage::Store;
use prost::Message;
use serde_json::Value;

use super::json;
use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::body::{decode_content_encoding, read_body};
use crate::wire::content_type::media_type;

/// The body encodings Connect unary calls use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Json,
    Proto,
}

/// The metrics endpoint name of a method (fixed strings for label values).
fn endpoint(method: &str) -> &'static str {
    match method {
        "ProfileTypes" => "querier_profile_types",
        "LabelNames" => "querier_label_names",
        "LabelValues" => "querier_label_values",
        "Series" => "querier_series",
        "SelectMergeStacktraces" => "querier_select_merge_stacktraces",
        "SelectMergeProfile" => "querier_select_merge_profile",
        "SelectSeries" => "querier_select_series",
        "Diff" => "querier_diff",
        "GetProfileStats" => "querier_get_profile_stats",
        _ => "querier_other",
    }
}

/// The handler for every querier method.
pub async fn querier(
    State(state): State<AppState>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    let started = Instant::now();
    let endpoint = endpoint(&method);
    let result = match state.admit_query() {
        Ok(_permit) => match state.store() {
            Ok(store) => call(store, &state, &method, request).await,
            Err(err) => Err(err),
        },
        Err(err) => Err(err),
    };
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

fn encoding(request: &Request) -> Result<Encoding, ApiError> {
    let content_type = media_type(request.headers());
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

/// The request message, from JSON or protobuf.
fn decode<M: Message + Default>(
    encoding: Encoding,
    body: &[u8],
    message_type: &'static str,
    from_json: impl FnOnce(&Value) -> Result<M, ApiError>,
) -> Result<M, ApiError> {
    match encoding {
        Encoding::Json => from_json(&json::parse_body(body, message_type)?),
        Encoding::Proto => M::decode(body).map_err(|e| ApiError::BadMessage {
            message_type,
            message: e.to_string(),
        }),
    }
}

/// The reply in the request's encoding.
fn reply<M: Message>(
    encoding: Encoding,
    message: &M,
    to_json: impl FnOnce(&M) -> Value,
) -> Response {
    match encoding {
        Encoding::Json => (
            [(header::CONTENT_TYPE, "application/json")],
            to_json(message).to_string(),
        )
            .into_response(),
        Encoding::Proto => (
            [(header::CONTENT_TYPE, "application/proto")],
            message.encode_to_vec(),
        )
            .into_response(),
    }
}

async fn call(
    store: &Store,
    state: &AppState,
    method: &str,
    request: Request,
) -> Result<Response, ApiError> {
    let encoding = encoding(&request)?;
    let limit = state.limits().max_request_bytes;
    let headers = request.headers().clone();
    let raw = read_body(request.into_body(), limit, state.body_read_timeout()).await?;
    let body = decode_content_encoding(&headers, raw, limit)?;
    Ok(match method {
        "ProfileTypes" => {
            let request = decode(
                encoding,
                &body,
                "querier.v1.ProfileTypesRequest",
                json::profile_types_request,
            )?;
            let response = super::profile_types(store, request).await?;
            reply(encoding, &response, json::profile_types_response)
        }
        "LabelNames" => {
            let request = decode(
                encoding,
                &body,
                "types.v1.LabelNamesRequest",
                json::label_names_request,
            )?;
            let response = t::LabelNamesResponse {
                names: super::label_names(store, request).await?,
            };
            reply(encoding, &response, |r| json::names_response(&r.names))
        }
        "LabelValues" => {
            let request = decode(
                encoding,
                &body,
                "types.v1.LabelValuesRequest",
                json::label_values_request,
            )?;
            let response = t::LabelValuesResponse {
                names: super::label_values(store, request).await?,
            };
            reply(encoding, &response, |r| json::names_response(&r.names))
        }
        "Series" => {
            let request = decode(
                encoding,
                &body,
                "querier.v1.SeriesRequest",
                json::series_request,
            )?;
            let response = super::series(store, request).await?;
            reply(encoding, &response, json::series_response)
        }
        "SelectMergeStacktraces" => {
            let request = decode(
                encoding,
                &body,
                "querier.v1.SelectMergeStacktracesRequest",
                json::select_merge_stacktraces_request,
            )?;
            let response = super::select_merge_stacktraces(store, request).await?;
            reply(encoding, &response, json::select_merge_stacktraces_response)
        }
        "SelectMergeProfile" => {
            let request = decode(
                encoding,
                &body,
                "querier.v1.SelectMergeProfileRequest",
                json::select_merge_profile_request,
            )?;
            let profile = super::select_merge_profile(store, request).await?;
            reply(encoding, &profile, json::pprof_response)
        }
        "SelectSeries" => {
            let request = decode(
                encoding,
                &body,
                "querier.v1.SelectSeriesRequest",
                json::select_series_request,
            )?;
            let response = super::select_series(store, request).await?;
            reply(encoding, &response, json::select_series_response)
        }
        "Diff" => {
            let request = decode(
                encoding,
                &body,
                "querier.v1.DiffRequest",
                json::diff_request,
            )?;
            let response = super::diff(store, request).await?;
            reply(encoding, &response, json::diff_response)
        }
        "GetProfileStats" => {
            // The request message is empty; its bytes are not read.
            let response = super::profile_stats(store).await?;
            reply(encoding, &response, json::profile_stats_response)
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
