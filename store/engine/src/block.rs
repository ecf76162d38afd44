//! Immutable blocks: one self-describing binary object per block holding
//! the symbol tables, series, label index, compressed columns, totals and
//! rollups. See [`format`] for the container layout.

pub(crate) mod encode;
pub mod format;
mod memory;
mod partial;
mod query;
mod ranged;
mod rollup;
pub(crate) mod source;
mod stored_series;
mod tables;

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use roaring::RoaringBitmap;

pub use encode::{BlockSink, encode_block, encode_heads, encode_selection};
pub use partial::BlockPartial;
pub(crate) use ranged::projected_hold;
pub use ranged::{SharedBlockRanges, projected_ranged_hold};
pub use source::BlockRanges;
pub use stored_series::{BlockSeriesDirectory, StoredSeries};

use crate::error::BlockError;
use crate::index::LabelIndex;
use crate::model::{BlockMeta, Label, LabelSet, ProfileType};
use crate::symbols::SymbolTable;
use crate::wire::{Reader, WireError, Writer};
use format::{Container, SectionKind};

/// Raw columns are chunked by this window so a query reads only the chunks it touches.
pub(crate) const COLUMN_CHUNK_MS: i64 = 3_600_000;

/// A decoded block. Symbols, series and the index are decoded eagerly;
/// column, totals and rollup data stay compressed until a query needs them,
/// in memory ([`Block::decode`]) or in the stored block, read by range
/// ([`Block::open_ranged`]).
#[derive(Debug)]
pub struct Block {
    meta: BlockMeta,
    pub(crate) symbols: SymbolTable,
    pub(crate) index: LabelIndex,
    pub(crate) series: Vec<BlockSeries>,
    pub(crate) data: ranged::BlockData,
}

/// Where a blob lives in the data section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlobRef {
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// One series' directory entry.
#[derive(Debug, Clone)]
pub(crate) struct BlockSeries {
    pub(crate) labels: LabelSet,
    pub(crate) profile_type: ProfileType,
    pub(crate) min_ms: i64,
    pub(crate) max_ms: i64,
    /// `(chunk start, blob)` of raw columns, by chunk start.
    pub(crate) columns: Vec<(i64, BlobRef)>,
    pub(crate) totals: BlobRef,
    /// `(level, chunk start, blob)` of rollup windows.
    pub(crate) rollups: Vec<(u8, i64, BlobRef)>,
}

/// `part` as a slice of `whole` sharing its buffer, when `part` lies
/// within it (a section the container parsed out of `whole` does).
fn slice_of(whole: &Bytes, part: &[u8]) -> Option<Bytes> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then(|| whole.slice(start..end))
}

fn corrupt(what: &'static str) -> impl Fn(WireError) -> BlockError {
    move |_| BlockError::Corrupt { what }
}

impl Block {
    /// Decodes and verifies a block; corrupt or truncated bytes give a
    /// [`BlockError`], never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Block, BlockError> {
        Self::decode_with(bytes, |data, check| {
            ranged::BlockData::loaded(data.into_owned(), check)
        })
    }

    /// [`Block::decode`] of a fetched block that the decoded one may keep:
    /// a data section stored uncompressed (every writer's) is held as a
    /// slice of `bytes`, not copied, and the block is charged all of
    /// `bytes`.
    ///
    /// NB: copying the section out of the fetched buffer was a third of the
    /// CPU of the workload bench's cold 7-day one-pod merge at 2,000 pods
    /// (perf), most of it the kernel zeroing the copy's fresh pages.
    pub fn decode_shared(bytes: Bytes) -> Result<Block, BlockError> {
        Self::decode_with(&bytes, |data, check| match data {
            Cow::Borrowed(section) => match slice_of(&bytes, section) {
                Some(data) => ranged::BlockData::Loaded {
                    data,
                    held: bytes.len(),
                    check,
                },
                None => ranged::BlockData::loaded(section.to_vec(), check),
            },
            Cow::Owned(section) => ranged::BlockData::loaded(section, check),
        })
    }

    fn decode_with(
        bytes: &[u8],
        hold: impl FnOnce(Cow<'_, [u8]>, format::BlobCheck) -> ranged::BlockData,
    ) -> Result<Block, BlockError> {
        let container = Container::parse(bytes)?;
        let mut meta = decode_meta(&container.section(SectionKind::Meta)?)?;
        meta.size_bytes = bytes.len() as u64;
        let symbols = tables::decode_symbol_sections(|kind| container.section(kind))?;
        let data = container.section(SectionKind::Data)?;
        let data_len = data.len();
        let series = decode_series(&container.section(SectionKind::Series)?, &symbols, data_len)?;
        let index = decode_postings(
            &container.section(SectionKind::Postings)?,
            &symbols,
            series.len(),
        )?;
        Ok(Block {
            meta,
            symbols,
            index,
            series,
            data: hold(data, container.blob_check),
        })
    }

    /// Whether the data section is read by range rather than held.
    pub fn reads_data_by_range(&self) -> bool {
        matches!(self.data, ranged::BlockData::Ranged(_))
    }

    /// The block's metadata (as also written to `meta.json`).
    pub fn meta(&self) -> &BlockMeta {
        &self.meta
    }

    /// The block's symbol table.
    pub fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }

    /// Number of series.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Number of stored rollup chunks (pre-merged window groups) over all series.
    pub fn rollup_chunk_count(&self) -> usize {
        self.series.iter().map(|s| s.rollups.len()).sum()
    }

    pub(crate) fn blob(&self, blob: BlobRef) -> Result<std::borrow::Cow<'_, [u8]>, BlockError> {
        self.data.blob(blob)
    }
}

