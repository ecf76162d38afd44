//! Compaction: merging blocks into one bigger block, series by series.
//!
//! Series with equal labels merge, metadata is deduplicated again across the
//! sources (only entries still referenced survive) and rollups are rebuilt
//! for the larger span. The merge streams: the output is written one series
//! at a time straight from the sources' compressed columns into the output
//! block's symbol space, so besides the sources (compressed data, decoded
//! symbol tables) it holds only the output's symbols and encoded bytes and
//! one series' values, never a decoded copy of every point.
//!
//! [`compact_streaming`] holds less than its sources: it reads them by range
//! ([`BlockRanges`]) and writes its output as it goes ([`BlockSink`]), so
//! besides the output's symbols and directory it holds one id remap per
//! source stack node and label set, a bounded read window per source and
//! one series.

use std::collections::{BTreeMap, BTreeSet};

use crate::block::encode::{BlockIdentity, BlockWriter, SeriesEncoder, SeriesValues};
use crate::block::format::BlockCompression;
use crate::block::source::{SeriesCursor, SourceData, SourceHeader, open_source};
use crate::block::{BlobRef, Block, BlockRanges, BlockSeries, BlockSink, COLUMN_CHUNK_MS};
use crate::columns::decode_points;
use crate::error::BlockError;
use crate::model::{BlockMeta, LabelSet};
use crate::symbols::{SymbolTable, SymbolTranslator};
use crate::wire::Reader;

mod budget;

pub use budget::{
    MERGE_BYTES_PER_HOUR_VALUE, MERGE_BYTES_PER_OUTPUT_SERIES, MERGE_BYTES_PER_SOURCE_SERIES,
    MERGE_BYTES_PER_SYMBOL_SECTION_BYTE, MERGE_FIXED_BYTES,
};
use budget::{OutputHold, PeakProjection};

fn corrupt(what: &'static str) -> BlockError {
    BlockError::Corrupt { what }
}

/// Merges `blocks` into one block at level `max(source levels) + 1`.
pub fn compact_blocks(
    blocks: &[&Block],
    id: &str,
    replica: &str,
) -> Result<(BlockMeta, Vec<u8>), BlockError> {
    let min_ms = blocks.iter().map(|b| b.meta().min_time_ms).min();
    let max_ms = blocks.iter().map(|b| b.meta().max_time_ms).max();
    let (Some(min_ms), Some(max_ms)) = (min_ms, max_ms) else {
        return Err(BlockError::Empty);
    };
    // Every output series and where it lives in each source, in label
    // order (the order a block's directory and index need).
    let mut merged: BTreeMap<&LabelSet, Vec<(usize, &BlockSeries)>> = BTreeMap::new();
    for (source, block) in blocks.iter().enumerate() {
        for series in &block.series {
            merged
                .entry(&series.labels)
                .or_default()
                .push((source, series));
        }
    }
    let mut writer = BlockWriter::new(min_ms, max_ms)?;
    let mut translators: Vec<SymbolTranslator> = blocks
        .iter()
        .map(|b| SymbolTranslator::new(&b.symbols))
        .collect();
    for (labels, parts) in merged {
        let mut values = SeriesValues::default();
        for &(source, series) in &parts {
            read_series(
                blocks[source],
                series,
                &mut translators[source],
                &mut writer.symbols,
                &mut values,
            )?;
        }
        let profile_type = &parts[0].1.profile_type;
        writer.add_series(labels, profile_type, values)?;
    }
    // The translation memos are not needed to assemble the container.
    drop(translators);
    writer.finish(BlockIdentity {
        id,
        replica,
        level: blocks
            .iter()
            .map(|b| b.meta().compaction_level)
            .max()
            .unwrap_or(0)
            .saturating_add(1),
        sources: blocks.iter().map(|b| b.meta().id.clone()).collect(),
        profiles: blocks.iter().map(|b| b.meta().profiles).sum(),
    })
}

