//! A stored block as compaction reads it: by range, never whole. The
//! header, metadata, symbol tables and series directory are read once; the
//! symbol tables are translated into the merge's output table straight away
//! and dropped, leaving one id remap per stack node and sample label set;
//! the data section is read forward through a bounded window as the merge
//! walks the series in label order (the order a block lays its data out
//! in), with the section's CRC computed as it passes.

use std::borrow::Cow;

use super::format::{
    BlobCheck, PREAMBLE_LEN, SectionEntry, SectionKind, header_len, parse_preamble,
    parse_section_table, read_blob,
};
use super::{BlobRef, BlockSeries, decode_meta, read_series_entry, tables};
use crate::error::BlockError;
use crate::model::BlockMeta;
use crate::symbols::{SymbolTable, SymbolTranslator};
use crate::wire::Reader;

/// Random access to a stored block's bytes: a local file read at offsets,
/// an object store's range reads. The engine does no IO itself.
pub trait BlockRanges {
    /// The block's size in bytes.
    fn size(&self) -> u64;

    /// Appends the `len` bytes at `offset` to `buf`.
    fn read_range(&mut self, offset: u64, len: usize, buf: &mut Vec<u8>) -> std::io::Result<()>;
}

/// Appends `len` bytes at `offset` to `buf`, refusing a short read.
pub(crate) fn read_into<R: BlockRanges + ?Sized>(
    ranges: &mut R,
    offset: u64,
    len: usize,
    buf: &mut Vec<u8>,
) -> Result<(), BlockError> {
    let before = buf.len();
    ranges
        .read_range(offset, len, buf)
        .map_err(|source| BlockError::Io {
            what: "block range",
            source,
        })?;
    if buf.len() != before + len {
        return Err(BlockError::Truncated {
            what: "block range",
        });
    }
    Ok(())
}

/// A source block's section table and metadata, read before the merge
/// starts (the output's time span comes from every source's).
#[derive(Debug)]
pub(crate) struct SourceHeader {
    pub(crate) meta: BlockMeta,
    entries: Vec<SectionEntry>,
    /// How the block's data blobs are checked.
    pub(crate) blob_check: BlobCheck,
}

impl SourceHeader {
    /// Reads and checks the header and the metadata section.
    pub(crate) fn read<R: BlockRanges>(ranges: &mut R) -> Result<Self, BlockError> {
        let size = ranges.size();
        let mut buf = Vec::new();
        read_into(
            ranges,
            0,
            PREAMBLE_LEN.min(usize::try_from(size).unwrap_or(PREAMBLE_LEN)),
            &mut buf,
        )?;
        let preamble = parse_preamble(&buf)?;
        let count = preamble.sections;
        let len = header_len(count as usize);
        if len as u64 > size {
            return Err(BlockError::Truncated {
                what: "section table",
            });
        }
        buf.clear();
        read_into(ranges, 0, len, &mut buf)?;
        let entries = parse_section_table(&buf, count)?;
        if let Some(entry) = entries
            .iter()
            .find(|e| e.offset.checked_add(e.len).is_none_or(|end| end > size))
        {
            return Err(BlockError::Truncated {
                what: entry.kind.name(),
            });
        }
        let mut meta = decode_meta(&section(&entries, ranges, SectionKind::Meta)?)?;
        meta.size_bytes = size;
        Ok(Self {
            meta,
            entries,
            blob_check: preamble.blob_check,
        })
    }

    pub(crate) fn entry(&self, kind: SectionKind) -> Result<SectionEntry, BlockError> {
        entry(&self.entries, kind)
    }

    /// Decompressed bytes of the sections of `kinds` (0 for missing ones):
    /// what holding them decoded starts from, known before reading them.
    pub(crate) fn decompressed_bytes(&self, kinds: &[SectionKind]) -> u64 {
        self.entries
            .iter()
            .filter(|e| kinds.contains(&e.kind))
            .map(|e| if e.is_raw() { e.len } else { e.raw_len })
            .fold(0, u64::saturating_add)
    }

    /// The block's symbol tables, read by range and decoded.
    pub(crate) fn decode_symbols<R: BlockRanges>(
        &self,
        ranges: &mut R,
    ) -> Result<SymbolTable, BlockError> {
        tables::decode_symbol_sections(|kind| self.section(ranges, kind))
    }

    /// One whole section, checked and decompressed.
    pub(crate) fn section<R: BlockRanges>(
        &self,
        ranges: &mut R,
        kind: SectionKind,
    ) -> Result<Vec<u8>, BlockError> {
        section(&self.entries, ranges, kind)
    }
}

fn entry(entries: &[SectionEntry], kind: SectionKind) -> Result<SectionEntry, BlockError> {
    entries
        .iter()
        .find(|e| e.kind == kind)
        .copied()
        .ok_or(BlockError::MissingSection {
            section: kind.name(),
        })
}