pub(crate) fn encode_meta(meta: &BlockMeta) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(meta.id.as_bytes());
    w.bytes(meta.replica.as_bytes());
    w.signed(meta.min_time_ms);
    w.signed(meta.max_time_ms);
    w.varint(u64::from(meta.compaction_level));
    w.varint(meta.sources.len() as u64);
    for source in &meta.sources {
        w.bytes(source.as_bytes());
    }
    w.varint(meta.series);
    w.varint(meta.samples);
    w.varint(meta.profiles);
    w.into_vec()
}

pub(crate) fn decode_meta(bytes: &[u8]) -> Result<BlockMeta, BlockError> {
    let what = "meta";
    let mut r = Reader::new(bytes);
    let string = |r: &mut Reader<'_>| -> Result<String, BlockError> {
        let raw = r.bytes().map_err(corrupt(what))?;
        String::from_utf8(raw.to_vec()).map_err(|_| BlockError::Corrupt { what })
    };
    let id = string(&mut r)?;
    let replica = string(&mut r)?;
    let min_time_ms = r.signed().map_err(corrupt(what))?;
    let max_time_ms = r.signed().map_err(corrupt(what))?;
    let compaction_level = r.u32().map_err(corrupt(what))?;
    let source_count = r.count(1).map_err(corrupt(what))?;
    let mut sources = Vec::with_capacity(source_count);
    for _ in 0..source_count {
        sources.push(string(&mut r)?);
    }
    Ok(BlockMeta {
        format_version: format::FORMAT_VERSION,
        id,
        min_time_ms,
        max_time_ms,
        compaction_level,
        replica,
        sources,
        series: r.varint().map_err(corrupt(what))?,
        samples: r.varint().map_err(corrupt(what))?,
        profiles: r.varint().map_err(corrupt(what))?,
        size_bytes: 0,
    })
}

fn read_blob_ref(r: &mut Reader<'_>, data_len: usize) -> Result<BlobRef, BlockError> {
    let what = "series blob reference";
    let offset = usize::try_from(r.varint().map_err(corrupt(what))?)
        .map_err(|_| BlockError::Corrupt { what })?;
    let len = usize::try_from(r.varint().map_err(corrupt(what))?)
        .map_err(|_| BlockError::Corrupt { what })?;
    if offset.checked_add(len).is_none_or(|end| end > data_len) || len == 0 {
        return Err(BlockError::Corrupt { what });
    }
    Ok(BlobRef { offset, len })
}

pub(crate) fn write_blob_ref(w: &mut Writer, blob: BlobRef) {
    w.varint(blob.offset as u64);
    w.varint(blob.len as u64);
}

pub(crate) fn decode_series(
    bytes: &[u8],
    symbols: &SymbolTable,
    data_len: usize,
) -> Result<Vec<BlockSeries>, BlockError> {
    let mut r = Reader::new(bytes);
    let count = r.count(8).map_err(corrupt("series"))?;
    let string_of = |id: u32| ((id as usize) < symbols.string_count()).then(|| symbols.string(id));
    let mut series = Vec::with_capacity(count);
    for _ in 0..count {
        series.push(read_series_entry(&mut r, &string_of, data_len)?);
    }
    Ok(series)
}

