//! A block opened for queries without holding its data section: the symbol
//! tables, series directory and label index are read by range and decoded
//! as [`Block::decode`] decodes them, and each blob a query asks for is read
//! from the stored block through one bounded window.
//!
//! NB: a decoded block holding its data section costs as much memory as
//! the block's size, so a block larger than the store's cache was decoded
//! whole by every cold query (724 MiB at 2,000 pods under a 512 MiB
//! budget), and compaction had to keep blocks small for it. Read by range,
//! a block costs its tables and directory, whatever its data.
//!
//! Each blob of a block of format 2 on carries its own CRC, checked as a
//! query reads it, so opening such a block reads only its tables,
//! directory and index: a query for one pod then reads that pod's blobs and
//! no others. A format 1 block's data section has only the section's CRC,
//! so it is read once through the window as the block is opened, and
//! queries then read the bytes that were checked (blocks are immutable).

use std::borrow::Cow;
use std::sync::Mutex;

use bytes::Bytes;

use super::format::{BlobCheck, SectionKind, read_blob};
use super::source::{SourceHeader, read_into};
use super::{BlobRef, Block, decode_postings, decode_series};
use crate::error::BlockError;

/// Heap bytes a block opened by range holds, at most, per decompressed
/// byte of its table sections (symbols, series directory, postings):
/// decoded symbol tables measured 2.71-2.74x their sections; a small
/// block of real Go profiles (17 KB of tables) held 5.8-6.2x, most of it
/// fixed costs (`tests/ranged_blocks.rs`), which `HOLD_FIXED` covers.
const HOLD_PER_TABLE_BYTE: u64 = 6;

/// What any block opened by range holds whatever its tables: its own
/// struct, the tables' and index's empty structures.
const HOLD_FIXED: u64 = 64 << 10;

/// The sections a block opened by range holds decoded.
pub(crate) const TABLE_SECTIONS: [SectionKind; 8] = [
    SectionKind::Strings,
    SectionKind::Mappings,
    SectionKind::Functions,
    SectionKind::Locations,
    SectionKind::Stacks,
    SectionKind::LabelSets,
    SectionKind::Series,
    SectionKind::Postings,
];

/// What a block whose table sections decompress to `table_bytes` holds
/// once opened by range, at most, besides its read window.
pub(crate) fn projected_hold(table_bytes: u64) -> u64 {
    table_bytes
        .saturating_mul(HOLD_PER_TABLE_BYTE)
        .saturating_add(HOLD_FIXED)
}

/// [`Block::open_ranged`]'s heap, besides its window, projected from a
/// block's section sizes ([`super::format::section_sizes`]) before it is
/// read: what a store's block cache is charged for a large block.
pub fn projected_ranged_hold(sections: &[super::format::SectionSize]) -> u64 {
    let tables = sections
        .iter()
        .filter(|s| TABLE_SECTIONS.iter().any(|k| k.name() == s.kind))
        .map(|s| s.raw)
        .fold(0, u64::saturating_add);
    projected_hold(tables)
}

/// The least a ranged block reads at a time.
const MIN_WINDOW: usize = 4096;

/// Where a decoded block's data section is.
pub(crate) enum BlockData {
    /// In memory, as [`Block::decode`] leaves it: `data` keeps alive a
    /// buffer of `held` bytes (the whole fetched block, for
    /// [`Block::decode_shared`]).
    Loaded {
        data: Bytes,
        held: usize,
        check: BlobCheck,
    },
    /// In the stored block, read by range.
    Ranged(Mutex<RangedData>),
}

impl std::fmt::Debug for BlockData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Loaded { data, .. } => write!(f, "Loaded({} bytes)", data.len()),
            Self::Ranged(_) => f.write_str("Ranged"),
        }
    }
}

/// Random access to a stored block that a cached block can keep: shared
/// between the threads queries run on.
pub trait SharedBlockRanges: super::BlockRanges + Send + 'static {}
impl<R: super::BlockRanges + Send + 'static> SharedBlockRanges for R {}

/// A data section read by range through one window.
pub(crate) struct RangedData {
    ranges: Box<dyn SharedBlockRanges>,
    section_at: u64,
    section_len: u64,
    /// Bytes `[buf_at, buf_at + buf.len())` of the section.
    buf: Vec<u8>,
    buf_at: u64,
    window: usize,
    check: BlobCheck,
}

impl RangedData {
    /// The decompressed bytes of `blob`.
    fn blob(&mut self, blob: BlobRef) -> Result<Vec<u8>, BlockError> {
        let start = blob.offset as u64;
        let end = start.saturating_add(blob.len as u64);
        if end > self.section_len {
            return Err(BlockError::Truncated { what: "data blob" });
        }
        let held = self.buf_at..self.buf_at + self.buf.len() as u64;
        if start < held.start || end > held.end {
            // Queries walk series in the order a block lays them out, so
            // the window read here serves the blobs that follow too.
            let len = (self.section_len - start).min(self.window.max(blob.len) as u64);
            self.buf.clear();
            self.buf_at = start;
            let len = usize::try_from(len).map_err(|_| BlockError::Truncated { what: "data" })?;
            if let Err(error) = read_into(
                self.ranges.as_mut(),
                self.section_at + start,
                len,
                &mut self.buf,
            ) {
                self.buf.clear();
                return Err(error);
            }
        }
        let from = (start - self.buf_at) as usize;
        Ok(read_blob(&self.buf[from..from + blob.len], self.check)?.into_owned())
    }
}

