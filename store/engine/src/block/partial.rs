//! A block's share of a merge, kept in the block's own symbol ids so that a
//! caller can cache it per (block, selector, range) and add it to later
//! merges without reading the block's series again.
//!
//! Summing the selected series' rollups and columns is the part of a merge
//! that grows with the number of series a block holds (every pod's stacks,
//! one series at a time); the partial is the result, as large as the
//! distinct (stack, label set) keys of the selection. A warm query over
//! many blocks then costs one translation of each block's distinct keys
//! instead of a pass over every series of every block.

use hashbrown::HashMap;

use super::Block;
use crate::error::QueryError;
use crate::model::TimeRange;
use crate::query::{CompiledSelector, MergedProfile, check_range};

/// The summed `(stack, sample label set) -> value` entries of one block's
/// selection over one range, in that block's symbol ids; meaningful only
/// with the block it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockPartial {
    entries: Vec<((u32, u32), i64)>,
}

impl BlockPartial {
    /// Number of distinct (stack, label set) keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the selection has no data in the range.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Heap bytes held, for a cache's budget.
    pub fn approx_bytes(&self) -> usize {
        size_of::<Self>() + self.entries.capacity() * size_of::<((u32, u32), i64)>()
    }
}

impl Block {
    /// The part of `range` this block can answer: `range` clipped to the
    /// block's time span. Two ranges with the same clip get the same
    /// partial from this block, so a cache keys partials by it: a sliding
    /// 7-day window finds every block it covers whole under the same key.
    pub fn clip_range(&self, range: TimeRange) -> TimeRange {
        let meta = self.meta();
        TimeRange {
            start_ms: range.start_ms.max(meta.min_time_ms),
            end_ms: range
                .end_ms
                .min(meta.max_time_ms.saturating_add(1))
                .max(range.start_ms.max(meta.min_time_ms)),
        }
    }

    /// Sums the selection's stacks in `range` into a partial, exactly as
    /// [`crate::Queryable::merge_into`] would add them to a merge.
    pub fn merge_partial(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
    ) -> Result<BlockPartial, QueryError> {
        check_range(range)?;
        // Summed over `range` itself, not its clip: the block holds no point
        // outside its span, so the answer is the same, and the unclipped
        // range keeps whole rollup windows (a day block's day) usable.
        let mut sums: HashMap<(u32, u32), i64> = HashMap::new();
        for id in self.index.select(selector.matchers()) {
            if let Some(series) = self.series.get(id as usize) {
                self.merge_series(series, range, &mut sums)
                    .map_err(|e| self.corrupt_block(e))?;
            }
        }
        let mut entries: Vec<((u32, u32), i64)> = sums.into_iter().collect();
        // A fixed order, so equal partials compare equal.
        entries.sort_unstable_by_key(|&(key, _)| key);
        Ok(BlockPartial { entries })
    }
}

impl MergedProfile {
    /// Adds a partial that `block` produced ([`Block::merge_partial`]).
    /// The partial must come from this same block: its ids are the block's.
    pub fn add_block_partial(&mut self, block: &Block, partial: &BlockPartial) {
        self.add_from(&block.symbols, partial.entries.iter().copied());
    }
}
