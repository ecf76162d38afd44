//! What the operator reports: who runs the agents, each object's status counts and conditions,
//! and when to look again. Pure functions of what a reconcile read and applied, so every
//! branch is unit-tested here; the controllers only fetch, apply and patch.

pub mod ownership;
pub mod recording;
pub mod store;
pub mod target;

#[cfg(test)]
pub(crate) mod fixtures;

/// A failed step as a condition shows it: a fixed reason and the whole error chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// PascalCase reason, e.g. `ApiError`.
    pub reason: &'static str,
    /// The error and its sources on one line.
    pub message: String,
}
