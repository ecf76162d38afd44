//! The IO edges of OTLP ingest: gRPC `ProfilesService/Export` and HTTP
//! `POST /v1development/profiles`.
//!
//! gRPC goes through tonic's server machinery with a codec that hands over
//! the raw message bytes, because the request layout depends on the
//! revision, which is only known after looking at the bytes.

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::{Buf, Bytes};
use kiln_api::opentelemetry::proto::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceResponse,
};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder};

use super::model::uploads_from_batch;
use super::{OtlpLimits, decode_export_reserving};
use crate::error::ApiError;
use crate::ingest::upload::ProfileUpload;
use crate::server::auth::writer_scope;
use crate::state::{AppState, SharedPermit};
use crate::wire::body::{decode_content_encoding_reserving, read_body_reserving};
use crate::wire::content_type::media_type;
use kiln_storage::{IngestTurn, WriterScope};

/// Limits for OTLP decoding derived from the server's.
fn otlp_limits(state: &AppState) -> OtlpLimits {
    OtlpLimits {
        max_samples: state.limits().max_samples_per_profile,
        max_stack_depth: state.decode_limits().max_stack_depth,
        ..OtlpLimits::default()
    }
}

/// Decodes, converts and stores one export request, reserving what it
/// decodes on `permit`, in one hop to the blocking pool. Profiles are
/// stored in order; when a later one is refused after earlier ones were
/// kept, the answer is a partial success naming how many were rejected.
async fn export(
    state: &AppState,
    protocol: &'static str,
    body: Bytes,
    permit: SharedPermit,
    writer: &WriterScope,
) -> Result<ExportProfilesServiceResponse, ApiError> {
    let limits = state.limits().clone();
    let otlp_limits = otlp_limits(state);
    let decode_limits = state.decode_limits().clone();
    let turn = state.ingest_turn().await?;
    let hop = state.clone();
    let writer = writer.clone();
    tokio::task::spawn_blocking(move || {
        let decoded =
            decode_export_reserving(&body, &otlp_limits, |bytes| permit.reserve_more(bytes))??;
        let uploads = uploads_from_batch(
            &decoded.batch,
            &limits,
            &otlp_limits,
            &decode_limits,
            &mut |bytes| permit.reserve_more(bytes),
        )?;
        let revision = decoded.revision_label();
        tracing::debug!(revision, profiles = uploads.len(), "otlp export decoded");
        hop.metrics().record_otlp_revision(revision);
        store_in_order(&hop, protocol, &writer, turn, uploads)
    })
    .await
    .map_err(|e| ApiError::Worker {
        work: "storing the OTLP export",
        message: e.to_string(),
    })?
}

/// Stores `uploads` in order on this blocking-pool thread, the first
/// under `turn`; a refusal after a profile was stored is a partial
/// success when it is the client's fault.
fn store_in_order(
    state: &AppState,
    protocol: &'static str,
    writer: &WriterScope,
    turn: IngestTurn,
    uploads: Vec<Result<ProfileUpload, ApiError>>,
) -> Result<ExportProfilesServiceResponse, ApiError> {
    let total = uploads.len();
    let mut turn = Some(turn);
    for (stored, upload) in uploads.into_iter().enumerate() {
        let result = match upload {
            Ok(upload) => state.ingest_blocking(protocol, writer, turn.take(), vec![upload]),
            Err(err) => Err(err),
        };
        if let Err(err) = result {
            let client_fault = err.http_status().is_client_error();
            if stored == 0 || !client_fault {
                return Err(err);
            }
            return Ok(ExportProfilesServiceResponse {
                partial_success: Some(ExportProfilesPartialSuccess {
                    rejected_profiles: i64::try_from(total - stored).unwrap_or(i64::MAX),
                    error_message: err.to_string(),
                }),
            });
        }
    }
    Ok(ExportProfilesServiceResponse::default())
}

/// `POST /v1development/profiles` (OTLP/HTTP, binary protobuf, gzip or not).
pub async fn export_http(State(state): State<AppState>, request: Request) -> Response {
    match export_http_inner(&state, request).await {
        Ok(reply) => (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            reply.encode_to_vec(),
        )
            .into_response(),
        Err(err) => {
            state.metrics().record_rejection("otlp_http", err.reason());
            tracing::debug!(error = %err, "otlp http export refused");
            err.into_response()
        }
    }
}

async fn export_http_inner(
    state: &AppState,
    request: Request,
) -> Result<ExportProfilesServiceResponse, ApiError> {
    let writer = writer_scope(request.extensions())?;
    // The slot first, then the body's memory as it arrives and as it
    // inflates: a slow or compressed body holds only what it has become.
    let permit = SharedPermit::new(state.admit_write_unsized()?);
    let content_type = media_type(request.headers());
    if content_type != "application/x-protobuf" && content_type != "application/protobuf" {
        return Err(ApiError::UnsupportedMediaType {
            content_type: content_type.chars().take(60).collect(),
            expected: "application/x-protobuf (OTLP JSON is not supported)",
        });
    }
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
    export(state, "otlp_http", body.into(), permit, &writer).await
}

/// `ProfilesService/Export` over gRPC.
pub async fn export_grpc(state: AppState, request: Request) -> Response {
    let limit = state.limits().max_request_bytes;
    let admitting = state.clone();
    let service = tower::service_fn(move |request: Request| {
        let state = state.clone();
        async move {
            let mut grpc = tonic::server::Grpc::new(RawRequestCodec)
                .accept_compressed(CompressionEncoding::Gzip)
                .send_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(limit);
            Ok::<_, std::convert::Infallible>(grpc.unary(ExportGrpc { state }, request).await)
        }
    });
    crate::ingest::grpc_admission::serve_admitted(&admitting, "otlp_grpc", service, request).await
}

/// The unary handler tonic calls with the raw request bytes.
struct ExportGrpc {
    state: AppState,
}

impl tonic::server::UnaryService<Bytes> for ExportGrpc {
    type Response = ExportProfilesServiceResponse;
    type Future = std::pin::Pin<
        Box<
            dyn Future<Output = Result<tonic::Response<Self::Response>, tonic::Status>>
                + Send
                + 'static,
        >,
    >;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let state = self.state.clone();
        Box::pin(async move {
            // Admitted before tonic decoded it (`grpc_admission`), which
            // left the permit for what the export decodes.
            let permit = request.extensions().get::<SharedPermit>().cloned();
            let writer = writer_scope(request.extensions());
            let result = match (permit, writer) {
                (_, Err(err)) => Err(err),
                (Some(permit), Ok(writer)) => {
                    export(&state, "otlp_grpc", request.into_inner(), permit, &writer).await
                }
                (None, Ok(_)) => Err(ApiError::Worker {
                    work: "storing the OTLP export",
                    message: "the request was not admitted".to_owned(),
                }),
            };
            result.map(tonic::Response::new).map_err(|err| {
                state.metrics().record_rejection("otlp_grpc", err.reason());
                tracing::debug!(error = %err, "otlp grpc export refused");
                err.to_status()
            })
        })
    }
}

/// Encodes the (fixed) response with prost, decodes nothing: the request
/// bytes go to [`decode_export_reserving`].
#[derive(Debug, Clone, Copy, Default)]
struct RawRequestCodec;

impl Codec for RawRequestCodec {
    type Encode = ExportProfilesServiceResponse;
    type Decode = Bytes;
    type Encoder = tonic_prost::ProstEncoder<ExportProfilesServiceResponse>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

/// Hands over a gRPC message's bytes as they are (already un-gzipped by
/// tonic and bounded by the decoding size limit).
#[derive(Debug, Clone, Copy, Default)]
struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
