//! Kiln's test kit: the helpers that more than one test crate needs, in one
//! place. It is a dev-dependency only; no shipped crate may import it.
//!
//! - [`prerequisites`]: the house rule for missing tools (skip visibly
//!   outside CI, fail under `CI=true`).
//! - [`process`]: guards that end child processes when a test ends.

pub mod prerequisites;
pub mod process;
