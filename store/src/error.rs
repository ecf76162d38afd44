//! Every way a request can fail, and how each failure looks on the wire:
//! HTTP status + JSON, Connect error JSON, or gRPC status. This is the one
//! place that maps errors to codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_storage::error::{ErrorClass, StorageError};

use crate::ingest::otlp::OtlpError;
use crate::ingest::pyroscope::IngestError;
use crate::ingest::upload::UploadError;
use crate::query::selector::SelectorError;
use crate::wire::time::TimeError;

/// A failed API request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The series labels or batch shape are unusable.
    #[error("{source}")]
    Upload {
        /// Why.
        #[source]
        source: UploadError,
    },
    /// A Pyroscope `/ingest` request is malformed.
    #[error("{source}")]
    Ingest {
        /// Why.
        #[source]
        source: IngestError,
    },
    /// An OTLP profiles export is malformed, ambiguous or of an unknown revision.
    #[error("{source}")]
    Otlp {
        /// Why.
        #[source]
        source: OtlpError,
    },
    /// The `query` selector is malformed or names no profile type.
    #[error("invalid `{parameter}`: {source}")]
    Selector {
        /// The parameter holding the selector.
        parameter: &'static str,
        /// Why.
        #[source]
        source: SelectorError,
    },
    /// A time parameter cannot be read.
    #[error("invalid `{parameter}`: {source}")]
    Time {
        /// The parameter.
        parameter: &'static str,
        /// Why.
        #[source]
        source: TimeError,
    },
    /// Some other parameter is missing or wrong.
    #[error("invalid `{parameter}`: {message}")]
    BadParameter {
        /// The parameter.
        parameter: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The body is not the protobuf (or JSON) message the endpoint takes.
    #[error("request body is not a valid {message_type}: {message}")]
    BadMessage {
        /// The expected message type.
        message_type: &'static str,
        /// What the decoder said.
        message: String,
    },
    /// A request option Kiln does not implement (rather than ignoring it and
    /// answering something else).
    #[error("not supported by Kiln: {what}")]
    Unimplemented {
        /// What was asked for.
        what: String,
    },
    /// The body's content type is not one the endpoint reads.
    #[error("content type {content_type:?} is not supported here; use {expected}")]
    UnsupportedMediaType {
        /// The content type sent.
        content_type: String,
        /// What to send instead.
        expected: &'static str,
    },
    /// The body's content encoding cannot be undone.
    #[error("content encoding {encoding:?} is not supported; use gzip or identity")]
    UnsupportedEncoding {
        /// The encoding sent.
        encoding: String,
    },
    /// A gzip body is corrupt.
    #[error("gzip request body is corrupt: {message}")]
    BadGzip {
        /// What the decoder said.
        message: String,
    },
    /// The body (or its decompressed form) exceeds the request size limit.
    #[error("request body exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// A gRPC message (as sent, or inflated) exceeds the request size limit;
    /// found before tonic decodes it.
    #[error("gRPC message length too large {stage}: more than {limit} bytes")]
    GrpcMessageTooLarge {
        /// `as sent` or `after decompressing`.
        stage: &'static str,
        /// The limit.
        limit: usize,
    },
    /// Too many requests of one kind are in flight.
    #[error("server overloaded: {limit} {kind} requests already in flight, retry later")]
    Overloaded {
        /// `ingest` or `query`: each has its own slots.
        kind: &'static str,
        /// The in-flight limit.
        limit: usize,
    },
    /// A query request (every store visit it made together) ran past the
    /// query deadline; nothing partial is answered.
    #[error("query stopped after {timeout:?}; narrow the time range, the selector or the grouping")]
    QueryDeadline {
        /// The deadline.
        timeout: std::time::Duration,
    },
    /// The query memory budget is held by queries in flight right now.
    #[error(
        "the store's query memory budget ({budget} bytes) is in use; {bytes} more bytes are not available now, retry later"
    )]
    QueryMemoryBusy {
        /// Bytes the request asked for.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
    /// One query would need more than the whole query memory budget.
    #[error("the query needs {bytes} bytes, more than the store's query memory budget of {budget}")]
    QueryOverBudget {
        /// Bytes the request would hold.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
    /// The body did not arrive within the body read timeout.
    #[error("request body not received within {timeout:?}")]
    BodyTimeout {
        /// The timeout.
        timeout: std::time::Duration,
    },
    /// The store is still recovering (or failed to open).
    #[error("store is not ready yet (recovering the write-ahead log and block list)")]
    NotReady,
    /// An uploaded debug file cannot be used by the symbolizer.
    #[error("debug file refused: {source}")]
    DebugInfo {
        /// Why.
        #[source]
        source: kiln_debuginfo::DebugInfoError,
    },
    /// An uploaded debug file records no build id to key it by.
    #[error("debug file refused: it has no GNU build id note (link with --build-id)")]
    DebugInfoWithoutBuildId,
    /// A token bound to namespaces may not upload debug info, which names
    /// frames of every namespace.
    #[error("uploading debug info needs a write token for any namespace")]
    DebugInfoForbidden,
    /// This store takes no uploads (`--debuginfo-uploads=false`).
    #[error("this store takes no debug info uploads (--debuginfo-uploads=false)")]
    DebugInfoUploadsOff,
    /// No valid bearer token.
    #[error("missing or invalid bearer token for {access}")]
    Unauthorized {
        /// `writes` or `reads`.
        access: &'static str,
    },
    /// Work the server ran on a worker thread did not finish (it panicked
    /// or was cancelled); a server fault, never the client's.
    #[error("{work} failed on a worker thread: {message}")]
    Worker {
        /// What was being done, e.g. `encoding the profile`.
        work: &'static str,
        /// What the runtime reported.
        message: String,
    },
    /// The storage layer refused or failed.
    #[error("{source}")]
    Storage {
        /// Why.
        #[source]
        source: StorageError,
    },
}

impl ApiError {
    /// A short, fixed name for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Upload { source } => source.reason(),
            Self::Ingest { source } => source.reason(),
            Self::Otlp { source } => source.reason(),
            Self::Selector { source, .. } => source.reason(),
            Self::Time { source, .. } => source.reason(),
            Self::BadParameter { .. } => "bad_parameter",
            Self::BadMessage { .. } => "bad_message",
            Self::Unimplemented { .. } => "unimplemented",
            Self::UnsupportedMediaType { .. } => "unsupported_media_type",
            Self::UnsupportedEncoding { .. } => "unsupported_encoding",
            Self::BadGzip { .. } => "bad_gzip",
            Self::TooLarge { .. } | Self::GrpcMessageTooLarge { .. } => "too_large",
            Self::Overloaded { .. } => "overloaded",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::QueryDeadline { .. } => "query_timeout",
            Self::QueryMemoryBusy { .. } => "query_memory_busy",
            Self::QueryOverBudget { .. } => "query_over_budget",
            Self::NotReady => "not_ready",
            Self::DebugInfo { source } => source.reason(),
            Self::DebugInfoWithoutBuildId => "debuginfo_without_build_id",
            Self::DebugInfoForbidden => "debuginfo_forbidden",
            Self::DebugInfoUploadsOff => "debuginfo_uploads_off",
            Self::Unauthorized { .. } => "unauthorized",
            Self::Worker { .. } => "worker_failed",
            Self::Storage { source } => source.reason(),
        }
    }

    /// The HTTP status for this error.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Upload { .. }
            | Self::Otlp { .. }
            | Self::Selector { .. }
            | Self::Time { .. }
            | Self::BadParameter { .. }
            | Self::BadMessage { .. }
            | Self::BadGzip { .. } => StatusCode::BAD_REQUEST,
            Self::Ingest { source } => match source {
                IngestError::BadPprof { .. }
                | IngestError::BadFolded { .. }
                | IngestError::BadConversion { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                IngestError::Memory { source } if source.class() == ErrorClass::Overloaded => {
                    StatusCode::TOO_MANY_REQUESTS
                }
                IngestError::UnsupportedFormat { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                _ => StatusCode::BAD_REQUEST,
            },
            Self::UnsupportedMediaType { .. } | Self::UnsupportedEncoding { .. } => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Self::TooLarge { .. } | Self::GrpcMessageTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::Unimplemented { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::Overloaded { .. } | Self::QueryMemoryBusy { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::QueryOverBudget { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            // As the store's own per-visit deadline: the request asked for
            // too much, and the same request will time out again.
            Self::QueryDeadline { .. } => StatusCode::BAD_REQUEST,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            Self::DebugInfo { .. } | Self::DebugInfoWithoutBuildId => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Self::DebugInfoForbidden | Self::DebugInfoUploadsOff => StatusCode::FORBIDDEN,
            Self::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            Self::Worker { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Storage {
                source: StorageError::NamespaceNotAllowed { .. },
            } => StatusCode::FORBIDDEN,
            // As a query body over the query memory: the same query will
            // not fit again.
            Self::Storage {
                source:
                    StorageError::Query {
                        source: kiln_engine::QueryError::TooLarge { .. },
                    },
            } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Storage { source } => match source.class() {
                ErrorClass::Client => StatusCode::BAD_REQUEST,
                ErrorClass::Overloaded => match source {
                    StorageError::ShuttingDown
                    | StorageError::QueryRaced { .. }
                    | StorageError::UploadBacklog { .. } => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::TOO_MANY_REQUESTS,
                },
                ErrorClass::Server => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// The gRPC code for this error.
    pub fn grpc_code(&self) -> tonic::Code {
        match self.http_status() {
            StatusCode::BAD_REQUEST
            | StatusCode::UNPROCESSABLE_ENTITY
            | StatusCode::UNSUPPORTED_MEDIA_TYPE => tonic::Code::InvalidArgument,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => {
                tonic::Code::ResourceExhausted
            }
            StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
            StatusCode::REQUEST_TIMEOUT => tonic::Code::DeadlineExceeded,
            StatusCode::UNAUTHORIZED => tonic::Code::Unauthenticated,
            StatusCode::FORBIDDEN => tonic::Code::PermissionDenied,
            StatusCode::NOT_IMPLEMENTED => tonic::Code::Unimplemented,
            _ => tonic::Code::Internal,
        }
    }

    /// The Connect protocol's name for [`Self::grpc_code`].
    pub fn connect_code(&self) -> &'static str {
        match self.grpc_code() {
            tonic::Code::InvalidArgument => "invalid_argument",
            tonic::Code::ResourceExhausted => "resource_exhausted",
            tonic::Code::Unavailable => "unavailable",
            tonic::Code::DeadlineExceeded => "deadline_exceeded",
            tonic::Code::Unauthenticated => "unauthenticated",
            tonic::Code::PermissionDenied => "permission_denied",
            tonic::Code::Unimplemented => "unimplemented",
            _ => "internal",
        }
    }

    /// As a gRPC status.
    pub fn to_status(&self) -> tonic::Status {
        tonic::Status::new(self.grpc_code(), self.to_string())
    }

    /// As a Connect unary error response.
    pub fn into_connect_response(self) -> Response {
        let body = serde_json::json!({ "code": self.connect_code(), "message": self.to_string() });
        (self.http_status(), axum::Json(body)).into_response()
    }
}

impl From<StorageError> for ApiError {
    fn from(source: StorageError) -> Self {
        Self::Storage { source }
    }
}

impl From<UploadError> for ApiError {
    fn from(source: UploadError) -> Self {
        Self::Upload { source }
    }
}

impl From<OtlpError> for ApiError {
    fn from(source: OtlpError) -> Self {
        Self::Otlp { source }
    }
}

impl From<IngestError> for ApiError {
    fn from(source: IngestError) -> Self {
        Self::Ingest { source }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.http_status();
        let body = serde_json::json!({ "error": self.to_string(), "reason": self.reason() });
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