/// Why a streaming compaction failed, and whose fault it was.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    /// A source block could not be read or is corrupt.
    #[error("source block {index} of the compaction cannot be merged")]
    Source {
        /// The source's position in the list given.
        index: usize,
        /// What went wrong reading it.
        #[source]
        source: BlockError,
    },
    /// The merged block could not be built or written out.
    #[error("the merged block cannot be written")]
    Output {
        /// What went wrong.
        #[source]
        source: BlockError,
    },
}

impl CompactionError {
    /// The block error underneath.
    pub fn block_error(&self) -> &BlockError {
        match self {
            Self::Source { source, .. } | Self::Output { source } => source,
        }
    }
}

/// Merges the blocks `sources` read into one block at level
/// `max(source levels) + 1`, compressed as `compression` says and written
/// to `out` as it is built (the header last, at the start); returns its
/// metadata. Each source's data section is
/// read forward `read_window` bytes at a time (more for a larger blob).
/// The output equals [`compact_blocks`]'s in content (series, values,
/// stacks, labels); symbol ids may be numbered differently.
pub fn compact_streaming<R: BlockRanges>(
    sources: Vec<R>,
    id: &str,
    replica: &str,
    read_window: usize,
    compression: BlockCompression,
    out: &mut dyn BlockSink,
) -> Result<BlockMeta, CompactionError> {
    let merge = compact_streaming_within(
        sources,
        &MergeOutput {
            id,
            replica,
            read_window,
            compression,
        },
        MergeLimits::NONE,
        out,
    )?;
    match merge {
        Some(merge) => Ok(merge.meta),
        // An unlimited budget always takes every source.
        None => Err(CompactionError::Output {
            source: BlockError::Empty,
        }),
    }
}

/// Where and how a streaming merge writes its output block.
#[derive(Debug, Clone, Copy)]
pub struct MergeOutput<'a> {
    /// The output block's id.
    pub id: &'a str,
    /// The replica writing it.
    pub replica: &'a str,
    /// Bytes read from a source's data section at a time.
    pub read_window: usize,
    /// How the output's sections are compressed.
    pub compression: BlockCompression,
}

/// What a streaming merge may take.
#[derive(Debug, Clone, Copy)]
pub struct MergeLimits {
    /// Heap bytes the merge may hold at once (its projected peak).
    pub memory_bytes: u64,
    /// Heap one query may hold of the output once it is opened by range
    /// ([`crate::Block::open_ranged`]: its tables, directory and index, not
    /// its data): the sources are taken while the output's projection
    /// fits, its symbols counted in the output's table as sources are
    /// opened (shared ones once) and the sources' directories summed. A
    /// store sets its block cache here, so a merged block always fits in
    /// the cache.
    pub output_held_bytes: u64,
}

impl MergeLimits {
    /// No limit: every source is merged.
    pub const NONE: MergeLimits = MergeLimits {
        memory_bytes: u64::MAX,
        output_held_bytes: u64::MAX,
    };
}

/// A streaming merge that took the first `sources_merged` of its sources.
#[derive(Debug)]
pub struct StreamedMerge {
    /// The output block's metadata; `sources` names the merged ones.
    pub meta: BlockMeta,
    /// How many of the sources given, from the first, were merged.
    pub sources_merged: usize,
    /// Heap bytes the merge held once its sources were open (the output's
    /// symbol table, id remaps, directories, read windows), counted.
    pub held_after_open: u64,
    /// The largest projection the budget was checked against.
    pub projected_peak: u64,
    /// What the output was projected to hold opened by range, checked
    /// against `output_held_bytes`.
    pub projected_output_hold: u64,
    /// Decompressed bytes of the merged sources' symbol sections, and the
    /// heap their decoded tables took (summed; each was held alone): what
    /// [`MERGE_BYTES_PER_SYMBOL_SECTION_BYTE`] is measured from.
    pub symbol_section_bytes: u64,
    /// See `symbol_section_bytes`.
    pub decoded_symbol_bytes: u64,
}

