//! Limits on the main port's connections (audit R4): how many may be open,
//! and how long a client may take to send a request's headers and body, or
//! keep a connection open with nothing in flight. Flags are flattened into
//! [`Cli`](super::Cli); the file's `[server]` table holds the same keys.

use std::time::Duration;

use super::{ConfigError, FileServer, parse_duration};

/// The connection flags of `kiln-store`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectionFlags {
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
    /// Layers `flags` over the file's `[server]` table over the defaults,
    /// some of which follow the memory budget.
    pub fn layer(
        flags: &ConnectionFlags,
        file: &FileServer,
        memory_budget: u64,
    ) -> Result<Self, ConfigError> {
        let derived = usize::try_from(memory_budget / MEMORY_BUDGET_BYTES_PER_CONNECTION)
            .unwrap_or(usize::MAX)
            .clamp(DEFAULT_CONNECTIONS_RANGE.0, DEFAULT_CONNECTIONS_RANGE.1);
        let max_connections = flags
            .max_connections
            .or(file.max_connections)
            .unwrap_or(derived);
        if max_connections == 0 {
            return Err(ConfigError::Invalid {
                setting: "server.max_connections",
                message: "must be greater than 0".to_owned(),
            });
        }
        let timeout =
            |setting: &'static str, flag: &Option<String>, file: &Option<String>, default: &str| {
                let text = flag.as_deref().or(file.as_deref()).unwrap_or(default);
                let value = parse_duration(text)
                    .map_err(|message| ConfigError::Invalid { setting, message })?;
                if value.is_zero() {
                    return Err(ConfigError::Invalid {
                        setting,
                        message: "must be greater than 0".to_owned(),
                    });
                }
                Ok(value)
            };
        Ok(Self {
            max_connections,
            header_read_timeout: timeout(
                "server.header_read_timeout",
                &flags.header_read_timeout,
                &file.header_read_timeout,
                "10s",
            )?,
            body_read_timeout: timeout(
                "server.body_read_timeout",
                &flags.body_read_timeout,
                &file.body_read_timeout,
                "60s",
            )?,
            idle_timeout: timeout(
                "server.idle_timeout",
                &flags.idle_timeout,
                &file.idle_timeout,
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
        let flags = ConnectionFlags::default();
        let file = FileServer::default();
        let cap = |budget: u64| {
            ConnectionLimits::layer(&flags, &file, budget)
                .unwrap()
                .max_connections
        };
        assert_eq!(cap(2 << 30), 4096);
        assert_eq!(cap(192 << 20), 384);
        assert_eq!(cap(16 << 20), 64);
        let limits = ConnectionLimits::layer(&flags, &file, 2 << 30).unwrap();
        assert_eq!(limits, ConnectionLimits::default());
    }

    #[test]
    fn flags_override_the_file_and_zero_is_refused() {
        let file = FileServer {
            max_connections: Some(10),
            idle_timeout: Some("30s".into()),
            ..FileServer::default()
        };
        let flags = ConnectionFlags {
            max_connections: Some(20),
            header_read_timeout: Some("2s".into()),
            ..ConnectionFlags::default()
        };
        let limits = ConnectionLimits::layer(&flags, &file, 2 << 30).unwrap();
        assert_eq!(limits.max_connections, 20);
        assert_eq!(limits.header_read_timeout, Duration::from_secs(2));
        assert_eq!(limits.idle_timeout, Duration::from_secs(30));
        let zero = ConnectionFlags {
            body_read_timeout: Some("0s".into()),
            ..ConnectionFlags::default()
        };
        let err = ConnectionLimits::layer(&zero, &file, 2 << 30).unwrap_err();
        assert!(
            err.to_string().contains("server.body_read_timeout"),
            "{err}"
        );
    }
}
