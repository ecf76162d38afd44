//! `kiln-store`: the Kiln profile store server.
//!
//! One port serves gRPC (Parca's `WriteRaw`, Pyroscope's `Push`) and HTTP
//! (Pyroscope's `/ingest`, Push over Connect, the `/api/v1/` query API,
//! `/healthz`, `/readyz`, `/metrics`). Storage is `kiln-storage`'s `Store`.
//!
//! Pure request parsing lives in [`selector`], [`timespec`], [`pyroscope`],
//! [`ingest`] and [`config`]; the IO edges are [`server`], [`http_ingest`],
//! [`http_query`], [`grpc`] and [`grpc_query`].

pub mod auth;
pub mod config;
pub mod error;
pub mod grpc;
pub mod grpc_query;
pub mod http_ingest;
pub mod http_query;
pub mod ingest;
pub mod metrics;
pub mod otlp;
pub mod push_json;
pub mod pyroscope;
pub mod pyroscope_query;
pub mod selector;
pub mod server;
pub mod state;
pub mod timespec;
