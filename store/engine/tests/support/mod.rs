//! Helpers shared by some of the engine's test binaries.
#![allow(dead_code)] // Each test binary uses a part.

pub mod content;
pub mod streaming;
