//! A block's share of a merge, with the symbols it references, so that a
//! caller can cache it per (block, selector, range) and add it to later
//! merges without reading the block again, or even keeping it: a partial
//! answers alone, so a cache can keep it after evicting its block.
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
use crate::model::{BlockMeta, TimeRange};
use crate::query::{CompiledSelector, MergedProfile, check_range, interrupt};
use crate::symbols::{ContentKey, ContentKeyer, SymbolTable, SymbolTranslator};

/// The summed `(stack, sample label set) -> value` entries of one block's
/// selection over one range, each with the content keys of its stack and
/// label set, in a symbol table of its own that holds only what the
/// entries reference.
#[derive(Debug, Clone, Default)]
pub struct BlockPartial {
    symbols: SymbolTable,
    entries: Vec<PartialEntry>,
}

impl PartialEq for BlockPartial {
    /// Equal when they add the same content to a merge: the same values
    /// under the same stack and label set content keys.
    fn eq(&self, other: &Self) -> bool {
        let content = |p: &BlockPartial| {
            p.entries
                .iter()
                .map(|e| (e.stack_key, e.labels_key, e.value))
                .collect::<Vec<_>>()
        };
        content(self) == content(other)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartialEntry {
    stack: u32,
    labels: u32,
    value: i64,
    /// `None` where the block's tables lack an entry the stack refers to;
    /// such a stack is translated every time.
    stack_key: Option<ContentKey>,
    labels_key: Option<ContentKey>,
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
        size_of::<Self>()
            + self.entries.capacity() * size_of::<PartialEntry>()
            + self.symbols.approx_bytes()
    }
}

impl BlockMeta {
    /// The part of `range` the block can answer: `range` clipped to the
    /// block's time span. Two ranges with the same clip get the same
    /// partial from the block, so a cache keys partials by it: a sliding
    /// 7-day window finds every block it covers whole under the same key.
    /// Metadata is enough, so a cached partial is found without the block.
    pub fn clip_range(&self, range: TimeRange) -> TimeRange {
        TimeRange {
            start_ms: range.start_ms.max(self.min_time_ms),
            end_ms: range
                .end_ms
                .min(self.max_time_ms.saturating_add(1))
                .max(range.start_ms.max(self.min_time_ms)),
        }
    }
}

impl Block {
    /// [`BlockMeta::clip_range`] of this block.
    pub fn clip_range(&self, range: TimeRange) -> TimeRange {
        self.meta().clip_range(range)
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
            interrupt::check()?;
            interrupt::check_held(interrupt::sums_bytes(sums.capacity()))?;
            if let Some(series) = self.series.get(id as usize) {
                self.merge_series(series, range, &mut sums)
                    .map_err(|e| self.corrupt_block(e))?;
            }
        }
        // A fixed order, so the partial's own ids come out the same for
        // the same selection.
        let mut sums: Vec<((u32, u32), i64)> = sums.into_iter().collect();
        sums.sort_unstable_by_key(|&(key, _)| key);
        let mut translator = SymbolTranslator::new(&self.symbols);
        let mut symbols = SymbolTable::new();
        let translated: Vec<(u32, u32, i64)> = sums
            .into_iter()
            .map(|((stack, labels), value)| {
                let stack = translator.node(&self.symbols, &mut symbols, stack);
                let labels = translator.label_set(&self.symbols, &mut symbols, labels);
                (stack, labels, value)
            })
            .collect();
        drop(translator);
        // Keyed in the partial's own table: keys follow content, so they
        // are those of the block's entries, and the partial's table holds
        // only what the selection reaches, every entry of it keyed.
        let mut keyer = ContentKeyer::new(&symbols);
        let entries: Vec<PartialEntry> = translated
            .into_iter()
            .map(|(stack, labels, value)| PartialEntry {
                stack,
                labels,
                value,
                stack_key: keyer.node(stack),
                labels_key: keyer.label_set(labels),
            })
            .collect();
        drop(keyer);
        symbols.drop_lookups();
        Ok(BlockPartial { symbols, entries })
    }
}

impl MergedProfile {
    /// This merge as a partial, to be kept and added to later merges like
    /// a block's. A store merges a run of blocks a range covers whole into
    /// one such partial: their common symbols are held once, not once per
    /// block, and a later merge adds one partial instead of one per block.
    pub fn into_partial(self) -> BlockPartial {
        let mut sums: Vec<((u32, u32), i64)> = self.values.into_iter().collect();
        sums.sort_unstable_by_key(|&(key, _)| key);
        let mut keyer = ContentKeyer::new(&self.symbols);
        let entries = sums
            .into_iter()
            .map(|((stack, labels), value)| PartialEntry {
                stack,
                labels,
                value,
                stack_key: keyer.node(stack),
                labels_key: keyer.label_set(labels),
            })
            .collect();
        drop(keyer);
        let mut symbols = self.symbols;
        symbols.drop_lookups();
        BlockPartial { symbols, entries }
    }

    /// Adds a partial a block produced ([`Block::merge_partial`]); the
    /// block itself is not needed.
    ///
    /// A stack or label set whose content this merge already holds (from
    /// any block's partial) is found by its content key; only new content
    /// is translated through the partial's tables.
    pub fn add_partial(&mut self, partial: &BlockPartial) {
        let src = &partial.symbols;
        // Built only on the first miss: it sizes a memo to every table of
        // the block, which a partial found whole by key never needs.
        let mut translator: Option<SymbolTranslator> = None;
        for entry in &partial.entries {
            let known = entry
                .stack_key
                .and_then(|key| self.by_content.nodes.get(&key).copied());
            let stack = match known {
                Some(stack) => stack,
                None => {
                    let translator = translator.get_or_insert_with(|| SymbolTranslator::new(src));
                    let stack = translator.node(src, &mut self.symbols, entry.stack);
                    if let Some(key) = entry.stack_key {
                        self.by_content.nodes.insert(key, stack);
                    }
                    stack
                }
            };
            let known = entry
                .labels_key
                .and_then(|key| self.by_content.label_sets.get(&key).copied());
            let labels = match known {
                Some(labels) => labels,
                None => {
                    let translator = translator.get_or_insert_with(|| SymbolTranslator::new(src));
                    let labels = translator.label_set(src, &mut self.symbols, entry.labels);
                    if let Some(key) = entry.labels_key {
                        self.by_content.label_sets.insert(key, labels);
                    }
                    labels
                }
            };
            let sum = self.values.entry((stack, labels)).or_insert(0);
            *sum = sum.wrapping_add(entry.value);
            self.total = self.total.wrapping_add(entry.value);
        }
    }
}