/// Like [`compact_streaming`], within `limits`: sources
/// are opened in the order given (smallest first merges the most) and their
/// symbols translated into the output's table one by one; before each, the
/// merge projects its peak from what it holds so far, counted, plus what
/// the next source can add at most (read from its section table) and what
/// the series being written will take. A source whose projection does not
/// fit ends the list: the sources before it are merged, and the caller
/// merges the rest later. Symbols shared by sources are so charged once.
/// Sources also stop where what the output would hold opened by range,
/// projected the same way, would pass `limits.output_held_bytes`. `None`
/// when not even two sources fit; nothing is written then.
pub fn compact_streaming_within<R: BlockRanges>(
    mut sources: Vec<R>,
    output: &MergeOutput<'_>,
    limits: MergeLimits,
    out: &mut dyn BlockSink,
) -> Result<Option<StreamedMerge>, CompactionError> {
    let source_err = |index| move |source| CompactionError::Source { index, source };
    let output_err = |source| CompactionError::Output { source };
    let mut headers = Vec::with_capacity(sources.len());
    for (index, ranges) in sources.iter_mut().enumerate() {
        headers.push(SourceHeader::read(ranges).map_err(source_err(index))?);
    }
    let window = output.read_window as u64;
    let mut symbols = SymbolTable::new();
    let mut cursors: Vec<SeriesCursor> = Vec::with_capacity(sources.len());
    let mut readers: Vec<SourceData<R>> = Vec::with_capacity(sources.len());
    let mut projection = PeakProjection::default();
    let mut output_hold = OutputHold::default();
    let (mut projected_peak, mut projected_output_hold) = (0, 0);
    let (mut symbol_section_bytes, mut decoded_symbol_bytes) = (0u64, 0u64);
    for (index, (ranges, header)) in sources.into_iter().zip(&headers).enumerate() {
        let output_symbols = symbols.approx_bytes() as u64;
        let next = projection.with(header, output_symbols, window);
        let next_output = output_hold.with(header, output_symbols);
        if next.peak > limits.memory_bytes || next_output.hold > limits.output_held_bytes {
            if index < 2 {
                return Ok(None);
            }
            break;
        }
        projected_peak = projected_peak.max(next.peak);
        projected_output_hold = next_output.hold;
        output_hold.taken(next_output);
        let (cursor, reader, decoded) =
            open_source(ranges, header, &mut symbols, output.read_window)
                .map_err(source_err(index))?;
        symbol_section_bytes = symbol_section_bytes.saturating_add(next.symbol_section_bytes);
        decoded_symbol_bytes = decoded_symbol_bytes.saturating_add(decoded as u64);
        projection.opened(next, (cursor.held_bytes() + reader.held_bytes()) as u64);
        cursors.push(cursor);
        readers.push(reader);
    }
    let merged = &headers[..cursors.len()];
    let held_after_open = (symbols.approx_bytes() as u64).saturating_add(projection.held());
    let min_ms = merged.iter().map(|h| h.meta.min_time_ms).min();
    let max_ms = merged.iter().map(|h| h.meta.max_time_ms).max();
    let (Some(min_ms), Some(max_ms)) = (min_ms, max_ms) else {
        return Err(output_err(BlockError::Empty));
    };
    let mut writer =
        BlockWriter::spilling(min_ms, max_ms, output.compression, out).map_err(output_err)?;
    writer.symbols = symbols;
    // A merge of the sources' directories, each in label order: the output
    // series in label order, each source's data read forward.
    let mut heads: Vec<Option<BlockSeries>> = Vec::with_capacity(cursors.len());
    for (index, cursor) in cursors.iter_mut().enumerate() {
        heads.push(cursor.next(&writer.symbols).map_err(source_err(index))?);
    }
    while let Some(labels) = heads.iter().flatten().map(|s| &s.labels).min().cloned() {
        // Every source series with these labels, then their points an hour
        // chunk at a time across the sources: one hour of the series is
        // held, not the merged span.
        let mut parts: Vec<(usize, BlockSeries)> = Vec::new();
        for (index, head) in heads.iter_mut().enumerate() {
            while let Some(series) = head.take_if(|s| s.labels == labels) {
                parts.push((index, series));
                *head = cursors[index]
                    .next(&writer.symbols)
                    .map_err(source_err(index))?;
            }
        }
        let Some(profile_type) = parts.first().map(|(_, s)| s.profile_type.clone()) else {
            break;
        };
        let mut encoder = writer.series_encoder();
        let chunks: BTreeSet<i64> = parts
            .iter()
            .flat_map(|(_, s)| s.columns.iter().map(|&(chunk, _)| chunk))
            .collect();
        for chunk in chunks {
            writer
                .begin_chunk(&mut encoder, chunk)
                .map_err(output_err)?;
            for (index, series) in &parts {
                if let Ok(at) = series.columns.binary_search_by_key(&chunk, |&(c, _)| c) {
                    let blob = series.columns[at].1;
                    read_source_chunk(&mut readers[*index], chunk, blob, &mut encoder)
                        .map_err(source_err(*index))?;
                }
            }
        }
        for (index, series) in &parts {
            let rows = readers[*index]
                .totals(series, merged[*index].meta.min_time_ms)
                .map_err(source_err(*index))?;
            for (time_ms, total, profiles) in rows {
                encoder.add_total(time_ms, total, profiles);
            }
        }
        writer
            .add_series_from(&labels, &profile_type, encoder)
            .map_err(output_err)?;
    }
    for (index, reader) in readers.into_iter().enumerate() {
        reader.finish().map_err(source_err(index))?;
    }
    drop(cursors);
    let meta = writer
        .finish_spilled(BlockIdentity {
            id: output.id,
            replica: output.replica,
            level: merged
                .iter()
                .map(|h| h.meta.compaction_level)
                .max()
                .unwrap_or(0)
                .saturating_add(1),
            sources: merged.iter().map(|h| h.meta.id.clone()).collect(),
            profiles: merged.iter().map(|h| h.meta.profiles).sum(),
        })
        .map_err(output_err)?;
    Ok(Some(StreamedMerge {
        meta,
        sources_merged: merged.len(),
        held_after_open,
        projected_peak,
        projected_output_hold,
        symbol_section_bytes,
        decoded_symbol_bytes,
    }))
}

