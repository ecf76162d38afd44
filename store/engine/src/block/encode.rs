//! Encoding a head into a block. Symbols are rebuilt from what the series
//! reference, so unreferenced entries never reach a block.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};

use hashbrown::HashMap;

use super::format::{
    BlobCompressor, BlockCompression, ContainerWriter, SectionKind, header_len, write_blob,
};
use super::rollup::{ROLLUP_WINDOWS_MS, levels_for_span};
use super::{BlobRef, encode_meta, encode_postings, tables, write_blob_ref};
use crate::error::BlockError;
use crate::head::{Head, HeadSeries};
use crate::index::LabelIndex;
use crate::model::{BlockMeta, LabelSet, ProfileType};
use crate::symbols::{SymbolTable, SymbolTranslator};
use crate::wire::Writer;

mod selection;
mod series;

pub use selection::encode_selection;
pub(crate) use series::SeriesEncoder;

/// Rollup chunks of the top level span this long.
const TOP_LEVEL_CHUNK_MS: i64 = 30 * 86_400_000;

/// Windows of `level` are stored in chunks this long (the next level's window).
pub(crate) fn rollup_chunk_ms(level: u8) -> i64 {
    ROLLUP_WINDOWS_MS
        .get(level as usize + 1)
        .copied()
        .unwrap_or(TOP_LEVEL_CHUNK_MS)
}

/// Encodes `head` into one block object; returns its metadata and bytes.
pub fn encode_block(
    head: &Head,
    id: &str,
    replica: &str,
) -> Result<(BlockMeta, Vec<u8>), BlockError> {
    encode_heads(&[head], id, replica)
}

/// Encodes the shards of one sharded head into one block object: series
/// with equal labels in several shards become one series; the block's
/// symbol table is the largest shard's with the others' entries translated
/// into it. Level and sources are the first shard's (shards of one head
/// share them).
pub fn encode_heads(
    heads: &[&Head],
    id: &str,
    replica: &str,
) -> Result<(BlockMeta, Vec<u8>), BlockError> {
    let bounds = heads.iter().filter_map(|h| h.time_bounds());
    let (min_ms, max_ms) = bounds
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
        .ok_or(BlockError::Empty)?;
    // Every output series and its parts, in label order (the order a
    // block's directory and index need).
    let mut order: BTreeMap<&LabelSet, Vec<(usize, &HeadSeries)>> = BTreeMap::new();
    for (shard, head) in heads.iter().enumerate() {
        for series in head.series.iter().filter(|s| !s.points.is_empty()) {
            order
                .entry(&series.labels)
                .or_default()
                .push((shard, series));
        }
    }
    let Some(first) = heads.first() else {
        return Err(BlockError::Empty);
    };
    if order.is_empty() {
        return Err(BlockError::Empty);
    }

    // The block's table starts as a copy of the largest shard's, whose ids
    // then stay as they are: only the other shards' entries are translated
    // (re-interning every shard's entries was two fifths of a flush). A
    // head's table holds only what its points reference (ingest interns a
    // sample's stack and labels only when it stores a value of it), so the
    // copy adds nothing the translation would have left out.
    let base = (0..heads.len())
        .max_by_key(|&shard| heads[shard].symbols.nodes.len())
        .unwrap_or(0);
    let mut writer =
        BlockWriter::with_symbols(min_ms, max_ms, heads[base].symbols.copy_for_block())?;
    let mut translators: Vec<Option<SymbolTranslator>> = heads
        .iter()
        .enumerate()
        .map(|(shard, h)| (shard != base).then(|| SymbolTranslator::new(&h.symbols)))
        .collect();
    for (labels, parts) in order {
        let mut values = SeriesValues::default();
        for &(shard, series) in &parts {
            let symbols = &heads[shard].symbols;
            let mut translator = translators[shard].as_mut();
            for (run, points) in series.runs_with_points() {
                values.add_total(run.time_ms, run.total, u64::from(run.count));
                for point in points {
                    let key = match translator.as_deref_mut() {
                        None => (point.stack, point.labels),
                        Some(translator) => (
                            translator.node(symbols, &mut writer.symbols, point.stack),
                            translator.label_set(symbols, &mut writer.symbols, point.labels),
                        ),
                    };
                    values.add_point(key, run.time_ms, point.value);
                }
            }
        }
        writer.add_series(labels, &parts[0].1.profile_type, values)?;
    }
    drop(translators);
    writer.finish(BlockIdentity {
        id,
        replica,
        level: first.level,
        sources: first.sources.clone(),
        profiles: heads.iter().map(|h| h.profiles()).sum(),
    })
}

