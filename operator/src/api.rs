//! The `kiln.dev/v1alpha1` API: `ProfileStore` and `ProfilingTarget`.
//!
//! The Rust types are the source of truth: `crdgen` renders them into `crds/*.yaml`, and a test
//! fails when any checked-in copy drifts. v1alpha1 evolves additively only, because kube-rs has no
//! conversion webhooks.

pub mod condition;
pub mod profile_store;
pub mod profiling_target;
pub mod recording_rule;
pub mod symbolization;

pub use profile_store::{
    AgentSpec, AllowedPeer, AuthSpec, NetworkPolicySpec, ObjectStorageSpec, ProfileStore,
    ProfileStoreSpec, ProfileStoreStatus, RetentionSpec, SecretKeysRef, SecurityMode, StorageSpec,
};
pub use profiling_target::{ProfilingTarget, ProfilingTargetSpec, ProfilingTargetStatus, StoreRef};
pub use recording_rule::RecordingRuleSpec;
pub use symbolization::SymbolizationSpec;

/// API group of both kinds.
pub const GROUP: &str = "kiln.dev";

/// The only served (and stored) version.
pub const VERSION: &str = "v1alpha1";
