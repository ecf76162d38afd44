//! gRPC ingest services: Parca's `WriteRaw` and Pyroscope's `Push`.
//!
//! tonic hands the handler the message's bytes, not a decoded request: a
//! request is counted on the wire first ([`message_scan`]), refused there
//! when it holds more series or profiles than the store takes at once, and
//! decoded on the blocking pool only after its decoded size is reserved
//! from the ingest budget. prost's generated server would decode on an
//! async worker, with nothing reserved, whatever the message holds.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::size_of;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::Request;
use bytes::{Buf, Bytes};
use kiln_api::parca::profilestore::v1alpha1::{self as parca, WriteRawRequest, WriteRawResponse};
use kiln_api::push::v1::{self as push, PushRequest, PushResponse};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder};
use tonic::{Response, Status};

use crate::error::ApiError;
use crate::ingest::message_scan::{self, Limit, OverLimit, Scan, Shape};
use crate::ingest::series_batch::{
    BatchReport, SERIES_STATUS_METADATA, SeriesFailure, SeriesUploads, series_from_push,
    series_from_write_raw,
};
use crate::ingest::upload::{ProfileUpload, UploadError};
use crate::server::auth::writer_scope;
use crate::state::{AppState, SharedPermit};
use kiln_storage::WriterScope;

/// The gRPC server for WriteRaw.
pub type WriteRawServer = IngestServer;
/// The gRPC server for Push.
pub type PushServer = IngestServer;

/// Which ingest method a server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    WriteRaw,
    Push,
}

impl Method {
    fn endpoint(self) -> &'static str {
        match self {
            Self::WriteRaw => "write_raw",
            Self::Push => "push_grpc",
        }
    }

    fn shape(self) -> &'static Shape {
        match self {
            Self::WriteRaw => &message_scan::shapes::WRITE_RAW,
            Self::Push => &message_scan::shapes::PUSH,
        }
    }

    fn message_type(self) -> &'static str {
        match self {
            Self::WriteRaw => "parca.profilestore.v1alpha1.WriteRawRequest",
            Self::Push => "push.v1.PushRequest",
        }
    }
}

/// One ingest method over gRPC, as a tower service of HTTP requests. Serve
/// it through [`crate::ingest::grpc_admission::serve_admitted`], which
/// admits each message before anything here runs.
#[derive(Debug, Clone)]
pub struct IngestServer {
    state: AppState,
    method: Method,
}

/// Both servers.
pub fn ingest_servers(state: &AppState) -> (WriteRawServer, PushServer) {
    let server = |method| IngestServer {
        state: state.clone(),
        method,
    };
    (server(Method::WriteRaw), server(Method::Push))
}

impl tower::Service<Request> for IngestServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let (state, method) = (self.state.clone(), self.method);
        let limit = state.limits().max_request_bytes;
        Box::pin(async move {
            let handler = Handler { state, method };
            Ok(match method {
                Method::WriteRaw => {
                    grpc::<WriteRawResponse>(limit)
                        .unary(Unary::new(handler), request)
                        .await
                }
                Method::Push => {
                    grpc::<PushResponse>(limit)
                        .unary(Unary::new(handler), request)
                        .await
                }
            })
        })
    }
}

fn grpc<R: Message + Default + Send + 'static>(limit: usize) -> tonic::server::Grpc<RawCodec<R>> {
    tonic::server::Grpc::new(RawCodec(PhantomData))
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(limit)
}

/// What both methods share: the state and which method it is.
#[derive(Debug, Clone)]
struct Handler {
    state: AppState,
    method: Method,
}

/// A [`Handler`] answering with `R`.
struct Unary<R> {
    handler: Handler,
    reply: PhantomData<fn() -> R>,
}

impl<R> Unary<R> {
    fn new(handler: Handler) -> Self {
        Self {
            handler,
            reply: PhantomData,
        }
    }
}

/// A response carrying per-series statuses.
trait SeriesReply: Message + Default + Send + 'static {
    fn from_failures(failures: Vec<SeriesFailure>) -> Self;
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl SeriesReply for WriteRawResponse {
    fn from_failures(failures: Vec<SeriesFailure>) -> Self {
        Self {
            kiln_series_status: failures
                .into_iter()
                .map(|f| parca::KilnSeriesStatus {
                    series: saturating_u32(f.series),
                    stored_profiles: saturating_u32(f.stored_profiles),
                    code: f.code as i32,
                    reason: f.reason.to_string(),
                    message: f.message,
                })
                .collect(),
        }
    }
}

impl SeriesReply for PushResponse {
    fn from_failures(failures: Vec<SeriesFailure>) -> Self {
        Self {
            kiln_series_status: failures
                .into_iter()
                .map(|f| push::KilnSeriesStatus {
                    series: saturating_u32(f.series),
                    stored_profiles: saturating_u32(f.stored_profiles),
                    code: f.code as i32,
                    reason: f.reason.to_string(),
                    message: f.message,
                })
                .collect(),
        }
    }
}

