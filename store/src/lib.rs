//! `kiln-store`: the Kiln profile store server.
//!
//! One port serves gRPC (Parca's `WriteRaw`, Pyroscope's `Push`, OTLP
//! profiles `Export`) and HTTP (Pyroscope's `/ingest`, Push over Connect,
//! OTLP/HTTP, the `/api/v1/` query API, Pyroscope's `querier.v1` over Connect
//! and `/pyroscope/render`, `/healthz`, `/readyz`, `/metrics`). Storage is
//! `kiln-storage`'s `Store`.
//!
//! Pure request parsing lives in [`selector`], [`timespec`], [`pyroscope`],
//! [`ingest`], [`otlp`] (but `otlp::service`), [`pyroscope_query::json`],
//! [`pyroscope_query::flamebearer`] and [`config`]; the IO edges are
//! [`server`], [`http_ingest`], [`http_query`], [`grpc_ingest`],
//! [`grpc_admission`], [`grpc_query`], `otlp::service` and
//! [`pyroscope_query`].

pub mod auth;
pub mod config;
pub mod error;
pub mod group_by;
pub mod grpc_admission;
pub mod grpc_ingest;
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
pub mod series_batch;
pub mod server;
pub mod state;
pub mod timespec;
pub mod web_guard;
