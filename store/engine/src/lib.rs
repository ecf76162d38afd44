#![doc = include_str!("../README.md")]

extern crate alloc;

pub mod block;
mod columns;
pub mod compact;
pub mod error;
pub mod head;
pub mod index;
pub mod model;
pub mod query;
pub mod recording;
pub mod symbols;
mod wire;

pub use block::format::{BLOB_CRC_VERSION, BlockCompression, FORMAT_VERSION};
pub use block::{
    Block, BlockPartial, BlockRanges, BlockSeriesDirectory, BlockSink, SharedBlockRanges,
    StoredSeries, encode_block, encode_heads, encode_selection, projected_ranged_hold,
};
pub use compact::{
    CompactionError, MergeLimits, MergeOutput, StreamedMerge, compact_blocks, compact_streaming,
    compact_streaming_within,
};
pub use error::{BlockError, IngestError, QueryError, RegexRejection};
pub use head::{CheckedIngest, Head, IngestLimits, IngestStats, SeriesCensus, ShardCensus};
pub use index::{CompiledMatcher, LabelIndex, compile_matchers};
pub use model::{
    BlockMeta, Label, LabelSet, MatchOp, Matcher, NAME_LABEL, PROFILE_TYPE_LABEL, ProfileType,
    Selector, TimeRange,
};
pub use query::{
    CompiledSelector, DiffFlameGraph, DiffNode, FlameGraph, FlameNode, MAX_FRAME_TREE_NODES,
    MAX_TIMELINE_STEPS, MAX_UNWOUND_FRAMES, MergedProfile, ProfileExemplar, Queryable,
    StepExemplars, SymbolizedFrame, Timeline, TopEntry, UnsymbolizedAddress, diff,
};
pub use symbols::SymbolTable;
