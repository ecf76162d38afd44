//! `[server]`: the listeners, the main port's connection limits (a cap and
//! header, body and idle timeouts, so slow or idle connections
//! cannot hold every slot) and logging.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `[server]` in the file; flags and variables named on each field.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerOptions {
    /// Address serving gRPC and HTTP [default: 127.0.0.1:7470].
    #[arg(long, env = "KILN_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Optional separate address for `/metrics` (it is always on the main port too).
    #[arg(long, env = "KILN_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log filter, e.g. `info` or `kiln_store=debug` [default: info].
    #[arg(long, env = "KILN_LOG")]
    pub log: Option<String>,
    /// Most connections open at once on the main port; more wait in the
    /// kernel's accept queue until one closes [default: --memory-budget
    /// / 512 KiB, between 64 and 4096].
    #[arg(long, env = "KILN_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// How long a client may take to send a request's headers (HTTP/1), or
    /// to start its first request on a new connection, e.g. `10s`; then the
    /// connection is closed [default: 10s].
    #[arg(long, env = "KILN_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: Option<String>,
    /// How long a client may take to send a request body, e.g. `60s`; then
    /// the request is refused with 408 / DEADLINE_EXCEEDED [default: 60s].
    #[arg(long, env = "KILN_BODY_READ_TIMEOUT")]
    pub body_read_timeout: Option<String>,
    /// How long a connection may stay open with no request in flight, e.g.
    /// `2m`; then it is closed (HTTP/2 with a GOAWAY) [default: 2m].
    #[arg(long, env = "KILN_IDLE_TIMEOUT")]
    pub idle_timeout: Option<String>,
}
