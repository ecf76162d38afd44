//! Generated prost types for the pprof wire format (`proto/profile.proto`).
//!
//! Checked in so that building Kiln needs no `protoc`; the test
//! `generated_code_drift` fails when this falls out of step with the schema.

#![allow(clippy::all, missing_debug_implementations, missing_docs)]

include!("generated/perftools.profiles.rs");
