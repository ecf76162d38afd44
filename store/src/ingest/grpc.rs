//! gRPC ingest services: Parca's `WriteRaw` and Pyroscope's `Push`.

use kiln_api::parca::profilestore::v1alpha1::profile_store_service_server::{
    ProfileStoreService, ProfileStoreServiceServer,
};
use kiln_api::parca::profilestore::v1alpha1::{self as parca, WriteRawRequest, WriteRawResponse};
use kiln_api::push::v1::pusher_service_server::{PusherService, PusherServiceServer};
use kiln_api::push::v1::{self as push, PushRequest, PushResponse};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::error::ApiError;
use crate::ingest::series_batch::{
    BatchReport, SERIES_STATUS_METADATA, SeriesFailure, series_from_push, series_from_write_raw,
};
use crate::state::AppState;

/// The tonic server for WriteRaw.
pub type WriteRawServer = ProfileStoreServiceServer<IngestService>;
/// The tonic server for Push.
pub type PushServer = PusherServiceServer<IngestService>;

/// Implements both ingest services over the shared state.
#[derive(Debug, Clone)]
pub struct IngestService {
    state: AppState,
}

impl IngestService {
    /// Runs one call. Its ingest slot and memory were taken before tonic
    /// decoded the message ([`crate::ingest::grpc_admission`]), and are
    /// held until this returns. A request stored in part answers, per
    /// series, what was not stored, so the client resends only that: in
    /// the response when the client sent `kiln-series-status: 1`, else as
    /// one gRPC status like Parca's and Pyroscope's.
    async fn run(
        &self,
        endpoint: &'static str,
        per_series: bool,
        work: impl AsyncFnOnce(&AppState) -> Result<BatchReport, ApiError>,
    ) -> Result<Vec<SeriesFailure>, Status> {
        let metrics = self.state.metrics();
        let report = work(&self.state).await.map_err(|err| {
            metrics.record_rejection(endpoint, err.reason());
            tracing::debug!(error = %err, endpoint, "grpc ingest refused");
            err.to_status()
        })?;
        for failure in &report.failures {
            metrics.record_rejection(endpoint, failure.reason);
        }
        if !per_series && let Some(status) = report.status() {
            tracing::debug!(status = %status.message(), endpoint, "grpc ingest stored in part");
            return Err(status);
        }
        Ok(report.failures)
    }
}

/// Whether the client asked for per-series statuses in the response.
fn wants_series_status(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get(SERIES_STATUS_METADATA)
        .is_some_and(|v| v.as_bytes() == b"1")
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[tonic::async_trait]
impl ProfileStoreService for IngestService {
    async fn write_raw(
        &self,
        request: Request<WriteRawRequest>,
    ) -> Result<Response<WriteRawResponse>, Status> {
        let per_series = wants_series_status(request.metadata());
        let request = request.into_inner();
        let failures = self
            .run("write_raw", per_series, async move |state: &AppState| {
                let batch = series_from_write_raw(request, state.limits())?;
                state.ingest_series("write_raw", batch).await
            })
            .await?;
        Ok(Response::new(WriteRawResponse {
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
        }))
    }
}

#[tonic::async_trait]
impl PusherService for IngestService {
    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let per_series = wants_series_status(request.metadata());
        let request = request.into_inner();
        let failures = self
            .run("push_grpc", per_series, async move |state: &AppState| {
                let batch = series_from_push(request, state.limits())?;
                state.ingest_series("push_grpc", batch).await
            })
            .await?;
        Ok(Response::new(PushResponse {
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
        }))
    }
}

/// Builds both tonic servers with the request size limit and gzip accepted.
/// Serve them through [`crate::ingest::grpc_admission::serve_admitted`], which
/// admits each message before it is decoded.
pub fn ingest_servers(state: &AppState) -> (WriteRawServer, PushServer) {
    let service = IngestService {
        state: state.clone(),
    };
    let limit = state.limits().max_request_bytes;
    let write_raw = ProfileStoreServiceServer::new(service.clone())
        .max_decoding_message_size(limit)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    let push = PusherServiceServer::new(service)
        .max_decoding_message_size(limit)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    (write_raw, push)
}
