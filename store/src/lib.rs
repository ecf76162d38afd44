//! `kiln-store`: the Kiln profile store server.
//!
//! One port serves gRPC (Parca's `WriteRaw`, Pyroscope's `Push`, OTLP
//! profiles `Export`, Kiln's query service) and HTTP (Pyroscope's
//! `/ingest`, Push over Connect, OTLP/HTTP, the `/api/v1/` query API,
//! Pyroscope's `querier.v1` over Connect and `/pyroscope/render`,
//! `/healthz`, `/readyz`, `/metrics`, the web UI). Storage is
//! `kiln-storage`'s `Store`.
//!
//! The modules are grouped by what they do. Pure parsing (`wire`, the
//! `/ingest` and OTLP decoders, selectors, `config`) is kept apart from the
//! handlers that do IO.

/// Settings: flags, environment, the config file and their checks.
pub mod config;
/// `ApiError`: every refusal, with its HTTP status, gRPC code and reason.
pub mod error;
/// Every way a profile comes in: HTTP, gRPC, Pyroscope, OTLP, Push, and the
/// one path they share to the store.
pub mod ingest;
/// The store server's own Prometheus metrics.
pub mod metrics;
/// Every way profiles are read back: `/api/v1/`, gRPC, Pyroscope's
/// `querier.v1`, with selectors, group-by and one query-string parser.
pub mod query;
/// The port: one route table with each route's access, the accept loop,
/// auth and the web guard.
pub mod server;
/// What every handler shares: the store, limits, tokens, metrics, slots.
pub mod state;
/// Naming frames sent as build id and address, after a query's merge,
/// from uploaded debug info and debuginfod.
pub mod symbolize;
/// What both sides read off the wire: content types, bodies and their
/// encodings, base64, and time.
pub mod wire;
