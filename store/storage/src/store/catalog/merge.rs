//! Merges, answered from the cache where it can: a block's merge partial
//! for the selection and range, or one partial for the settled days a
//! range covers whole, so a warm merge over a week reads no block again.

use std::sync::Arc;

use kiln_engine::model::{BlockMeta, Selector, TimeRange};
use kiln_engine::query::interrupt;
use kiln_engine::{Block, CompiledSelector, MergedProfile, QueryError};

use super::cache::{SpanKey, partial_key};
use super::read::free_evicted;
use crate::error::StorageError;
use crate::store::{Shared, Store, lock};

impl Store {
    /// Merges every sample selected by `selector` in `range`.
    ///
    /// Blocks come from their cached partials where the cache has them,
    /// and the settled blocks the range covers whole (see [`settled_span`])
    /// from one partial of them all: a warm merge over a week then adds
    /// one partial for the finished days, not one per block, and the cache
    /// holds their common symbols once.
    pub async fn merge(
        &self,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<MergedProfile, StorageError> {
        let selector = selector.clone();
        let compiled = selector.clone();
        let cached_selector = selector.clone();
        let shared = Arc::clone(&self.shared);
        let cache_shared = Arc::clone(&self.shared);
        let finish_shared = Arc::clone(&self.shared);
        self.visit_all_cached(
            crate::peers::PeerScope::new(
                super::peer_head::selector_matchers(&selector),
                range,
                true,
            ),
            move || CompiledSelector::new(&compiled),
            MergeInProgress::default,
            move |s, q, acc| {
                match q.as_block() {
                    Some(block) => {
                        let target = acc.target_for(&block.meta().id);
                        merge_block(&shared, block, &selector, s, range, target)?;
                    }
                    None => q.merge_into(s, range, &mut acc.merged)?,
                }
                // The merge and the span built beside it, together.
                interrupt::check_held(acc.approx_bytes())
            },
            move |metas, acc| answer_from_cache(&cache_shared, metas, &cached_selector, range, acc),
            move |acc| acc.finish(&finish_shared),
        )
        .await
    }
}

/// A merge while its blocks are visited.
#[derive(Default)]
struct MergeInProgress {
    merged: MergedProfile,
    /// The settled span's partial, built from its blocks on a cache miss.
    span: Option<SpanInProgress>,
}

struct SpanInProgress {
    key: SpanKey,
    merged: MergedProfile,
    /// Blocks of the span added so far (a skipped corrupt block leaves the
    /// span incomplete, and then it is not cached).
    added: usize,
}

impl MergeInProgress {
    /// What the merge holds so far, the span in progress included.
    fn approx_bytes(&self) -> usize {
        self.merged.approx_bytes() + self.span.as_ref().map_or(0, |s| s.merged.approx_bytes())
    }

    /// Where block `id`'s share goes: the span being built if `id` is in
    /// it, else the merge.
    fn target_for(&mut self, id: &str) -> &mut MergedProfile {
        match &mut self.span {
            Some(span) if span.key.1.iter().any(|b| b == id) => {
                span.added += 1;
                &mut span.merged
            }
            _ => &mut self.merged,
        }
    }

    /// The answer: the merge plus the span built meanwhile, which is
    /// cached when every block of it was read.
    fn finish(self, shared: &Shared) -> MergedProfile {
        let Self { mut merged, span } = self;
        if let Some(span) = span {
            let complete = span.added == span.key.1.len();
            let partial = Arc::new(span.merged.into_partial());
            merged.add_partial(&partial);
            if complete {
                let evicted = lock(&shared.catalog.cache).insert_span_partial(span.key, partial);
                free_evicted(evicted);
            }
        }
        merged
    }
}

/// The settled blocks among `metas` that `range` covers whole: those of
/// the days before the newest block's day, which only a day compaction or
/// retention changes, so a span of them keeps its key while newer blocks
/// come and go. None for fewer than two blocks.
fn settled_span(metas: &[BlockMeta], range: TimeRange) -> Option<Vec<String>> {
    let newest = metas.iter().map(|m| m.max_time_ms).max()?;
    let settled_before = newest - newest.rem_euclid(crate::planner::DAY_MS);
    let mut ids: Vec<String> = metas
        .iter()
        .filter(|m| m.max_time_ms < settled_before)
        .filter(|m| m.min_time_ms >= range.start_ms && m.max_time_ms < range.end_ms)
        .map(|m| m.id.clone())
        .collect();
    ids.sort_unstable();
    (ids.len() >= 2).then_some(ids)
}

/// Answers what the cache can of `metas` for a merge: the settled span
/// from its partial (or starts building it), then single blocks from
/// theirs. Returns which blocks were answered.
fn answer_from_cache(
    shared: &Shared,
    metas: &[BlockMeta],
    selector: &Selector,
    range: TimeRange,
    acc: &mut MergeInProgress,
) -> Vec<bool> {
    let mut answered = vec![false; metas.len()];
    if let Some(ids) = settled_span(metas, range) {
        let key: SpanKey = (selector.clone(), ids);
        let cached = lock(&shared.catalog.cache).span_partial(&key);
        match cached {
            Some(partial) => {
                acc.merged.add_partial(&partial);
                for (i, meta) in metas.iter().enumerate() {
                    answered[i] = key.1.contains(&meta.id);
                }
            }
            None => {
                acc.span = Some(SpanInProgress {
                    key,
                    merged: MergedProfile::new(),
                    added: 0,
                });
            }
        }
    }
    for (i, meta) in metas.iter().enumerate() {
        if answered[i] {
            continue;
        }
        // A partial cached for the block answers without the block, which
        // may have been evicted long since.
        let key = partial_key(meta, selector, range);
        let cached = lock(&shared.catalog.cache).partial(&meta.id, &key);
        if let Some(partial) = cached {
            acc.target_for(&meta.id).add_partial(&partial);
            answered[i] = true;
        }
    }
    answered
}

/// Adds `block`'s share of a merge to `acc` from the partial cached for
/// the block, this selection and the range's clip to the block, or
/// computes it and caches it. A warm merge over many blocks then translates
/// each block's distinct stacks once instead of reading every series of
/// every block again.
fn merge_block(
    shared: &Shared,
    block: &Block,
    selector: &Selector,
    compiled: &CompiledSelector,
    range: TimeRange,
    acc: &mut MergedProfile,
) -> Result<(), QueryError> {
    let id = &block.meta().id;
    let key = partial_key(block.meta(), selector, range);
    let cached = lock(&shared.catalog.cache).partial(id, &key);
    let partial = match cached {
        Some(partial) => partial,
        None => {
            let partial = Arc::new(block.merge_partial(compiled, range)?);
            let evicted = lock(&shared.catalog.cache).insert_partial(id, key, Arc::clone(&partial));
            free_evicted(evicted);
            partial
        }
    };
    acc.add_partial(&partial);
    Ok(())
}