/// Who a block is, for [`BlockWriter::finish`].
pub(crate) struct BlockIdentity<'a> {
    pub(crate) id: &'a str,
    pub(crate) replica: &'a str,
    pub(crate) level: u32,
    pub(crate) sources: Vec<String>,
    pub(crate) profiles: u64,
}

/// The values of one series, already in the output block's symbol space,
/// gathered before the series is encoded. Only one series is held at a time,
/// so writing a block needs memory for its symbols, its encoded bytes and
/// its largest series, never for all decoded points at once.
#[derive(Debug, Default)]
pub(crate) struct SeriesValues {
    columns: HashMap<ColumnKey, Vec<(i64, i64)>>,
    /// Per profile time: value total and profiles merged.
    totals: BTreeMap<i64, (i64, u64)>,
}

impl SeriesValues {
    /// Adds one totals row (one run, or one row of a source block).
    pub(crate) fn add_total(&mut self, time_ms: i64, total: i64, profiles: u64) {
        let row = self.totals.entry(time_ms).or_insert((0, 0));
        row.0 = row.0.wrapping_add(total);
        row.1 += profiles;
    }

    /// Adds one value of stack key `key` at `time_ms`.
    pub(crate) fn add_point(&mut self, key: ColumnKey, time_ms: i64, value: i64) {
        self.columns.entry(key).or_default().push((time_ms, value));
    }
}

/// Builds a block series by series: symbols, directory, index and data grow
/// as series are added, and the container is assembled at the end. The data
/// section grows in memory ([`BlockWriter::new`]) or is written out as it
/// grows ([`BlockWriter::spilling`]).
pub(crate) struct BlockWriter<'a> {
    /// The output symbol table; callers translate into it before adding.
    pub(crate) symbols: SymbolTable,
    min_ms: i64,
    max_ms: i64,
    levels: Vec<u8>,
    data: DataWriter<'a>,
    directory: Writer,
    index: LabelIndex,
    series: u32,
    samples: u64,
}

impl<'a> BlockWriter<'a> {
    /// A writer for a block spanning `[min_ms, max_ms]`, built in memory.
    pub(crate) fn new(min_ms: i64, max_ms: i64) -> Result<Self, BlockError> {
        Self::with_data(
            min_ms,
            max_ms,
            DataWriter {
                bytes: vec![0; DATA_START],
                compressor: BlobCompressor::new(BlockCompression::Working)?,
                compression: BlockCompression::Working,
                spill: None,
            },
        )
    }

    /// A writer for a block spanning `[min_ms, max_ms]` that writes the
    /// block to `out` as it grows, so it holds at most
    /// [`SPILL_CHUNK_BYTES`] of the data section; [`BlockWriter::finish_spilled`]
    /// appends the other sections and writes the header at the start.
    pub(crate) fn spilling(
        min_ms: i64,
        max_ms: i64,
        compression: BlockCompression,
        out: &'a mut dyn BlockSink,
    ) -> Result<Self, BlockError> {
        // The header is written into this space once the sections are known.
        out.write_all(&[0; DATA_START])
            .map_err(|source| BlockError::Io {
                what: "block header",
                source,
            })?;
        Self::with_data(
            min_ms,
            max_ms,
            DataWriter {
                bytes: Vec::new(),
                compressor: BlobCompressor::new(compression)?,
                compression,
                spill: Some(Spill {
                    out,
                    crc: crc32fast::Hasher::new(),
                    written: 0,
                }),
            },
        )
    }

    /// [`BlockWriter::new`] with `symbols` as the block's table to start
    /// from: series added later may use its ids as they are.
    pub(crate) fn with_symbols(
        min_ms: i64,
        max_ms: i64,
        symbols: SymbolTable,
    ) -> Result<Self, BlockError> {
        let mut writer = Self::new(min_ms, max_ms)?;
        writer.symbols = symbols;
        Ok(writer)
    }

    fn with_data(min_ms: i64, max_ms: i64, data: DataWriter<'a>) -> Result<Self, BlockError> {
        Ok(Self {
            symbols: SymbolTable::new(),
            min_ms,
            max_ms,
            levels: levels_for_span(min_ms, max_ms),
            data,
            directory: Writer::new(),
            index: LabelIndex::new(),
            series: 0,
            samples: 0,
        })
    }

    /// Encodes one series. Series must be added in label order, each once.
    pub(crate) fn add_series(
        &mut self,
        labels: &LabelSet,
        profile_type: &ProfileType,
        values: SeriesValues,
    ) -> Result<(), BlockError> {
        let encoded = series::encode_series(values, &self.levels, self.min_ms, &mut self.data)?;
        self.add_encoded(labels, profile_type, encoded);
        Ok(())
    }