/// One whole section, checked and decompressed.
fn section<R: BlockRanges>(
    entries: &[SectionEntry],
    ranges: &mut R,
    kind: SectionKind,
) -> Result<Vec<u8>, BlockError> {
    let entry = entry(entries, kind)?;
    let len =
        usize::try_from(entry.len).map_err(|_| BlockError::Truncated { what: kind.name() })?;
    let mut stored = Vec::new();
    read_into(ranges, entry.offset, len, &mut stored)?;
    entry.inflate(stored)
}

/// What the merge keeps of one source: id remaps into the output table and
/// the data section's reader.
pub(crate) struct SourceData<R> {
    /// Output stack node of each source stack node.
    nodes: Vec<u32>,
    /// Output sample label set of each source label set.
    label_sets: Vec<u32>,
    data: DataWindow<R>,
}

/// A source's series directory, decoded one entry at a time as the merge
/// reaches it (entries are in label order), so the merge never holds every
/// source's directory decoded.
pub(crate) struct SeriesCursor {
    bytes: Vec<u8>,
    position: usize,
    remaining: usize,
    data_len: usize,
    /// Output string of each source string.
    strings: Vec<u32>,
}

impl SeriesCursor {
    /// Heap bytes held: the encoded directory and the string remap.
    pub(crate) fn held_bytes(&self) -> usize {
        self.bytes.capacity() + self.strings.capacity() * size_of::<u32>()
    }

    /// The next series, its strings resolved through `output`.
    pub(crate) fn next(&mut self, output: &SymbolTable) -> Result<Option<BlockSeries>, BlockError> {
        if self.remaining == 0 {
            return Ok(None);
        }
        let rest = self.bytes.get(self.position..).unwrap_or_default();
        let mut r = Reader::new(rest);
        let strings = &self.strings;
        let string_of = |id: u32| {
            strings
                .get(id as usize)
                .filter(|&&out| (out as usize) < output.string_count())
                .map(|&out| output.string(out))
        };
        let series = read_series_entry(&mut r, &string_of, self.data_len)?;
        self.position += rest.len() - r.remaining();
        self.remaining -= 1;
        Ok(Some(series))
    }
}

/// Opens a source for the merge: translates its symbol tables into
/// `output` (one decoded table at a time, dropped before returning) and
/// returns its series directory cursor, its data reader and the heap bytes
/// its decoded tables took while they were held. Each read of the data
/// section fetches at least `window` bytes.
pub(crate) fn open_source<R: BlockRanges>(
    mut ranges: R,
    header: &SourceHeader,
    output: &mut SymbolTable,
    window: usize,
) -> Result<(SeriesCursor, SourceData<R>, usize), BlockError> {
    let symbols = header.decode_symbols(&mut ranges)?;
    let data = header.entry(SectionKind::Data)?;
    let data_len = if data.is_raw() {
        data.len
    } else {
        data.raw_len
    };
    let data_len = usize::try_from(data_len).map_err(|_| BlockError::Truncated { what: "data" })?;
    let directory = header.section(&mut ranges, SectionKind::Series)?;
    let mut r = Reader::new(&directory);
    let count = r
        .count(8)
        .map_err(|_| BlockError::Corrupt { what: "series" })?;
    let position = directory.len() - r.remaining();
    // Every entry of a block's tables is referenced by its series (blocks
    // are written from what their series reference), so translating all of
    // them up front brings nothing unreferenced into the output.
    let (strings, nodes, label_sets) =
        SymbolTranslator::new(&symbols).translate_all(&symbols, output);
    let decoded_bytes = symbols.approx_bytes();
    drop(symbols);
    let series = SeriesCursor {
        bytes: directory,
        position,
        remaining: count,
        data_len,
        strings,
    };
    let data = DataWindow::open(ranges, data, window, header.blob_check)?;
    Ok((
        series,
        SourceData {
            nodes,
            label_sets,
            data,
        },
        decoded_bytes,
    ))
}

impl<R: BlockRanges> SourceData<R> {
    /// Heap bytes this source's merge state holds: its id remaps and its
    /// read window.
    pub(crate) fn held_bytes(&self) -> usize {
        (self.nodes.capacity() + self.label_sets.capacity()) * size_of::<u32>()
            + self.data.buf.capacity()
    }

    /// Output stack key of a source `(stack node, label set)`.
    pub(crate) fn key(&self, stack: u32, labels: u32) -> Result<(u32, u32), BlockError> {
        match (
            self.nodes.get(stack as usize),
            self.label_sets.get(labels as usize),
        ) {
            (Some(&node), Some(&set)) => Ok((node, set)),
            _ => Err(BlockError::Corrupt {
                what: "stack key out of range",
            }),
        }
    }

