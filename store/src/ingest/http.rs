//! HTTP ingest: Pyroscope's `POST /ingest` and `push.v1.PusherService/Push`
//! over the Connect protocol (binary or JSON, gzip or identity). gRPC calls
//! to the same Push path are handed to the tonic service.

use axum::body::Body;
use axum::extract::{Multipart, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_api::push::v1::PushRequest;
use prost::Message;

use crate::error::ApiError;
use crate::ingest::grpc::PushServer;
use crate::ingest::grpc::{scan_limits, split_bytes, upload_error};
use crate::ingest::message_scan;
use crate::ingest::push_json::{push_json_bytes, push_request_from_json};
use crate::ingest::pyroscope::{
    BodyFormat, IngestBody, MultipartParts, build_upload, parse_ingest_params,
};
use crate::ingest::upload::{check_label_limits, uploads_from_push};
use crate::server::auth::writer_scope;
use crate::state::{AppState, WritePermit};
use crate::wire::body::{decode_content_encoding_reserving, read_body_reserving};
use crate::wire::content_type::{content_type, is_grpc};
use crate::wire::time::now_ms;

/// `POST /ingest`.
pub async fn pyroscope_ingest(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    match pyroscope_ingest_inner(&state, query.as_deref().unwrap_or(""), request).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(err) => {
            state.metrics().record_rejection("ingest", err.reason());
            tracing::debug!(error = %err, "ingest refused");
            err.into_response()
        }
    }
}

async fn pyroscope_ingest_inner(
    state: &AppState,
    query: &str,
    request: Request,
) -> Result<(), ApiError> {
    let writer = writer_scope(request.extensions())?;
    // The slot first, then the body's memory as it arrives: a slow body
    // holds only what it has sent.
    let mut permit = state.admit_write_unsized()?;
    let limit = state.limits().max_request_bytes;
    let content_type = content_type(request.headers());
    let params = parse_ingest_params(query, Some(&content_type), now_ms())?;
    let body = if params.format == BodyFormat::Multipart {
        IngestBody::Multipart(read_multipart(state, request, &mut permit).await?)
    } else {
        let headers = request.headers().clone();
        let mut reserve = |bytes| permit.reserve_more(bytes);
        let raw = read_body_reserving(
            request.into_body(),
            limit,
            state.body_read_timeout(),
            &mut reserve,
        )
        .await?;
        let body = decode_content_encoding_reserving(&headers, raw, limit, &mut reserve)?;
        // One converted copy, as large as the body: text to a profile.
        reserve(body.len())?;
        IngestBody::Raw(body)
    };
    let decode_limits = state.decode_limits().clone();
    // One hop to the blocking pool: the conversion, which reserves what it
    // decodes on the permit, and the store's checks, log and apply, under
    // the turn taken here. The permit comes back to be dropped, once the
    // store has the upload.
    let turn = state.ingest_turn().await?;
    let hop = state.clone();
    let (result, permit) = tokio::task::spawn_blocking(move || {
        let upload = build_upload(&params, body, &decode_limits, &mut |bytes| {
            permit.reserve_more(bytes)
        });
        let result = upload.map_err(ApiError::from).and_then(|upload| {
            // Its series labels come from `name`: checked here, once, as
            // every protocol checks them where its uploads are built.
            check_label_limits(&upload.labels, hop.limits())?;
            hop.ingest_blocking("ingest", &writer, Some(turn), vec![upload])
        });
        (result, permit)
    })
    .await
    .map_err(|e| ApiError::Worker {
        work: "storing the upload",
        message: e.to_string(),
    })?;
    drop(permit);
    result
}