impl BlockData {
    /// A data section held in memory, in a buffer of its own, whose blobs
    /// are checked as `check` says.
    pub(crate) fn loaded(data: Vec<u8>, check: BlobCheck) -> Self {
        let held = data.capacity();
        Self::Loaded {
            data: Bytes::from(data),
            held,
            check,
        }
    }

    pub(crate) fn blob(&self, blob: BlobRef) -> Result<Cow<'_, [u8]>, BlockError> {
        match self {
            Self::Loaded { data, check, .. } => {
                let bytes = data
                    .get(blob.offset..blob.offset.saturating_add(blob.len))
                    .ok_or(BlockError::Truncated { what: "data blob" })?;
                read_blob(bytes, *check)
            }
            Self::Ranged(ranged) => {
                // A query that panicked mid-read left at worst a window
                // that no longer matches `buf_at`; start over.
                let mut ranged = ranged.lock().unwrap_or_else(|poisoned| {
                    let mut ranged = poisoned.into_inner();
                    ranged.buf.clear();
                    ranged
                });
                ranged.blob(blob).map(Cow::Owned)
            }
        }
    }

    /// The section, when it is held.
    #[cfg(test)]
    pub(crate) fn loaded_bytes(&self) -> Option<&[u8]> {
        match self {
            Self::Loaded { data, .. } => Some(data),
            Self::Ranged(_) => None,
        }
    }

    /// Heap bytes held: the whole section, or the window.
    pub(crate) fn held_bytes(&self) -> usize {
        match self {
            Self::Loaded { held, .. } => *held,
            Self::Ranged(ranged) => ranged.lock().map_or(0, |r| r.buf.capacity().max(r.window)),
        }
    }
}

impl Block {
    /// Opens a stored block through `ranges` for queries: everything
    /// [`Block::decode`] decodes is read and checked, the data section's CRC
    /// included, but only its tables, series directory and index are held;
    /// the blobs queries ask for are read by range when asked, at least
    /// `window` bytes at a time (the check at open of a format 1 block's
    /// data section reads that much at a time too). Answers are those of the decoded block. A block whose data
    /// section is stored compressed as a whole (no writer does so today) is
    /// read whole.
    pub fn open_ranged(
        mut ranges: impl SharedBlockRanges,
        window: usize,
    ) -> Result<Block, BlockError> {
        let window = window.max(MIN_WINDOW);
        let header = SourceHeader::read(&mut ranges)?;
        let symbols = header.decode_symbols(&mut ranges)?;
        let directory = header.section(&mut ranges, SectionKind::Series)?;
        let postings = header.section(&mut ranges, SectionKind::Postings)?;
        let entry = header.entry(SectionKind::Data)?;
        let check = header.blob_check;
        let (data, data_len) = if entry.is_raw() {
            if check == BlobCheck::BySection {
                check_data_crc(&mut ranges, entry.offset, entry.len, entry.crc, window)?;
            }
            let len =
                usize::try_from(entry.len).map_err(|_| BlockError::Truncated { what: "data" })?;
            let ranged = RangedData {
                ranges: Box::new(ranges),
                section_at: entry.offset,
                section_len: entry.len,
                buf: Vec::new(),
                buf_at: 0,
                window,
                check,
            };
            (BlockData::Ranged(Mutex::new(ranged)), len)
        } else {
            let bytes = header.section(&mut ranges, SectionKind::Data)?;
            let len = bytes.len();
            (BlockData::loaded(bytes, check), len)
        };
        let series = decode_series(&directory, &symbols, data_len)?;
        let index = decode_postings(&postings, &symbols, series.len())?;
        Ok(Block {
            meta: header.meta,
            symbols,
            index,
            series,
            data,
        })
    }
}

/// Reads the data section through the window and checks its CRC.
fn check_data_crc(
    ranges: &mut impl super::BlockRanges,
    at: u64,
    len: u64,
    expected: u32,
    window: usize,
) -> Result<(), BlockError> {
    let mut crc = crc32fast::Hasher::new();
    let mut piece = Vec::with_capacity(window);
    let mut read = 0u64;
    while read < len {
        let n = (len - read).min(window as u64) as usize;
        piece.clear();
        read_into(ranges, at + read, n, &mut piece)?;
        crc.update(&piece);
        read += n as u64;
    }
    if crc.finalize() != expected {
        return Err(BlockError::ChecksumMismatch { section: "data" });
    }
    Ok(())
}
