//! A bounded cache of decoded blocks, evicting the least recently used,
//! with each block's merge partials for the selections and ranges queried.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_engine::model::{Selector, TimeRange};
use kiln_engine::{Block, BlockPartial};

/// What a block's merge partial answers: a selection over the query range
/// clipped to the block ([`Block::clip_range`]).
pub(crate) type PartialKey = (Selector, i64, i64);

/// The partial key of `selector` over `range` in `block`.
pub(crate) fn partial_key(block: &Block, selector: &Selector, range: TimeRange) -> PartialKey {
    let clipped = block.clip_range(range);
    (selector.clone(), clipped.start_ms, clipped.end_ms)
}

/// Partials kept per block at most; the oldest goes first. Bounds what a
/// stream of distinct selectors on one hot block can pile up between
/// evictions (their bytes count against the budget too).
const MAX_PARTIALS_PER_BLOCK: usize = 64;

/// Decoded blocks by id, bounded by the sum of their decoded sizes
/// ([`Block::approx_decoded_bytes`]) plus their partials' sizes, so the
/// budget is real memory.
#[derive(Debug)]
pub(crate) struct BlockCache {
    entries: HashMap<String, Entry>,
    capacity_bytes: u64,
    used_bytes: u64,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    block: Arc<Block>,
    /// The block's decoded size plus its partials'.
    bytes: u64,
    last_used: u64,
    /// Merge partials by what they answer, with when each was stored.
    partials: HashMap<PartialKey, (Arc<BlockPartial>, u64)>,
}

impl BlockCache {
    pub(crate) fn new(capacity_bytes: u64) -> Self {
        Self {
            entries: HashMap::new(),
            capacity_bytes,
            used_bytes: 0,
            clock: 0,
        }
    }

    pub(crate) fn get(&mut self, id: &str) -> Option<Arc<Block>> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(id).map(|e| {
            e.last_used = clock;
            Arc::clone(&e.block)
        })
    }

    pub(crate) fn insert(&mut self, id: String, block: Arc<Block>, bytes: u64) {
        self.clock += 1;
        if let Some(old) = self.entries.insert(
            id,
            Entry {
                block,
                bytes,
                last_used: self.clock,
                partials: HashMap::new(),
            },
        ) {
            self.used_bytes -= old.bytes;
        }
        self.used_bytes += bytes;
        self.evict();
    }

    /// The partial of cached block `id` for `key`, if one was stored.
    pub(crate) fn partial(&mut self, id: &str, key: &PartialKey) -> Option<Arc<BlockPartial>> {
        self.clock += 1;
        let clock = self.clock;
        let entry = self.entries.get_mut(id)?;
        entry.last_used = clock;
        entry.partials.get(key).map(|(p, _)| Arc::clone(p))
    }

    /// Keeps `partial` with cached block `id` (dropped if the block is no
    /// longer cached), counted in the budget.
    pub(crate) fn insert_partial(&mut self, id: &str, key: PartialKey, partial: Arc<BlockPartial>) {
        self.clock += 1;
        let clock = self.clock;
        let Some(entry) = self.entries.get_mut(id) else {
            return;
        };
        if entry.partials.len() >= MAX_PARTIALS_PER_BLOCK
            && !entry.partials.contains_key(&key)
            && let Some(oldest) = entry
                .partials
                .iter()
                .min_by_key(|(_, (_, stored))| *stored)
                .map(|(k, _)| k.clone())
            && let Some((old, _)) = entry.partials.remove(&oldest)
        {
            let freed = old.approx_bytes() as u64;
            entry.bytes -= freed;
            self.used_bytes -= freed;
        }
        let added = partial.approx_bytes() as u64;
        if let Some((old, _)) = entry.partials.insert(key, (partial, clock)) {
            let freed = old.approx_bytes() as u64;
            entry.bytes -= freed;
            self.used_bytes -= freed;
        }
        entry.bytes += added;
        entry.last_used = clock;
        self.used_bytes += added;
        self.evict();
    }

    /// Evicts least recently used blocks (with their partials) until the
    /// budget holds, keeping at least one.
    fn evict(&mut self) {
        // Eviction scans all entries; there are at most a few thousand
        // blocks, and it runs only on an insert (a bucket fetch or a
        // partial computed for the first time).
        while self.used_bytes > self.capacity_bytes && self.entries.len() > 1 {
            let Some(victim) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            self.remove(&victim);
        }
    }

    pub(crate) fn remove(&mut self, id: &str) {
        if let Some(old) = self.entries.remove(id) {
            self.used_bytes -= old.bytes;
        }
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let drop: Vec<String> = self
            .entries
            .keys()
            .filter(|id| !keep(id))
            .cloned()
            .collect();
        for id in drop {
            self.remove(&id);
        }
    }

    pub(crate) fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