async fn read_multipart(
    state: &AppState,
    request: Request,
    permit: &mut WritePermit,
) -> Result<MultipartParts, ApiError> {
    let limit = state.limits().max_request_bytes;
    let bad = |message: String| ApiError::Ingest {
        source: crate::ingest::pyroscope::IngestError::BadMultipart { message },
    };
    let (parts, body) = request.into_parts();
    let mut reserve = |bytes| permit.reserve_more(bytes);
    let body = read_body_reserving(body, limit, state.body_read_timeout(), &mut reserve).await?;
    // The parts are copied out of the body: at most its length again.
    reserve(body.len())?;
    let request = Request::from_parts(parts, Body::from(body));
    let mut multipart = <Multipart as axum::extract::FromRequest<()>>::from_request(request, &())
        .await
        .map_err(|e| bad(e.body_text()))?;
    let mut parts = MultipartParts::default();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| bad(e.body_text()))?
    {
        let name = field.name().unwrap_or("").to_owned();
        let data = Vec::from(field.bytes().await.map_err(|e| bad(e.body_text()))?);
        match name.as_str() {
            "profile" => parts.profile = data,
            "prev_profile" => parts.prev_profile = Some(data),
            "sample_type_config" => parts.sample_type_config = Some(data),
            // Unknown fields are ignored, as Pyroscope does.
            _ => {}
        }
    }
    Ok(parts)
}

/// `POST /push.v1.PusherService/Push`: Connect unary, or gRPC (forwarded).
pub async fn push(state: AppState, grpc: PushServer, request: Request) -> Response {
    let content_type = content_type(request.headers());
    if is_grpc(&content_type) {
        return crate::ingest::grpc_admission::serve_admitted(&state, "push_grpc", grpc, request)
            .await;
    }
    match push_connect(&state, &content_type, request).await {
        Ok(response) => response,
        Err(err) => {
            state.metrics().record_rejection("push", err.reason());
            tracing::debug!(error = %err, "push refused");
            err.into_connect_response()
        }
    }
}

async fn push_connect(
    state: &AppState,
    content_type: &str,
    request: Request,
) -> Result<Response, ApiError> {
    let writer = writer_scope(request.extensions())?;
    let mut permit = state.admit_write_unsized()?;
    let limit = state.limits().max_request_bytes;
    let headers = request.headers().clone();
    let mut reserve = |bytes| permit.reserve_more(bytes);
    let raw = read_body_reserving(
        request.into_body(),
        limit,
        state.body_read_timeout(),
        &mut reserve,
    )
    .await?;
    let body = decode_content_encoding_reserving(&headers, raw, limit, &mut reserve)?;
    let format = match content_type.split(';').next().unwrap_or("").trim() {
        "application/proto" | "application/protobuf" | "application/x-protobuf" => {
            PushFormat::Proto
        }
        "application/json" => PushFormat::Json,
        other => {
            return Err(ApiError::UnsupportedMediaType {
                content_type: other.chars().take(60).collect(),
                expected: "application/proto, application/json or application/grpc",
            });
        }
    };
    // Counted before decoding and reserved at its decoded size; decoded
    // off the async workers.
    let limits = state.limits().clone();
    let decoded_bytes = match format {
        PushFormat::Proto => {
            let scan =
                message_scan::scan(&body, &message_scan::shapes::PUSH, &scan_limits(&limits))
                    .map_err(upload_error)?;
            split_bytes(&scan)
        }
        PushFormat::Json => push_json_bytes(body.len(), &limits),
    };
    reserve(decoded_bytes)?;
    let turn = state.ingest_turn().await?;
    let hop = state.clone();
    tokio::task::spawn_blocking(move || {
        let request = match format {
            PushFormat::Proto => {
                PushRequest::decode(body.as_slice()).map_err(|e| ApiError::BadMessage {
                    message_type: "push.v1.PushRequest protobuf",
                    message: e.to_string(),
                })?
            }
            PushFormat::Json => push_request_from_json(&body, &limits)?,
        };
        let uploads = uploads_from_push(request, &limits)?;
        hop.ingest_blocking("push", &writer, Some(turn), uploads)
    })
    .await
    .map_err(|e| ApiError::Worker {
        work: "storing the Push request",
        message: e.to_string(),
    })??;
    drop(permit);
    Ok(if format == PushFormat::Json {
        ([(header::CONTENT_TYPE, "application/json")], "{}").into_response()
    } else {
        // An empty PushResponse encodes to zero bytes.
        (
            [(header::CONTENT_TYPE, "application/proto")],
            Vec::<u8>::new(),
        )
            .into_response()
    })
}

/// The body encodings of Push over Connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PushFormat {
    Proto,
    Json,
}