/// Reads one entry of the series directory; `string_of` resolves the
/// block's string ids (`None`: out of range).
pub(crate) fn read_series_entry<'s>(
    r: &mut Reader<'_>,
    string_of: &dyn Fn(u32) -> Option<&'s str>,
    data_len: usize,
) -> Result<BlockSeries, BlockError> {
    let what = "series";
    let string = |r: &mut Reader<'_>| -> Result<String, BlockError> {
        let id = r.u32().map_err(corrupt(what))?;
        string_of(id)
            .map(str::to_owned)
            .ok_or(BlockError::Corrupt { what })
    };
    let label_count = r.count(2).map_err(corrupt(what))?;
    let mut labels = Vec::with_capacity(label_count);
    for _ in 0..label_count {
        let name = string(r)?;
        let value = string(r)?;
        labels.push(Label::new(name, value));
    }
    let profile_type = ProfileType {
        name: string(r)?,
        sample_type: string(r)?,
        sample_unit: string(r)?,
        period_type: string(r)?,
        period_unit: string(r)?,
        delta: r.byte().map_err(corrupt(what))? != 0,
    };
    let min_ms = r.signed().map_err(corrupt(what))?;
    let max_ms = r.signed().map_err(corrupt(what))?;
    let chunk_count = r.count(3).map_err(corrupt(what))?;
    let mut columns = Vec::with_capacity(chunk_count);
    for _ in 0..chunk_count {
        let start = r.signed().map_err(corrupt(what))?;
        columns.push((start, read_blob_ref(r, data_len)?));
    }
    let totals = read_blob_ref(r, data_len)?;
    let rollup_count = r.count(4).map_err(corrupt(what))?;
    let mut rollups = Vec::with_capacity(rollup_count);
    for _ in 0..rollup_count {
        let level = r.byte().map_err(corrupt(what))?;
        if level as usize >= rollup::ROLLUP_WINDOWS_MS.len() {
            return Err(BlockError::Corrupt { what });
        }
        let start = r.signed().map_err(corrupt(what))?;
        rollups.push((level, start, read_blob_ref(r, data_len)?));
    }
    Ok(BlockSeries {
        labels: LabelSet::new(labels),
        profile_type,
        min_ms,
        max_ms,
        columns,
        totals,
        rollups,
    })
}

fn decode_postings(
    bytes: &[u8],
    symbols: &SymbolTable,
    series_count: usize,
) -> Result<LabelIndex, BlockError> {
    let what = "postings";
    let mut r = Reader::new(bytes);
    let string = |r: &mut Reader<'_>| -> Result<String, BlockError> {
        let id = r.u32().map_err(corrupt(what))?;
        if id as usize >= symbols.string_count() {
            return Err(BlockError::Corrupt { what });
        }
        Ok(symbols.string(id).to_owned())
    };
    let name_count = r.count(2).map_err(corrupt(what))?;
    let mut postings: BTreeMap<String, BTreeMap<String, RoaringBitmap>> = BTreeMap::new();
    for _ in 0..name_count {
        let name = string(&mut r)?;
        let value_count = r.count(2).map_err(corrupt(what))?;
        let values = postings.entry(name).or_default();
        for _ in 0..value_count {
            let value = string(&mut r)?;
            let raw = r.bytes().map_err(corrupt(what))?;
            let bitmap =
                RoaringBitmap::deserialize_from(raw).map_err(|_| BlockError::Corrupt { what })?;
            if bitmap.max().is_some_and(|max| max as usize >= series_count) {
                return Err(BlockError::Corrupt { what });
            }
            values.insert(value, bitmap);
        }
    }
    let count = u32::try_from(series_count).map_err(|_| BlockError::Corrupt { what })?;
    Ok(LabelIndex::from_postings(postings, count))
}

pub(crate) fn encode_postings(
    index: &LabelIndex,
    symbols: &mut SymbolTable,
) -> Result<Vec<u8>, BlockError> {
    let mut w = Writer::new();
    w.varint(index.postings().len() as u64);
    for (name, values) in index.postings() {
        w.varint(u64::from(symbols.intern_string(name)));
        w.varint(values.len() as u64);
        for (value, bitmap) in values {
            w.varint(u64::from(symbols.intern_string(value)));
            let mut raw = Vec::with_capacity(bitmap.serialized_size());
            bitmap
                .serialize_into(&mut raw)
                .map_err(|source| BlockError::Compress {
                    what: "postings",
                    source,
                })?;
            w.bytes(&raw);
        }
    }
    Ok(w.into_vec())
}
