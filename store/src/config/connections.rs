//! Limits on the main port's connections, so that slow or idle clients
//! cannot hold every socket or slot: how many may be open,
//! and how long a client may take to send a request's headers and body, or
//! keep a connection open with nothing in flight. The settings are in
//! `[server]` ([`ServerOptions`]).

use std::time::Duration;

use kiln_store_settings::ServerOptions;

use super::{ConfigError, positive_duration};

/// Connection limits after layering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time to send request headers, or to start the first request.
    pub header_read_timeout: Duration,
    /// Time to send a request body.
    pub body_read_timeout: Duration,
    /// Time a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
}

/// Bytes of `--memory-budget` per connection allowed by default: a
/// connection reading headers may buffer up to
/// [`MAX_HEADER_BUFFER_BYTES`](crate::server::MAX_HEADER_BUFFER_BYTES) plus
/// its task and socket state, so the default cap keeps what slow clients
/// can hold to about a sixteenth of the budget.
const MEMORY_BUDGET_BYTES_PER_CONNECTION: u64 = 512 << 10;
const DEFAULT_CONNECTIONS_RANGE: (usize, usize) = (64, 4096);

impl ConnectionLimits {
    /// Defaults applied to `server`'s connection settings (the cap
    /// follows the memory budget); zero is refused.
    pub fn resolve(server: &ServerOptions, memory_budget: u64) -> Result<Self, ConfigError> {
        let derived = usize::try_from(memory_budget / MEMORY_BUDGET_BYTES_PER_CONNECTION)
            .unwrap_or(usize::MAX)
            .clamp(DEFAULT_CONNECTIONS_RANGE.0, DEFAULT_CONNECTIONS_RANGE.1);
        let max_connections = server.max_connections.unwrap_or(derived);
        if max_connections == 0 {
            return Err(ConfigError::Invalid {
                setting: "server.max_connections",
                message: "must be greater than 0".to_owned(),
            });
        }
        Ok(Self {
            max_connections,
            header_read_timeout: positive_duration(
                "server.header_read_timeout",
                server.header_read_timeout.as_deref(),
                "10s",
            )?,
            body_read_timeout: positive_duration(
                "server.body_read_timeout",
                server.body_read_timeout.as_deref(),
                "60s",
            )?,
            idle_timeout: positive_duration(
                "server.idle_timeout",
                server.idle_timeout.as_deref(),
                "2m",
            )?,
        })
    }
}

impl Default for ConnectionLimits {
    /// The defaults for the default 2 GiB memory budget.
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_CONNECTIONS_RANGE.1,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_follows_the_memory_budget_within_bounds() {
        let server = ServerOptions::default();
        let cap = |budget: u64| {
            ConnectionLimits::resolve(&server, budget)
                .unwrap()
                .max_connections
        };
        assert_eq!(cap(2 << 30), 4096);
        assert_eq!(cap(192 << 20), 384);
        assert_eq!(cap(16 << 20), 64);
        let limits = ConnectionLimits::resolve(&server, 2 << 30).unwrap();
        assert_eq!(limits, ConnectionLimits::default());
    }

    #[test]
    fn set_values_replace_the_defaults_and_zero_is_refused() {
        let server = ServerOptions {
            max_connections: Some(20),
            header_read_timeout: Some("2s".into()),
            idle_timeout: Some("30s".into()),
            ..ServerOptions::default()
        };
        let limits = ConnectionLimits::resolve(&server, 2 << 30).unwrap();
        assert_eq!(limits.max_connections, 20);
        assert_eq!(limits.header_read_timeout, Duration::from_secs(2));
        assert_eq!(limits.body_read_timeout, Duration::from_secs(60));
        assert_eq!(limits.idle_timeout, Duration::from_secs(30));
        let zero = ServerOptions {
            body_read_timeout: Some("0s".into()),
            ..ServerOptions::default()
        };
        let err = ConnectionLimits::resolve(&zero, 2 << 30).unwrap_err();
        assert!(
            err.to_string().contains("server.body_read_timeout"),
            "{err}"
        );
    }
}
