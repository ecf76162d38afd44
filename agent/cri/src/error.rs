//! Errors of CRI discovery.

/// Why talking to the container runtime or reading a container's cgroup failed.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The runtime socket could not be connected to.
    #[error("cannot connect to the container runtime at {socket}: {source}")]
    Connect {
        /// The socket path.
        socket: String,
        /// What the transport said.
        #[source]
        source: tonic::transport::Error,
    },
    /// A CRI call failed.
    #[error("CRI call {call} failed: {status}")]
    Call {
        /// The RPC name.
        call: &'static str,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
    /// A container's cgroup directory could not be found or stat'ed.
    #[error("cannot resolve the cgroup of container {container_id}: {detail}")]
    Cgroup {
        /// The container.
        container_id: String,
        /// What was tried and what failed.
        detail: String,
    },
}

impl CriError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CriError::Connect { .. } => "connect",
            CriError::Call { .. } => "call",
            CriError::Cgroup { .. } => "cgroup",
        }
    }

    /// Whether the runtime does not offer this call (e.g. container events on containerd 1.6).
    pub fn is_unimplemented(&self) -> bool {
        matches!(self, CriError::Call { status, .. } if status.code() == tonic::Code::Unimplemented)
    }

    pub(crate) fn call(call: &'static str, status: tonic::Status) -> CriError {
        CriError::Call {
            call,
            status: Box::new(status),
        }
    }
}
