//! gRPC ingest services: Parca's `WriteRaw` and Pyroscope's `Push`.

use kiln_api::parca::profilestore::v1alpha1::profile_store_service_server::{
    ProfileStoreService, ProfileStoreServiceServer,
};
use kiln_api::parca::profilestore::v1alpha1::{WriteRawRequest, WriteRawResponse};
use kiln_api::push::v1::pusher_service_server::{PusherService, PusherServiceServer};
use kiln_api::push::v1::{PushRequest, PushResponse};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::error::ApiError;
use crate::ingest::{uploads_from_push, uploads_from_write_raw};
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
    /// decoded the message ([`crate::grpc_admission`]), and are held until
    /// this returns.
    async fn run(
        &self,
        endpoint: &'static str,
        work: impl AsyncFnOnce(&AppState) -> Result<(), ApiError>,
    ) -> Result<(), Status> {
        work(&self.state).await.map_err(|err| {
            self.state
                .metrics()
                .record_rejection(endpoint, err.reason());
            tracing::debug!(error = %err, endpoint, "grpc ingest refused");
            err.to_status()
        })
    }
}

#[tonic::async_trait]
impl ProfileStoreService for IngestService {
    async fn write_raw(
        &self,
        request: Request<WriteRawRequest>,
    ) -> Result<Response<WriteRawResponse>, Status> {
        let request = request.into_inner();
        self.run("write_raw", async move |state: &AppState| {
            let uploads = uploads_from_write_raw(request, state.limits())?;
            state.ingest("write_raw", uploads).await
        })
        .await?;
        Ok(Response::new(WriteRawResponse {}))
    }
}

#[tonic::async_trait]
impl PusherService for IngestService {
    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let request = request.into_inner();
        self.run("push_grpc", async move |state: &AppState| {
            let uploads = uploads_from_push(request, state.limits())?;
            state.ingest("push_grpc", uploads).await
        })
        .await?;
        Ok(Response::new(PushResponse {}))
    }
}

/// Builds both tonic servers with the request size limit and gzip accepted.
/// Serve them through [`crate::grpc_admission::serve_admitted`], which
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
