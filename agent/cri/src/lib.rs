//! Kiln's view of a Kubernetes node through the container runtime's CRI
//! `runtime.v1` API, with no access to the API server.
//!
//! - [`client`] (IO): a tonic client over the runtime's unix socket that
//!   takes a [`inventory::RuntimeSnapshot`] (sandboxes, containers, and the
//!   verbose status of containers not seen before).
//! - [`inventory`] (pure): turns a snapshot into pods with their containers
//!   and diffs successive inventories.
//! - [`cgroup`] (pure parsing + one `stat`): finds each container's cgroup v2
//!   directory and its id (the directory's inode), which the BPF allow-list
//!   is keyed by.
//! - [`ports`] (pure): a container's named ports, from kubelet's copy of the
//!   pod spec's ports on the container.
//! - [`selection`] (pure): asks `kiln-targets` which containers are profiled
//!   and builds their profile labels and the pod's named ports.
//!
//! The code under `src/generated/` is produced by `tonic-prost-build` from
//! `proto/runtime/v1/api.proto` (a subset of kubernetes/cri-api with the
//! upstream field numbers) and checked in; `tests/generated_code_drift.rs`
//! fails when it is stale.

pub mod cgroup;
pub mod client;
pub mod error;
pub mod inventory;
pub mod ports;
pub mod selection;

pub use client::CriClient;
pub use error::CriError;
pub use inventory::{ContainerInfo, InventoryDiff, PodInfo, PodInventory, RuntimeSnapshot};
pub use selection::{SelectedContainer, select_containers};

/// The CRI `runtime.v1` protobuf messages and the RuntimeService client.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod runtime {
    /// Version v1 (Kubernetes 1.20+).
    pub mod v1 {
        include!("generated/runtime.v1.rs");
    }
}

/// Sandbox label kubelet sets to the pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Sandbox label kubelet sets to the pod's name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Container label kubelet sets to the container's name.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
