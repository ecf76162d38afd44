//! Kiln's wire types: the protobuf messages and gRPC services the store
//! serves and the agent calls.
//!
//! - [`parca::profilestore::v1alpha1`]: Parca's `ProfileStoreService/WriteRaw`,
//!   the path Kiln's agent ships profiles on (and Parca's scraper can too).
//! - [`push::v1`] and [`types::v1`]: Grafana Pyroscope's `PusherService/Push`,
//!   what current Pyroscope SDKs send.
//! - [`kiln::query::v1`]: Kiln's gRPC query service (a subset of the HTTP API).
//! - [`querier::v1`]: the messages of Grafana Pyroscope's `QuerierService`,
//!   which Grafana, Perses and `profilecli` query.
//! - [`opentelemetry`] and [`kiln::otlp`]: OTLP profiles export. The
//!   `v1development` request changed layout between releases; one module per
//!   wire layout (`v1_7`, `v1_8`, `v1_9`, `v1_10`) holds its messages.
//!
//! The code under `src/generated/` is produced by `tonic-prost-build` from
//! `proto/` and checked in; `tests/generated_code_drift.rs` fails when it is
//! stale. Clients and servers need only tonic's `codegen`; enable the
//! `channel` feature for a client transport and `server` for a server one.

/// Kiln's own API.
pub mod kiln {
    /// OTLP profiles export requests, one module per wire layout of
    /// `opentelemetry.proto.profiles.v1development`.
    pub mod otlp {
        /// As of opentelemetry-proto 1.7.
        #[allow(missing_docs, clippy::all)]
        pub mod v1_7 {
            include!("generated/kiln.otlp.v1_7.rs");
        }
        /// As of opentelemetry-proto 1.8 (its dictionary also serves 1.9 and 1.10).
        #[allow(missing_docs, clippy::all)]
        pub mod v1_8 {
            include!("generated/kiln.otlp.v1_8.rs");
        }
        /// As of opentelemetry-proto 1.9.
        #[allow(missing_docs, clippy::all)]
        pub mod v1_9 {
            include!("generated/kiln.otlp.v1_9.rs");
        }
        /// As of opentelemetry-proto 1.10 (1.11 is the same on the wire).
        #[allow(missing_docs, clippy::all)]
        pub mod v1_10 {
            include!("generated/kiln.otlp.v1_10.rs");
        }
    }
    /// Queries.
    pub mod query {
        /// Version v1.
        #[allow(missing_docs, clippy::all)]
        pub mod v1 {
            include!("generated/kiln.query.v1.rs");
        }
    }
}

/// OpenTelemetry's shared types and the profiles collector response.
pub mod opentelemetry {
    /// `opentelemetry.proto`.
    pub mod proto {
        /// Common types.
        pub mod common {
            /// Version v1.
            #[allow(missing_docs, clippy::all)]
            pub mod v1 {
                include!("generated/opentelemetry.proto.common.v1.rs");
            }
        }
        /// Resources.
        pub mod resource {
            /// Version v1.
            #[allow(missing_docs, clippy::all)]
            pub mod v1 {
                include!("generated/opentelemetry.proto.resource.v1.rs");
            }
        }
        /// Collector services.
        pub mod collector {
            /// Profiles.
            pub mod profiles {
                /// The only version so far.
                #[allow(missing_docs, clippy::all)]
                pub mod v1development {
                    include!("generated/opentelemetry.proto.collector.profiles.v1development.rs");
                }
            }
        }
    }
}

/// Grafana Pyroscope's query API.
pub mod querier {
    /// Version v1.
    #[allow(missing_docs, clippy::all)]
    pub mod v1 {
        include!("generated/querier.v1.rs");
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
/// The full gRPC method path of the OTLP profiles export.
pub const OTLP_PROFILES_EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
