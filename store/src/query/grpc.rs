//! `kiln.query.v1.QueryService`: the gRPC form of part of the HTTP query API.

use std::time::Instant;

use kiln_api::kiln::query::v1::query_service_server::{QueryService, QueryServiceServer};
use kiln_api::kiln::query::v1::{
    LabelNamesRequest, LabelNamesResponse, LabelValuesRequest, LabelValuesResponse,
    ProfileTypesRequest, ProfileTypesResponse, SelectMergePprofRequest, SelectMergePprofResponse,
    TimeRange as WireRange,
};
use kiln_engine::model::TimeRange;
use kiln_storage::Store;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::error::ApiError;
use crate::query::selection::{matchers, merged_pprof_gzip, resolve};
use crate::state::AppState;
use crate::wire::time::inclusive_range_ms;

/// The tonic server for the query service.
pub type QueryServer = QueryServiceServer<QueryGrpc>;

/// Implements the query service over the shared state.
#[derive(Debug, Clone)]
pub struct QueryGrpc {
    state: AppState,
}

/// Builds the query server (responses may be gzipped for clients that ask;
/// requests at most 1 MiB, as sent and inflated).
pub fn query_server(state: &AppState) -> QueryServer {
    QueryServiceServer::new(QueryGrpc {
        state: state.clone(),
    })
    .accept_compressed(CompressionEncoding::Gzip)
    .send_compressed(CompressionEncoding::Gzip)
    .max_encoding_message_size(usize::MAX)
    // A request is a selector and a range: the same cap as Connect's
    // bodies, applied by tonic after inflating.
    .max_decoding_message_size(crate::query::pyroscope::connect::MAX_QUERY_BODY_BYTES)
}

impl QueryGrpc {
    async fn run<T>(
        &self,
        endpoint: &'static str,
        work: impl AsyncFnOnce(&Store) -> Result<T, ApiError>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let result = match self.state.admit_query() {
            Ok(_permit) => match self.state.store() {
                Ok(store) => work(store).await,
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        self.state
            .metrics()
            .record_query(endpoint, started.elapsed());
        result.map(Response::new).map_err(|err| {
            self.state
                .metrics()
                .record_rejection(endpoint, err.reason());
            err.to_status()
        })
    }
}

/// The wire range with defaults applied; the end is inclusive.
fn time_range(range: Option<WireRange>) -> Result<TimeRange, ApiError> {
    let range = range.unwrap_or_default();
    inclusive_range_ms(range.start_ms, range.end_ms).map_err(|err| ApiError::BadParameter {
        parameter: "range",
        message: err.to_string(),
    })
}

#[tonic::async_trait]
impl QueryService for QueryGrpc {
    async fn profile_types(
        &self,
        request: Request<ProfileTypesRequest>,
    ) -> Result<Response<ProfileTypesResponse>, Status> {
        let request = request.into_inner();
        self.run("grpc_profile_types", async move |store: &Store| {
            let range = time_range(request.range)?;
            let types = store.profile_types(range).await?;
            Ok(ProfileTypesResponse {
                profile_types: types.iter().map(ToString::to_string).collect(),
            })
        })
        .await
    }

    async fn label_names(
        &self,
        request: Request<LabelNamesRequest>,
    ) -> Result<Response<LabelNamesResponse>, Status> {
        let request = request.into_inner();
        self.run("grpc_labels", async move |store: &Store| {
            let range = time_range(request.range)?;
            let matchers = matchers(store, &request.selector, range).await?;
            Ok(LabelNamesResponse {
                names: store.label_names(&matchers, range).await?,
            })
        })
        .await
    }

    async fn label_values(
        &self,
        request: Request<LabelValuesRequest>,
    ) -> Result<Response<LabelValuesResponse>, Status> {
        let request = request.into_inner();
        self.run("grpc_label_values", async move |store: &Store| {
            let range = time_range(request.range)?;
            let matchers = matchers(store, &request.selector, range).await?;
            Ok(LabelValuesResponse {
                values: store.label_values(&request.name, &matchers, range).await?,
            })
        })
        .await
    }

    async fn select_merge_pprof(
        &self,
        request: Request<SelectMergePprofRequest>,
    ) -> Result<Response<SelectMergePprofResponse>, Status> {
        let request = request.into_inner();
        let symbolizer = self.state.symbolizer().clone();
        self.run("grpc_select_merge_pprof", async move |store: &Store| {
            let range = time_range(request.range)?;
            let selector = resolve(store, &request.selector, range).await?;
            let merged = store.merge(&selector, range).await?;
            let merged = symbolizer.symbolize(store, merged).await?;
            let total = merged.total();
            let pprof_gzip = merged_pprof_gzip(merged, selector.profile_type.clone()).await?;
            Ok(SelectMergePprofResponse {
                pprof_gzip,
                profile_type: selector.profile_type.to_string(),
                total,
            })
        })
        .await
    }
}
