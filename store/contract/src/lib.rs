//! Contracts between Kiln's parts that are not protobuf.
//!
//! The store serves these shapes and grammars; the CLI, the UI's tests, the
//! agent and the operator read or render them. Keeping one definition here
//! means a rename fails the build instead of a user. Only `serde` and
//! `thiserror`: the CLI depends on this crate and must stay free of the
//! engine and of tokio.

pub mod duration;
pub mod endpoints;
pub mod labels;
pub mod query_json;
pub mod sample_labels;