/// Adds the points of one column chunk blob of a source read by range to
/// `encoder`, its stack keys remapped into the output.
fn read_source_chunk<R: BlockRanges>(
    source: &mut SourceData<R>,
    chunk: i64,
    blob: BlobRef,
    encoder: &mut SeriesEncoder,
) -> Result<(), BlockError> {
    let bytes = source.blob(blob)?.into_owned();
    let mut r = Reader::new(&bytes);
    let columns = r.count(3).map_err(|_| corrupt("columns"))?;
    for _ in 0..columns {
        let stack = r.u32().map_err(|_| corrupt("columns"))?;
        let labels = r.u32().map_err(|_| corrupt("columns"))?;
        let key = source.key(stack, labels)?;
        let mut outside = None;
        decode_points(&mut r, chunk, |ts, value| {
            if let Err(error) = encoder.add_point(key, ts, value) {
                outside.get_or_insert(error);
            }
        })
        .map_err(|_| corrupt("column points"))?;
        if let Some(error) = outside {
            return Err(error);
        }
    }
    Ok(())
}

/// Adds one source series' totals and raw points to `values`, translating
/// its stack keys into `output`.
fn read_series(
    block: &Block,
    series: &BlockSeries,
    translator: &mut SymbolTranslator,
    output: &mut SymbolTable,
    values: &mut SeriesValues,
) -> Result<(), BlockError> {
    for (time_ms, total, profiles) in block.totals(series)? {
        values.add_total(time_ms, total, profiles);
    }
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
            let key = (
                translator.node(&block.symbols, output, stack),
                translator.label_set(&block.symbols, output, labels),
            );
            decode_points(&mut r, chunk, |ts, value| values.add_point(key, ts, value))
                .map_err(|_| corrupt("column points"))?;
        }
    }
    Ok(())
}