    /// The decompressed bytes of a blob of the data section.
    pub(crate) fn blob(&mut self, blob: BlobRef) -> Result<Cow<'_, [u8]>, BlockError> {
        self.data.blob(blob)
    }

    /// Every totals row `(time, total, profiles)` of a series of a block
    /// starting at `block_min_ms`.
    pub(crate) fn totals(
        &mut self,
        series: &BlockSeries,
        block_min_ms: i64,
    ) -> Result<Vec<(i64, i64, u64)>, BlockError> {
        let corrupt = |_| BlockError::Corrupt { what: "totals" };
        let raw = self.blob(series.totals)?;
        let mut r = Reader::new(&raw);
        let count = r.count(3).map_err(corrupt)?;
        let mut rows = Vec::with_capacity(count);
        let mut previous = block_min_ms;
        for _ in 0..count {
            let ts = previous.wrapping_add(r.signed().map_err(corrupt)?);
            let total = r.signed().map_err(corrupt)?;
            let profiles = r.varint().map_err(corrupt)?;
            rows.push((ts, total, profiles));
            previous = ts;
        }
        Ok(rows)
    }

    /// Reads the rest of the data section and checks its CRC: a merge
    /// calls this before it finishes its output.
    pub(crate) fn finish(self) -> Result<(), BlockError> {
        self.data.finish()
    }
}

/// The data section, read forward. Holds the bytes from the blob that last
/// needed a refill up to what was read past it (at most one blob plus
/// `window`).
struct DataWindow<R> {
    ranges: R,
    /// Where the section starts in the block, its length and CRC.
    section_at: u64,
    section_len: u64,
    expected_crc: u32,
    crc: crc32fast::Hasher,
    /// Bytes `[buf_at, read_to)` of the section.
    buf: Vec<u8>,
    buf_at: u64,
    read_to: u64,
    window: usize,
    /// A compressed section is held whole, already checked.
    whole: bool,
    /// How the blobs are checked (the section's CRC is checked as well).
    check: BlobCheck,
}

impl<R: BlockRanges> DataWindow<R> {
    fn open(
        ranges: R,
        entry: SectionEntry,
        window: usize,
        check: BlobCheck,
    ) -> Result<Self, BlockError> {
        let mut reader = Self {
            section_at: entry.offset,
            section_len: entry.len,
            expected_crc: entry.crc,
            crc: crc32fast::Hasher::new(),
            buf: Vec::new(),
            buf_at: 0,
            read_to: 0,
            window: window.max(4096),
            whole: false,
            check,
            ranges,
        };
        if !entry.is_raw() {
            // Every block written so far stores its data section raw (its
            // blobs are compressed one by one); a compressed one is read whole.
            let len =
                usize::try_from(entry.len).map_err(|_| BlockError::Truncated { what: "data" })?;
            let mut stored = Vec::new();
            read_into(&mut reader.ranges, entry.offset, len, &mut stored)?;
            reader.buf = entry.inflate(stored)?;
            reader.section_len = reader.buf.len() as u64;
            reader.read_to = reader.section_len;
            reader.whole = true;
        }
        Ok(reader)
    }

    fn blob(&mut self, blob: BlobRef) -> Result<Cow<'_, [u8]>, BlockError> {
        let start = blob.offset as u64;
        let end = start.saturating_add(blob.len as u64);
        if end > self.section_len {
            return Err(BlockError::Truncated { what: "data blob" });
        }
        if !self.whole {
            if start < self.buf_at {
                // Behind the window: a writer that laid blobs out in another
                // order. Correct, only slower: read the blob alone.
                let mut bytes = Vec::new();
                read_into(
                    &mut self.ranges,
                    self.section_at + start,
                    blob.len,
                    &mut bytes,
                )?;
                return Ok(Cow::Owned(read_blob(&bytes, self.check)?.into_owned()));
            }
            if start >= self.read_to {
                self.buf.clear();
                self.hash_through(start)?;
                self.buf_at = start;
            } else if end > self.read_to {
                // NB: the consumed prefix is dropped only before a refill.
                // Dropping it on every blob moved the rest of the window
                // each time, which was most of a merge's memmove.
                self.buf.drain(..(start - self.buf_at) as usize);
                self.buf_at = start;
            }
            while self.read_to < end {
                let len = (self.section_len - self.read_to).min(self.window as u64) as usize;
                let from = self.buf.len();
                read_into(
                    &mut self.ranges,
                    self.section_at + self.read_to,
                    len,
                    &mut self.buf,
                )?;
                self.crc.update(&self.buf[from..]);
                self.read_to += len as u64;
            }
        }
        let from = (start - self.buf_at) as usize;
        read_blob(&self.buf[from..from + blob.len], self.check)
    }

    /// Reads (and hashes) the section up to `target` without keeping it.
    fn hash_through(&mut self, target: u64) -> Result<(), BlockError> {
        let mut piece = Vec::new();
        while self.read_to < target {
            let len = (target - self.read_to).min(self.window as u64) as usize;
            piece.clear();
            read_into(
                &mut self.ranges,
                self.section_at + self.read_to,
                len,
                &mut piece,
            )?;
            self.crc.update(&piece);
            self.read_to += len as u64;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), BlockError> {
        if self.whole {
            return Ok(());
        }
        self.buf = Vec::new();
        self.hash_through(self.section_len)?;
        if self.crc.finalize() != self.expected_crc {
            return Err(BlockError::ChecksumMismatch { section: "data" });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
