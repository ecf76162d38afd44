//! A bounded cache of decoded blocks and of the merge partials queries
//! computed from them, evicting the least recently used. A partial holds
//! the symbols it references (`kiln_engine::BlockPartial`), so it stays and
//! answers after its block is evicted: a warm query over more blocks than
//! the budget holds reads the partials it needs, never the blocks again.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_engine::model::{BlockMeta, Selector, TimeRange};
use kiln_engine::{Block, BlockPartial};

/// What a block's merge partial answers: a selection over the query range
/// clipped to the block ([`BlockMeta::clip_range`]).
pub(crate) type PartialKey = (Selector, i64, i64);

/// The partial key of `selector` over `range` in the block `meta` describes.
pub(crate) fn partial_key(meta: &BlockMeta, selector: &Selector, range: TimeRange) -> PartialKey {
    let clipped = meta.clip_range(range);
    (selector.clone(), clipped.start_ms, clipped.end_ms)
}

/// Partials kept per block at most; the oldest goes first. Bounds what a
/// stream of distinct selectors on one hot block can pile up between
/// evictions (their bytes count against the budget too).
const MAX_PARTIALS_PER_BLOCK: usize = 64;

/// Decoded blocks and partials by block id, bounded by the sum of their
/// sizes ([`Block::approx_decoded_bytes`], [`BlockPartial::approx_bytes`]),
/// so the budget is real memory.
#[derive(Debug)]
pub(crate) struct BlockCache {
    blocks: HashMap<String, BlockEntry>,
    partials: HashMap<String, PartialSet>,
    capacity_bytes: u64,
    used_bytes: u64,
    /// Of `used_bytes`, what partials take.
    partial_bytes: u64,
    clock: u64,
}

#[derive(Debug)]
struct BlockEntry {
    block: Arc<Block>,
    bytes: u64,
    last_used: u64,
}

/// One block's partials by what they answer, with when each was stored.
#[derive(Debug, Default)]
struct PartialSet {
    partials: HashMap<PartialKey, (Arc<BlockPartial>, u64)>,
    bytes: u64,
    last_used: u64,
}

impl BlockCache {
    pub(crate) fn new(capacity_bytes: u64) -> Self {
        Self {
            blocks: HashMap::new(),
            partials: HashMap::new(),
            capacity_bytes,
            used_bytes: 0,
            partial_bytes: 0,
            clock: 0,
        }
    }

    pub(crate) fn get(&mut self, id: &str) -> Option<Arc<Block>> {
        self.clock += 1;
        let clock = self.clock;
        self.blocks.get_mut(id).map(|e| {
            e.last_used = clock;
            Arc::clone(&e.block)
        })
    }

    pub(crate) fn insert(&mut self, id: String, block: Arc<Block>, bytes: u64) {
        self.clock += 1;
        let entry = BlockEntry {
            block,
            bytes,
            last_used: self.clock,
        };
        if let Some(old) = self.blocks.insert(id, entry) {
            self.used_bytes -= old.bytes;
        }
        self.used_bytes += bytes;
        self.evict();
    }

    /// The partial of block `id` for `key`, if one was stored.
    pub(crate) fn partial(&mut self, id: &str, key: &PartialKey) -> Option<Arc<BlockPartial>> {
        self.clock += 1;
        let clock = self.clock;
        let set = self.partials.get_mut(id)?;
        let (partial, _) = set.partials.get(key)?;
        set.last_used = clock;
        Some(Arc::clone(partial))
    }

    /// Keeps `partial` of block `id`, counted in the budget.
    pub(crate) fn insert_partial(&mut self, id: &str, key: PartialKey, partial: Arc<BlockPartial>) {
        self.clock += 1;
        let clock = self.clock;
        let set = self.partials.entry(id.to_owned()).or_default();
        let mut freed = 0;
        if set.partials.len() >= MAX_PARTIALS_PER_BLOCK
            && !set.partials.contains_key(&key)
            && let Some(oldest) = set
                .partials
                .iter()
                .min_by_key(|(_, (_, stored))| *stored)
                .map(|(k, _)| k.clone())
            && let Some((old, _)) = set.partials.remove(&oldest)
        {
            freed += old.approx_bytes() as u64;
        }
        let added = partial.approx_bytes() as u64;
        if let Some((old, _)) = set.partials.insert(key, (partial, clock)) {
            freed += old.approx_bytes() as u64;
        }
        set.bytes = set.bytes + added - freed;
        set.last_used = clock;
        self.used_bytes = self.used_bytes + added - freed;
        self.partial_bytes = self.partial_bytes + added - freed;
        self.evict();
    }

