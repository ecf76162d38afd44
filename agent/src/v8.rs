//! JavaScript functions in CPU profiles of V8 processes (Node), without
//! flags in the program.
//!
//! V8's JavaScript frames keep frame pointers, so the walk already finds
//! them; what they lack is names. V8's build exports its object and frame
//! layout as `v8dbg_*` constants ([`symbols`], [`layout`]).

pub mod layout;
pub mod symbols;
