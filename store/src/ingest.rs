//! Every way a profile comes in, and the one path they share.
//!
//! Each protocol reads its request into [`upload::ProfileUpload`]s, whose
//! series labels [`upload`] checks once, and hands them to
//! [`crate::state::AppState::ingest`] (or, for WriteRaw and Push, series by
//! series through [`series_batch`]). The protocols:
//! - [`http`]: Pyroscope's `POST /ingest` and Push over Connect;
//! - [`grpc`]: Parca's `WriteRaw` and Pyroscope's `Push` over gRPC, each
//!   admitted before tonic reads it ([`grpc_admission`]) and counted on
//!   the wire before prost decodes it ([`message_scan`]);
//! - [`pyroscope`]: the `/ingest` query string and body formats;
//! - [`push_json`]: Push's JSON body;
//! - [`otlp`]: OTLP profiles, over gRPC and HTTP;
//! - [`peer_keys`]: a resent request's idempotency keys looked up at the
//!   other replicas, and the route that answers them.

pub mod grpc;
pub mod grpc_admission;
pub mod http;
pub mod message_scan;
pub mod otlp;
pub mod peer_keys;
pub mod push_json;
pub mod pyroscope;
pub mod series_batch;
pub mod upload;
