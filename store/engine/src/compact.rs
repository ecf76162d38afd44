//! Compaction: merging blocks into one bigger block. Series with equal
//! labels merge, metadata is deduplicated again across the sources (so only
//! entries still referenced survive) and rollups are rebuilt for the larger span.

use std::collections::BTreeMap;

use hashbrown::HashMap;

use crate::block::{Block, COLUMN_CHUNK_MS, encode_block};
use crate::columns::decode_points;
use crate::error::BlockError;
use crate::head::{Head, HeadPoint};
use crate::model::BlockMeta;
use crate::symbols::SymbolTranslator;
use crate::wire::Reader;

fn corrupt(what: &'static str) -> BlockError {
    BlockError::Corrupt { what }
}

/// Merges `blocks` into one block at level `max(source levels) + 1`.
pub fn compact_blocks(
    blocks: &[&Block],
    id: &str,
    replica: &str,
) -> Result<(BlockMeta, Vec<u8>), BlockError> {
    let mut head = Head::new();
    head.level = blocks
        .iter()
        .map(|b| b.meta().compaction_level)
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    head.sources = blocks.iter().map(|b| b.meta().id.clone()).collect();
    for block in blocks {
        import_block(&mut head, block)?;
    }
    encode_block(&head, id, replica)
}

fn import_block(head: &mut Head, block: &Block) -> Result<(), BlockError> {
    let mut translator = SymbolTranslator::new(&block.symbols);
    for series in &block.series {
        let series_id = head.series_id(&series.labels, &series.profile_type);
        let profiles: HashMap<i64, u64> = block
            .totals(series)?
            .into_iter()
            .map(|(ts, _, profiles)| (ts, profiles))
            .collect();
        let mut by_time: BTreeMap<i64, Vec<HeadPoint>> = BTreeMap::new();
        for &(chunk, blob) in &series.columns {
            debug_assert_eq!(chunk.rem_euclid(COLUMN_CHUNK_MS), 0);
            let bytes = block.blob(blob)?;
            let mut r = Reader::new(&bytes);
            let columns = r.count(3).map_err(|_| corrupt("columns"))?;
            for _ in 0..columns {
                let stack = r.u32().map_err(|_| corrupt("columns"))?;
                let labels = r.u32().map_err(|_| corrupt("columns"))?;
                if stack as usize >= block.symbols.node_count()
                    || labels as usize >= block.symbols.label_sets.len()
                {
                    return Err(corrupt("stack key out of range"));
                }
                let stack = translator.node(&block.symbols, &mut head.symbols, stack);
                let labels = translator.label_set(&block.symbols, &mut head.symbols, labels);
                decode_points(&mut r, chunk, |ts, value| {
                    by_time.entry(ts).or_default().push(HeadPoint {
                        stack,
                        labels,
                        value,
                    });
                })
                .map_err(|_| corrupt("column points"))?;
            }
        }
        for (ts, points) in by_time {
            let count = profiles.get(&ts).copied().unwrap_or(1);
            head.push_run(
                series_id,
                ts,
                u32::try_from(count).unwrap_or(u32::MAX),
                points,
            );
        }
    }
    head.add_profiles(block.meta().profiles);
    Ok(())
}