    /// An encoder for the next series, to be given its points chunk by
    /// chunk ([`BlockWriter::begin_chunk`]) and then to
    /// [`BlockWriter::add_series_from`].
    pub(crate) fn series_encoder(&self) -> SeriesEncoder {
        SeriesEncoder::new(&self.levels, self.min_ms)
    }

    /// Starts `encoder`'s column chunk `chunk`, writing its previous one.
    pub(crate) fn begin_chunk(
        &mut self,
        encoder: &mut SeriesEncoder,
        chunk: i64,
    ) -> Result<(), BlockError> {
        encoder.begin_chunk(chunk, &mut self.data)
    }

    /// Finishes the series `encoder` holds and adds it. Series must be
    /// added in label order, each once.
    pub(crate) fn add_series_from(
        &mut self,
        labels: &LabelSet,
        profile_type: &ProfileType,
        encoder: SeriesEncoder,
    ) -> Result<(), BlockError> {
        let encoded = encoder.finish(&mut self.data)?;
        self.add_encoded(labels, profile_type, encoded);
        Ok(())
    }

    /// Adds an encoded series' directory and index entries (none for a
    /// series without totals, which is not stored).
    fn add_encoded(
        &mut self,
        labels: &LabelSet,
        profile_type: &ProfileType,
        encoded: Option<EncodedSeries>,
    ) {
        let Some(encoded) = encoded else {
            return;
        };
        self.index.add(self.series, labels);
        self.samples += encoded.points;
        self.series += 1;
        self.directory.varint(labels.len() as u64);
        for label in labels.iter() {
            self.directory
                .varint(u64::from(self.symbols.intern_string(&label.name)));
            self.directory
                .varint(u64::from(self.symbols.intern_string(&label.value)));
        }
        encoded.write_entry(profile_type, &mut self.symbols, &mut self.directory);
    }

    /// Assembles the container in memory.
    pub(crate) fn finish(
        self,
        identity: BlockIdentity<'_>,
    ) -> Result<(BlockMeta, Vec<u8>), BlockError> {
        let (meta, container, data) = self.sections(identity)?;
        // Blobs inside are compressed one by one so queries decompress only
        // what they read; the section is not copied, the header goes into
        // the space reserved before it.
        let bytes = container.finish_around(SectionKind::Data, data.bytes, DATA_START)?;
        let meta = BlockMeta {
            size_bytes: bytes.len() as u64,
            ..meta
        };
        Ok((meta, bytes))
    }

    /// Finishes a block written by a [`BlockWriter::spilling`] writer: the
    /// rest of the data section, the other sections after it, then the
    /// header at the start of `out`, which is flushed.
    pub(crate) fn finish_spilled(
        self,
        identity: BlockIdentity<'_>,
    ) -> Result<BlockMeta, BlockError> {
        let (meta, container, data) = self.sections(identity)?;
        let Some(mut spill) = data.spill else {
            return Err(BlockError::Corrupt {
                what: "an in-memory block writer finished as a spilling one",
            });
        };
        spill.write(&data.bytes)?;
        let io = |what| move |source| BlockError::Io { what, source };
        let first = (
            SectionKind::Data,
            spill.written,
            spill.crc.clone().finalize(),
        );
        let (header, tail) = container.finish_streamed(first, DATA_START, &mut *spill.out)?;
        spill
            .out
            .seek(SeekFrom::Start(0))
            .map_err(io("block header"))?;
        spill
            .out
            .write_all(header.as_slice())
            .map_err(io("block header"))?;
        spill.out.flush().map_err(io("block"))?;
        Ok(BlockMeta {
            size_bytes: DATA_START as u64 + spill.written + tail,
            ..meta
        })
    }

