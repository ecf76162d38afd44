//! Kiln's wire types: the protobuf messages and gRPC services the store
//! serves and the agent calls.
//!
//! - [`parca::profilestore::v1alpha1`]: Parca's `ProfileStoreService/WriteRaw`,
//!   the path Kiln's agent ships profiles on (and Parca's scraper can too).
//! - [`push::v1`] and [`types::v1`]: Grafana Pyroscope's `PusherService/Push`,
//!   what current Pyroscope SDKs send.
//! - [`kiln::query::v1`]: Kiln's gRPC query service (a subset of the HTTP API).
//!
//! The code under `src/generated/` is produced by `tonic-prost-build` from
//! `proto/` and checked in; `tests/generated_code_drift.rs` fails when it is
//! stale. Clients and servers need only tonic's `codegen`; enable the
//! `channel` feature for a client transport and `server` for a server one.

/// Kiln's own API.
pub mod kiln {
    /// Queries.
    pub mod query {
        /// Version v1.
        #[allow(missing_docs, clippy::all)]
        pub mod v1 {
            include!("generated/kiln.query.v1.rs");
        }
    }
}

/// Parca's API.
pub mod parca {
    /// Parca's profile store.
    pub mod profilestore {
        /// Version v1alpha1, the only one.
        #[allow(missing_docs, clippy::all)]
        pub mod v1alpha1 {
            include!("generated/parca.profilestore.v1alpha1.rs");
        }
    }
}

/// Grafana Pyroscope's push API.
pub mod push {
    /// Version v1.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        include!("generated/push.v1.rs");
    }
}

/// Grafana Pyroscope's shared types.
pub mod types {
    /// Version v1.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        include!("generated/types.v1.rs");
    }
}

/// The full gRPC method path of WriteRaw, e.g. for routing and metrics.
pub const WRITE_RAW_PATH: &str = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";
/// The full gRPC (and Connect) method path of Push.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
