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

/// The partial key a span's partial is stored under in its set: the
/// selection over the span's whole blocks.
fn span_partial_key(span: &SpanKey) -> PartialKey {
    (span.0.clone(), 0, 0)
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

/// What an insert evicted, handed back so the caller frees it after
/// releasing the cache's lock: dropping a decoded block frees hundreds of
/// thousands of small allocations, which other queries should not wait on.
#[derive(Debug, Default)]
#[must_use = "dropping this frees what was evicted; drop it outside the cache's lock"]
pub(crate) struct Evicted {
    blocks: Vec<Arc<Block>>,
    partials: Vec<PartialSet>,
    /// Budget bytes of what was evicted.
    pub(crate) bytes: u64,
}

/// One block's partials by what they answer, with when each was stored;
/// or one span's partial (`covers` then names the span's blocks).
#[derive(Debug, Default)]
struct PartialSet {
    partials: HashMap<PartialKey, (Arc<BlockPartial>, u64)>,
    bytes: u64,
    last_used: u64,
    /// The blocks a span partial was merged from; empty for a block's own
    /// partials. The set goes when any of them goes.
    covers: Vec<String>,
}

/// The id of the least recently used entry of `entries`, leaving out the
/// one used at `newest` (the entry just stored).
fn least_recent<V>(
    entries: &HashMap<String, V>,
    newest: u64,
    last_used: impl Fn(&V) -> u64,
) -> Option<String> {
    entries
        .iter()
        .filter(|(_, v)| last_used(v) != newest)
        .min_by_key(|(_, v)| last_used(v))
        .map(|(id, _)| id.clone())
}

/// A run of blocks a merge covers whole, merged once into one partial:
/// the selection and the blocks' ids, sorted.
pub(crate) type SpanKey = (Selector, Vec<String>);

/// The cache id of a span's partial set; never a block id (those are
/// ULIDs).
fn span_id(blocks: &[String]) -> String {
    format!("span:{}", blocks.join(","))
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

    pub(crate) fn insert(&mut self, id: String, block: Arc<Block>, bytes: u64) -> Evicted {
        self.clock += 1;
        let entry = BlockEntry {
            block,
            bytes,
            last_used: self.clock,
        };
        let mut evicted = Evicted::default();
        if let Some(old) = self.blocks.insert(id, entry) {
            self.used_bytes -= old.bytes;
            evicted.bytes += old.bytes;
            evicted.blocks.push(old.block);
        }
        self.used_bytes += bytes;
        self.evict(&mut evicted);
        evicted
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
    pub(crate) fn insert_partial(
        &mut self,
        id: &str,
        key: PartialKey,
        partial: Arc<BlockPartial>,
    ) -> Evicted {
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
        let mut evicted = Evicted {
            bytes: freed,
            ..Evicted::default()
        };
        self.evict(&mut evicted);
        evicted
    }

    /// The partial of a span of blocks for a selection, if one was stored.
    pub(crate) fn span_partial(&mut self, span: &SpanKey) -> Option<Arc<BlockPartial>> {
        self.partial(&span_id(&span.1), &span_partial_key(span))
    }

    /// Keeps the partial of a span of blocks, counted in the budget and
    /// evicted like a block's partials; it goes when any of its blocks
    /// does.
    pub(crate) fn insert_span_partial(
        &mut self,
        span: SpanKey,
        partial: Arc<BlockPartial>,
    ) -> Evicted {
        let key = span_partial_key(&span);
        let id = span_id(&span.1);
        self.partials.entry(id.clone()).or_default().covers = span.1;
        self.insert_partial(&id, key, partial)
    }

    /// Evicts until the budget holds, never the entry just stored (the
    /// one used last): the least recently used decoded block while
    /// partials take at most half the budget, else the least recently used
    /// block's partials. A merge over more blocks than fit then keeps the
    /// partials it made (small: a selection's share of each block) and
    /// lets the blocks they came from go, rather than evicting its first
    /// partials to hold its last blocks.
    fn evict(&mut self, evicted: &mut Evicted) {
        let newest = self.clock;
        // Eviction scans all entries; there are at most a few thousand
        // blocks, and it runs only on an insert (a bucket fetch or a
        // partial computed for the first time).
        while self.used_bytes > self.capacity_bytes {
            let oldest_partials =
                least_recent(&self.partials, newest, |s| s.last_used).map(|id| (false, id));
            let oldest_block =
                least_recent(&self.blocks, newest, |e| e.last_used).map(|id| (true, id));
            let partials_first =
                oldest_block.is_none() || self.partial_bytes > self.capacity_bytes / 2;
            let victim = if partials_first {
                oldest_partials.or(oldest_block)
            } else {
                oldest_block.or(oldest_partials)
            };
            match victim {
                Some((true, id)) => {
                    if let Some(entry) = self.remove_block(&id) {
                        evicted.bytes += entry.bytes;
                        evicted.blocks.push(entry.block);
                    }
                }
                Some((false, id)) => {
                    if let Some(set) = self.remove_partials(&id) {
                        evicted.bytes += set.bytes;
                        evicted.partials.push(set);
                    }
                }
                None => break,
            }
        }
    }

    fn remove_block(&mut self, id: &str) -> Option<BlockEntry> {
        let old = self.blocks.remove(id)?;
        self.used_bytes -= old.bytes;
        Some(old)
    }

    fn remove_partials(&mut self, id: &str) -> Option<PartialSet> {
        let old = self.partials.remove(id)?;
        self.used_bytes -= old.bytes;
        self.partial_bytes -= old.bytes;
        Some(old)
    }

    /// Forgets block `id`, its partials and the spans it is in (deleted,
    /// or found corrupt).
    pub(crate) fn remove(&mut self, id: &str) {
        // Rare (a deleted or corrupt block): freed in place.
        drop(self.remove_block(id));
        drop(self.remove_partials(id));
        let spans: Vec<String> = self
            .partials
            .iter()
            .filter(|(_, set)| set.covers.iter().any(|c| c == id))
            .map(|(span, _)| span.clone())
            .collect();
        for span in spans {
            drop(self.remove_partials(&span));
        }
    }

    /// Keeps only the blocks `keep` accepts, with their partials and the
    /// spans made of them alone.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let mut gone: Vec<String> = self
            .blocks
            .keys()
            .chain(self.partials.keys())
            .filter(|id| !id.starts_with("span:") && !keep(id))
            .cloned()
            .collect();
        // A span goes when a block it covers does, cached or not.
        gone.extend(
            self.partials
                .iter()
                .filter(|(_, set)| set.covers.iter().any(|c| !keep(c)))
                .map(|(span, _)| span.clone()),
        );
        for id in gone {
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
        let _ = cache.insert_partial("a", key(0), partial());
        let _ = cache.insert_partial("a", key(1), partial());
        let _ = cache.insert("b".into(), Arc::new(one_sample_block()), 9 * one);
        assert_eq!(cache.used_bytes(), 11 * one);
        // A merge reaching its next block: the decoded block goes, the
        // partials made before it stay, though used longer ago.
        let evicted = cache.insert("d".into(), Arc::new(one_sample_block()), 3 * one);
        assert_eq!(evicted.bytes, 9 * one, "what went is handed back");
        assert!(cache.get("b").is_none(), "the older block went");
        assert!(cache.partial("a", &key(0)).is_some());
        assert!(cache.get("d").is_some());
        assert_eq!(cache.used_bytes(), 5 * one);
        // Partials past half the budget go least recently used first,
        // before the blocks left.
        for i in 0..7 {
            let _ = cache.insert_partial(&format!("p{i}"), key(0), partial());
        }
        assert_eq!(cache.used_bytes(), 12 * one);
        let evicted = cache.insert_partial("p7", key(0), partial());
        assert_eq!(evicted.bytes, 2 * one, "block a's two partials");
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