impl<R: SeriesReply> tonic::server::UnaryService<Bytes> for Unary<R> {
    type Response = R;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, Status>> + Send + 'static>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let handler = self.handler.clone();
        Box::pin(async move {
            let per_series = wants_series_status(request.metadata());
            let resend = crate::ingest::peer_keys::retry_attempt(request.metadata());
            let permit = request.extensions().get::<SharedPermit>().cloned();
            let writer = writer_scope(request.extensions());
            let endpoint = handler.method.endpoint();
            let metrics = handler.state.metrics();
            let report = handler
                .run(permit, writer, resend, request.into_inner())
                .await
                .map_err(|err| {
                    metrics.record_rejection(endpoint, err.reason());
                    tracing::debug!(error = %err, endpoint, "grpc ingest refused");
                    err.to_status()
                })?;
            for failure in &report.failures {
                metrics.record_rejection(endpoint, failure.reason);
            }
            // A request stored in part answers, per series, what was not
            // stored, so the client resends only that: in the response when
            // it sent `kiln-series-status: 1`, else as one gRPC status like
            // Parca's and Pyroscope's.
            if !per_series && let Some(status) = report.status() {
                tracing::debug!(status = %status.message(), endpoint, "grpc ingest stored in part");
                return Err(status);
            }
            Ok(Response::new(R::from_failures(report.failures)))
        })
    }
}

impl Handler {
    /// Counts the message on the wire, reserves what decoding and splitting
    /// it take, then decodes, splits and stores it series by series in one
    /// hop to the blocking pool. The slot and the body's memory were taken before
    /// tonic read it ([`crate::ingest::grpc_admission`]) and are held until
    /// this returns.
    async fn run(
        &self,
        permit: Option<SharedPermit>,
        writer: Result<WriterScope, ApiError>,
        resend: Option<u32>,
        body: Bytes,
    ) -> Result<BatchReport, ApiError> {
        let state = &self.state;
        let writer = writer?;
        let Some(permit) = permit else {
            return Err(ApiError::Worker {
                work: "storing a gRPC ingest request",
                message: "the request was not admitted".to_owned(),
            });
        };
        let method = self.method;
        let limits = state.limits().clone();
        let scan = message_scan::scan(&body, method.shape(), &scan_limits(&limits))
            .map_err(upload_error)?;
        permit.reserve_more(split_bytes(&scan))?;
        // One hop to the blocking pool: the decode, then, when no profile
        // carries an idempotency key, every profile's write, the first
        // under the turn taken here. Keyed profiles are stored one hop
        // each, through the store's key check, once the decode is back.
        let turn = state.ingest_turn().await?;
        let hop = state.clone();
        let endpoint = method.endpoint();
        let hop_writer = writer.clone();
        let stored = tokio::task::spawn_blocking(move || {
            let batch = decode_and_split(method, &body, &limits)?;
            if batch.iter().any(|s| s.keys.iter().any(Option::is_some)) {
                drop(turn);
                return Ok(Err(batch));
            }
            hop.ingest_series_blocking(endpoint, &hop_writer, turn, batch)
                .map(Ok)
        })
        .await
        .map_err(|e| ApiError::Worker {
            work: "storing a gRPC ingest request",
            message: e.to_string(),
        })??;
        match stored {
            Ok(report) => Ok(report),
            Err(keyed) => state.ingest_series(endpoint, &writer, keyed, resend).await,
        }
    }
}

/// The wire scan's limits for WriteRaw and Push: every series must hold a
/// profile, so a request has no more series than profiles.
pub(crate) fn scan_limits(limits: &crate::config::Limits) -> message_scan::Limits {
    message_scan::Limits {
        series: limits.max_profiles_per_request,
        profiles: limits.max_profiles_per_request,
        samples: limits.max_samples_per_profile,
        stack_depth: 0,
        table_entries: 0,
    }
}

/// The request's refusal for a count over its limit.
pub(crate) fn upload_error(over: OverLimit) -> UploadError {
    match over.limit_kind {
        Limit::Profiles => UploadError::TooManyProfiles { limit: over.limit },
        _ => UploadError::TooManySeries {
            what: over.what,
            limit: over.limit,
        },
    }
}

/// What decoding a scanned request and splitting it into series take: the
/// decoded message, and per series and per profile what
/// [`series_from_write_raw`] builds (the profile bytes and labels move).
pub(crate) fn split_bytes(scan: &Scan) -> usize {
    let series = scan.count("series");
    let profiles = scan.count("profiles");
    let per_profile = size_of::<ProfileUpload>() + size_of::<Option<String>>();
    scan.decoded_bytes
        .saturating_add(series.saturating_mul(size_of::<SeriesUploads>()))
        .saturating_add(profiles.saturating_mul(per_profile))
}

fn decode_and_split(
    method: Method,
    body: &[u8],
    limits: &crate::config::Limits,
) -> Result<Vec<SeriesUploads>, ApiError> {
    let bad = |e: prost::DecodeError| ApiError::BadMessage {
        message_type: method.message_type(),
        message: e.to_string(),
    };
    Ok(match method {
        Method::WriteRaw => {
            series_from_write_raw(WriteRawRequest::decode(body).map_err(bad)?, limits)?
        }
        Method::Push => series_from_push(PushRequest::decode(body).map_err(bad)?, limits)?,
    })
}

/// Whether the client asked for per-series statuses in the response.
fn wants_series_status(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get(SERIES_STATUS_METADATA)
        .is_some_and(|v| v.as_bytes() == b"1")
}

/// Encodes the response with prost and decodes nothing: the handler gets
/// the request's bytes, to count them before decoding.
#[derive(Debug)]
pub(crate) struct RawCodec<R>(PhantomData<fn() -> R>);

impl<R: Message + Default + Send + 'static> Codec for RawCodec<R> {
    type Encode = R;
    type Decode = Bytes;
    type Encoder = tonic_prost::ProstEncoder<R>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

/// Hands over a gRPC message's bytes as they are (inflated by the
/// admission and bounded by the decoding size limit).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
