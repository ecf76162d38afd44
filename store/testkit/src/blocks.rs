//! Engine blocks for the engine's compaction tests: what a block answers,
//! as one comparable value ([`content`]), and hour blocks of real Go
//! profiles written to files and read back by range ([`streaming`]).

pub mod content;
pub mod streaming;
