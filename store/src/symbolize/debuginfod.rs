//! The debuginfod client: `GET <server>/buildid/<id>/debuginfo`, one
//! deadline for the whole request, the body capped as it arrives.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kiln_debuginfo::BuildId;

/// Why a server gave no debug file (a 404 is not an error: it has none).
#[derive(Debug, thiserror::Error)]
pub enum DebuginfodError {
    /// The request failed or timed out.
    #[error("{server}: {message}")]
    Request {
        /// The server's base URL.
        server: String,
        /// What the client said.
        message: String,
    },
    /// The server answered with an error status.
    #[error("{server}: HTTP {status}")]
    Status {
        /// The server's base URL.
        server: String,
        /// The status.
        status: u16,
    },
    /// The file is larger than the store takes.
    #[error("{server}: the debug file is larger than {limit} bytes")]
    TooLarge {
        /// The server's base URL.
        server: String,
        /// The limit.
        limit: u64,
    },
}

impl DebuginfodError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Request { .. } => "debuginfod_request",
            Self::Status { .. } => "debuginfod_status",
            Self::TooLarge { .. } => "debuginfod_too_large",
        }
    }
}

/// A client for every server, with the request deadline.
#[derive(Debug, Clone)]
pub struct Debuginfod {
    client: reqwest::Client,
    timeout: Duration,
}

impl Debuginfod {
    /// A client whose every request ends within `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, DebuginfodError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("kiln-store/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| DebuginfodError::Request {
                server: String::new(),
                message: e.to_string(),
            })?;
        Ok(Self { client, timeout })
    }

    /// `build_id`'s debug file from `server`; `None` when it has none.
    pub async fn debuginfo(
        &self,
        server: &str,
        build_id: &BuildId,
        max_bytes: u64,
    ) -> Result<Option<Bytes>, DebuginfodError> {
        let request = async {
            let url = format!("{server}/buildid/{build_id}/debuginfo");
            let failed = |e: reqwest::Error| DebuginfodError::Request {
                server: server.to_owned(),
                message: e.to_string(),
            };
            let mut response = self.client.get(&url).send().await.map_err(failed)?;
            let status = response.status();
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if !status.is_success() {
                return Err(DebuginfodError::Status {
                    server: server.to_owned(),
                    status: status.as_u16(),
                });
            }
            let too_large = || DebuginfodError::TooLarge {
                server: server.to_owned(),
                limit: max_bytes,
            };
            if response.content_length().is_some_and(|n| n > max_bytes) {
                return Err(too_large());
            }
            let mut body = BytesMut::new();
            while let Some(chunk) = response.chunk().await.map_err(failed)? {
                if (body.len() + chunk.len()) as u64 > max_bytes {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Some(body.freeze()))
        };
        tokio::time::timeout(self.timeout, request)
            .await
            .unwrap_or_else(|_| {
                Err(DebuginfodError::Request {
                    server: server.to_owned(),
                    message: format!("no answer within {:?}", self.timeout),
                })
            })
    }
}