    /// The block's metadata and every section but the data section.
    fn sections(
        mut self,
        identity: BlockIdentity<'_>,
    ) -> Result<(BlockMeta, ContainerWriter, DataWriter<'a>), BlockError> {
        if self.series == 0 {
            return Err(BlockError::Empty);
        }
        let postings = encode_postings(&self.index, &mut self.symbols)?;
        let meta = BlockMeta {
            format_version: super::format::FORMAT_VERSION,
            id: identity.id.to_owned(),
            min_time_ms: self.min_ms,
            max_time_ms: self.max_ms,
            compaction_level: identity.level,
            replica: identity.replica.to_owned(),
            sources: identity.sources,
            series: u64::from(self.series),
            samples: self.samples,
            profiles: identity.profiles,
            size_bytes: 0,
        };
        let mut directory = Writer::new();
        directory.varint(u64::from(self.series));
        directory.raw(self.directory.as_slice());
        drop(self.directory);
        let encoded_tables = tables::encode_tables(&self.symbols);
        drop(self.symbols);
        let mut container = ContainerWriter::new(self.data.compression);
        container.add(SectionKind::Meta, encode_meta(&meta), false)?;
        container.add(SectionKind::Strings, encoded_tables.strings, true)?;
        container.add(SectionKind::Mappings, encoded_tables.mappings, true)?;
        container.add(SectionKind::Functions, encoded_tables.functions, true)?;
        container.add(SectionKind::Locations, encoded_tables.locations, true)?;
        container.add(SectionKind::Stacks, encoded_tables.stacks, true)?;
        container.add(SectionKind::LabelSets, encoded_tables.label_sets, true)?;
        container.add(SectionKind::Series, directory.into_vec(), true)?;
        container.add(SectionKind::Postings, postings, true)?;
        Ok((meta, container, self.data))
    }
}

struct EncodedSeries {
    points: u64,
    min_ms: i64,
    max_ms: i64,
    columns: Vec<(i64, BlobRef)>,
    totals: BlobRef,
    rollups: Vec<(u8, i64, BlobRef)>,
}

impl EncodedSeries {
    /// Writes the rest of the series' directory entry (the caller wrote its labels).
    fn write_entry(&self, t: &ProfileType, symbols: &mut SymbolTable, w: &mut Writer) {
        for s in [
            &t.name,
            &t.sample_type,
            &t.sample_unit,
            &t.period_type,
            &t.period_unit,
        ] {
            w.varint(u64::from(symbols.intern_string(s)));
        }
        w.byte(u8::from(t.delta));
        w.signed(self.min_ms);
        w.signed(self.max_ms);
        w.varint(self.columns.len() as u64);
        for &(start, blob) in &self.columns {
            w.signed(start);
            write_blob_ref(w, blob);
        }
        write_blob_ref(w, self.totals);
        w.varint(self.rollups.len() as u64);
        for &(level, start, blob) in &self.rollups {
            w.byte(level);
            w.signed(start);
            write_blob_ref(w, blob);
        }
    }
}

/// Where a block being written goes: a temporary file, a buffer.
pub trait BlockSink: Write + Seek {}

impl<T: Write + Seek> BlockSink for T {}

/// A spilling writer hands its data section to its sink in pieces this large.
pub(crate) const SPILL_CHUNK_BYTES: usize = 1 << 20;

/// The data section being built, with one zstd context for all blobs.
struct DataWriter<'a> {
    /// In memory: the reserved header space and the section. Spilling: the
    /// section's bytes not yet written out.
    bytes: Vec<u8>,
    compressor: BlobCompressor,
    /// What `compressor` was made for; the other sections follow it.
    compression: BlockCompression,
    spill: Option<Spill<'a>>,
}

/// The data section's bytes written out so far and their running CRC.
struct Spill<'a> {
    out: &'a mut dyn BlockSink,
    crc: crc32fast::Hasher,
    written: u64,
}

impl Spill<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), BlockError> {
        self.out.write_all(bytes).map_err(|source| BlockError::Io {
            what: "data section",
            source,
        })?;
        self.crc.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }
}

/// Sections of a block: meta, six symbol tables, series, postings, data.
const BLOCK_SECTIONS: usize = 10;
/// Where the data section starts in `DataWriter::bytes`: the container
/// header is written into the space before it (`finish_around`).
const DATA_START: usize = header_len(BLOCK_SECTIONS);

impl DataWriter<'_> {
    /// Bytes of the data section so far (offsets are within the section).
    fn section_len(&self) -> usize {
        match &self.spill {
            None => self.bytes.len() - DATA_START,
            Some(spill) => spill.written as usize + self.bytes.len(),
        }
    }

    fn push_blob(&mut self, raw: &[u8]) -> Result<BlobRef, BlockError> {
        let offset = self.section_len();
        write_blob(raw, &mut self.compressor, &mut self.bytes)?;
        let len = self.section_len() - offset;
        if let Some(spill) = &mut self.spill
            && self.bytes.len() >= SPILL_CHUNK_BYTES
        {
            spill.write(&self.bytes)?;
            self.bytes.clear();
        }
        Ok(BlobRef { offset, len })
    }
}

/// (stack node, sample label set) in the output block's symbol space.
pub(crate) type ColumnKey = (u32, u32);
