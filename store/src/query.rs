//! Every way profiles are read back.
//!
//! The APIs:
//! - [`http`]: Kiln's own `/api/v1/` (documented in `docs/api.md`);
//! - [`grpc`]: `kiln.query.v1.QueryService`, the gRPC form of part of it;
//! - [`pyroscope`]: Grafana Pyroscope's `querier.v1` over Connect and its
//!   older `/pyroscope/render` endpoints.
//!
//! What they share: [`budget`] is the memory their bodies hold,
//! [`params`] reads an HTTP query string, [`selector`]
//! parses a selector (pure), [`selection`] resolves it against the store
//! off the async workers, [`group_by`] merges by label, [`spans`] keeps
//! the samples of given tracing spans and [`profile_ids`] names single
//! profiles (exemplars) and finds them again.

pub mod budget;
pub mod group_by;
pub mod grpc;
pub mod http;
pub mod params;
pub mod peers;
pub mod profile_ids;
pub mod pyroscope;
pub mod recorded;
pub mod selection;
pub mod selector;
pub mod spans;
