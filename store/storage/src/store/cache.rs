//! A bounded cache of decoded blocks, evicting the least recently used.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_engine::Block;

/// Decoded blocks by id, bounded by the sum of their decoded sizes
/// ([`Block::approx_decoded_bytes`]), so the budget is real memory.
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
    bytes: u64,
    last_used: u64,
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
            },
        ) {
            self.used_bytes -= old.bytes;
        }
        self.used_bytes += bytes;
        // Eviction scans all entries; there are at most a few thousand
        // blocks, and inserts happen only on a cache miss (a bucket fetch).
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