    /// Evicts until the budget holds, keeping at least one entry: the
    /// least recently used decoded block while partials take at most half
    /// the budget, else the least recently used block's partials. A merge
    /// over more blocks than fit then keeps the partials it made (small: a
    /// selection's share of each block) and lets the blocks they came from
    /// go, rather than evicting its first partials to hold its last blocks.
    fn evict(&mut self) {
        // Eviction scans all entries; there are at most a few thousand
        // blocks, and it runs only on an insert (a bucket fetch or a
        // partial computed for the first time).
        while self.used_bytes > self.capacity_bytes && self.blocks.len() + self.partials.len() > 1 {
            let partials_first =
                self.blocks.is_empty() || self.partial_bytes > self.capacity_bytes / 2;
            let victim = if partials_first {
                self.partials
                    .iter()
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(id, _)| (false, id.clone()))
            } else {
                self.blocks
                    .iter()
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(id, _)| (true, id.clone()))
            };
            match victim {
                Some((true, id)) => self.remove_block(&id),
                Some((false, id)) => self.remove_partials(&id),
                None => break,
            }
        }
    }

    fn remove_block(&mut self, id: &str) {
        if let Some(old) = self.blocks.remove(id) {
            self.used_bytes -= old.bytes;
        }
    }

    fn remove_partials(&mut self, id: &str) {
        if let Some(old) = self.partials.remove(id) {
            self.used_bytes -= old.bytes;
            self.partial_bytes -= old.bytes;
        }
    }

    /// Forgets block `id` and its partials (deleted, or found corrupt).
    pub(crate) fn remove(&mut self, id: &str) {
        self.remove_block(id);
        self.remove_partials(id);
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let drop: Vec<String> = self
            .blocks
            .keys()
            .chain(self.partials.keys())
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

    /// Decoded blocks held (partials not counted).
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial() -> Arc<BlockPartial> {
        Arc::new(BlockPartial::default())
    }

    fn key(start: i64) -> PartialKey {
        (
            Selector {
                profile_type: kiln_engine::model::ProfileType {
                    name: "process_cpu".into(),
                    sample_type: "cpu".into(),
                    sample_unit: "nanoseconds".into(),
                    period_type: "cpu".into(),
                    period_unit: "nanoseconds".into(),
                    delta: true,
                },
                matchers: vec![],
            },
            start,
            start + 1,
        )
    }

    #[test]
    fn partials_outlive_their_evicted_blocks_and_count_in_the_budget() {
        let one = BlockPartial::default().approx_bytes() as u64;
        let mut cache = BlockCache::new(12 * one);
        cache.insert_partial("a", key(0), partial());
        cache.insert_partial("a", key(1), partial());
        cache.insert("b".into(), Arc::new(one_sample_block()), 9 * one);
        assert_eq!(cache.used_bytes(), 11 * one);
        // A merge reaching its next block: the decoded block goes, the
        // partials made before it stay, though used longer ago.
        cache.insert("d".into(), Arc::new(one_sample_block()), 3 * one);
        assert!(cache.get("b").is_none(), "the older block went");
        assert!(cache.partial("a", &key(0)).is_some());
        assert!(cache.get("d").is_some());
        assert_eq!(cache.used_bytes(), 5 * one);
        // Partials past half the budget go least recently used first,
        // before the blocks left.
        for i in 0..7 {
            cache.insert_partial(&format!("p{i}"), key(0), partial());
        }
        assert_eq!(cache.used_bytes(), 12 * one);
        cache.insert_partial("p7", key(0), partial());
        assert!(
            cache.partial("a", &key(1)).is_none(),
            "the oldest partials went"
        );
        assert!(
            cache.get("d").is_some(),
            "the block stays while partials are over half"
        );
        assert!(cache.partial("p0", &key(0)).is_some());
        assert_eq!(cache.used_bytes(), 11 * one);
        cache.retain(|id| id != "p7" && id != "d");
        assert!(cache.partial("p7", &key(0)).is_none());
        assert_eq!(cache.used_bytes(), cache.partial_bytes);
    }

    fn one_sample_block() -> Block {
        let mut head = kiln_engine::Head::new();
        let labels = kiln_engine::model::LabelSet::new(vec![kiln_engine::model::Label::new(
            "__name__",
            "process_cpu",
        )]);
        let mut builder = kiln_pprof::ProfileBuilder::new(&[("cpu", "nanoseconds")]);
        let function = builder.function(&kiln_pprof::FunctionSpec {
            name: "main".into(),
            ..Default::default()
        });
        let location = builder.location(0, 0x1000, &[(function, 1)]);
        builder.sample(&[location], &[10], &[]);
        let profile = kiln_pprof::decode(
            &kiln_pprof::encode_gzip(&builder.finish()),
            &kiln_pprof::DecodeLimits::default(),
        )
        .expect("decodes");
        head.ingest(
            &profile,
            &labels,
            1_000,
            0,
            &kiln_engine::IngestLimits::default(),
        )
        .expect("ingest");
        let (_, bytes) = kiln_engine::encode_block(&head, "b", "r").expect("encode");
        Block::decode(&bytes).expect("decode")
    }
}
