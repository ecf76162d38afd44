//! The block container: magic, format version, a checksummed section table,
//! and sections each with its own CRC32 and optional zstd compression.
//!
//! ```text
//! magic "KILNBLK\x01" | version u32 | section count u32
//! count x (kind u32 | compression u8 | offset u64 | stored len u64 | raw len u64 | crc32 u32)
//! header crc32 u32 | section bytes...
//! ```
//! All integers little-endian. Offsets are from the start of the block;
//! sections may lie in any order (blocks written by `BlockWriter` put the
//! data section first, right after the header, so it is never copied).
//!
//! The data section is a sequence of blobs, `codec byte [raw len] payload`,
//! each one series' column chunk, totals or rollup chunk. From format
//! version 2 on, every blob also ends with the CRC32 of its other bytes, so
//! a query that reads one pod's blobs of a block by range checks what it
//! read without reading (and checking) the whole data section. Version 1
//! blocks, whose blobs have only the section's CRC, are still read.

use std::borrow::Cow;
use std::io::Read;

use crate::error::BlockError;
use crate::wire::{Reader, Writer};

pub(crate) const MAGIC: &[u8; 8] = b"KILNBLK\x01";
/// The block format this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest block format this build reads.
const OLDEST_FORMAT_VERSION: u32 = 1;
/// The first format whose blobs carry their own CRC: a block of it opened
/// by range reads no data at open.
pub const BLOB_CRC_VERSION: u32 = 2;
/// Bytes of a blob's trailing CRC.
const BLOB_CRC_BYTES: usize = 4;
const ENTRY_BYTES: usize = 4 + 1 + 8 + 8 + 8 + 4;
const MAX_SECTIONS: u32 = 64;
const COMPRESSION_NONE: u8 = 0;
const COMPRESSION_ZSTD: u8 = 1;
/// A decompressed section or blob may not exceed this (8 GiB).
const MAX_RAW_LEN: u64 = 8 << 30;

/// How hard a block's sections and blobs are compressed. Readers need not
/// know: the format records only that a section or blob is zstd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BlockCompression {
    /// zstd level 3, for blocks that compaction rewrites: flushed heads,
    /// hour blocks, merges of the day in progress.
    #[default]
    Working,
    /// A higher zstd level for a complete day's merge, which stays as it
    /// is until retention deletes it: written once, stored and read for
    /// days (docs/benchmarks/log/2026-11-27-store-zstd-levels.md has the
    /// levels measured).
    Archive,
}

impl BlockCompression {
    fn zstd_level(self) -> i32 {
        match self {
            Self::Working => 3,
            Self::Archive => 6,
        }
    }
}

/// The sections of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SectionKind {
    Meta = 1,
    Strings = 2,
    Mappings = 3,
    Functions = 4,
    Locations = 5,
    Stacks = 6,
    LabelSets = 7,
    Series = 8,
    Postings = 9,
    Data = 10,
}

impl SectionKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Meta => "meta",
            Self::Strings => "strings",
            Self::Mappings => "mappings",
            Self::Functions => "functions",
            Self::Locations => "locations",
            Self::Stacks => "stacks",
            Self::LabelSets => "label_sets",
            Self::Series => "series",
            Self::Postings => "postings",
            Self::Data => "data",
        }
    }

    fn from_u32(kind: u32) -> Option<Self> {
        Some(match kind {
            1 => Self::Meta,
            2 => Self::Strings,
            3 => Self::Mappings,
            4 => Self::Functions,
            5 => Self::Locations,
            6 => Self::Stacks,
            7 => Self::LabelSets,
            8 => Self::Series,
            9 => Self::Postings,
            10 => Self::Data,
            _ => return None,
        })
    }
}

/// Collects sections and lays them out.
#[derive(Debug, Default)]
pub(crate) struct ContainerWriter {
    sections: Vec<(SectionKind, u8, Vec<u8>, u64)>,
    compression: BlockCompression,
}

impl ContainerWriter {
    /// A writer compressing sections as `compression` says.
    pub(crate) fn new(compression: BlockCompression) -> Self {
        Self {
            sections: Vec::new(),
            compression,
        }
    }

    /// Adds a section, zstd-compressed when `compress` and it helps.
    pub(crate) fn add(
        &mut self,
        kind: SectionKind,
        raw: Vec<u8>,
        compress: bool,
    ) -> Result<(), BlockError> {
        let raw_len = raw.len() as u64;
        if compress && raw.len() > 64 {
            let packed =
                zstd::bulk::compress(&raw, self.compression.zstd_level()).map_err(|source| {
                    BlockError::Compress {
                        what: kind.name(),
                        source,
                    }
                })?;
            if packed.len() < raw.len() {
                self.sections
                    .push((kind, COMPRESSION_ZSTD, packed, raw_len));
                return Ok(());
            }
        }
        self.sections.push((kind, COMPRESSION_NONE, raw, raw_len));
        Ok(())
    }

    /// Lays the container out around `leading`, a large uncompressed
    /// section of kind `kind` that the caller built after `reserved` bytes
    /// (which must be [`header_len`]`(sections + 1)`): the header is written
    /// into that prefix and the other sections are appended, so the big
    /// section is never copied (compaction's output would otherwise be held
    /// twice while it is assembled). Readers find sections by offset, so
    /// the order does not change the format.
    pub(crate) fn finish_around(
        self,
        kind: SectionKind,
        mut leading: Vec<u8>,
        reserved: usize,
    ) -> Result<Vec<u8>, BlockError> {
        let header_len = header_len(self.sections.len() + 1);
        // The writer reserved the space for a fixed section count; a
        // different count is an encoder bug, refused rather than laid out wrong.
        let section = leading
            .get(header_len..)
            .filter(|_| reserved == header_len)
            .ok_or(BlockError::Corrupt {
                what: "encoder reserved header space of the wrong size",
            })?;
        let first = (kind, section.len() as u64, crc32fast::hash(section));
        let header = self.header(header_len as u64, first);
        leading[..header_len].copy_from_slice(header.as_slice());
        leading.reserve_exact(self.stored_len());
        for (_, _, stored, _) in &self.sections {
            leading.extend_from_slice(stored);
        }
        Ok(leading)
    }

    /// Writes the collected sections to `out` for a block whose leading
    /// section (`kind`: `len` bytes with CRC `crc`, uncompressed) was
    /// already written there after `reserved` bytes, which must be
    /// [`header_len`]`(sections + 1)`. Returns the header, which the
    /// caller writes into the reserved space, and the bytes appended.
    pub(crate) fn finish_streamed(
        self,
        first: (SectionKind, u64, u32),
        reserved: usize,
        out: &mut dyn std::io::Write,
    ) -> Result<(Writer, u64), BlockError> {
        let header_len = header_len(self.sections.len() + 1);
        if reserved != header_len {
            return Err(BlockError::Corrupt {
                what: "encoder reserved header space of the wrong size",
            });
        }
        let header = self.header(header_len as u64, first);
        for (kind, _, stored, _) in &self.sections {
            out.write_all(stored).map_err(|source| BlockError::Io {
                what: kind.name(),
                source,
            })?;
        }
        Ok((header, self.stored_len() as u64))
    }

    fn stored_len(&self) -> usize {
        self.sections
            .iter()
            .map(|(_, _, stored, _)| stored.len())
            .sum()
    }

    /// The header listing `first` (kind, length, CRC; stored uncompressed)
    /// and then the collected sections, laid out from `header_len` on.
    fn header(&self, header_len: u64, first: (SectionKind, u64, u32)) -> Writer {
        let mut header = Writer::new();
        header.raw(MAGIC);
        header.u32_le(FORMAT_VERSION);
        header.u32_le((self.sections.len() + 1) as u32);
        let mut offset = header_len;
        let (kind, len, crc) = first;
        let first = (kind, COMPRESSION_NONE, len, crc, len);
        let rest = self
            .sections
            .iter()
            .map(|(kind, compression, stored, raw_len)| {
                (
                    *kind,
                    *compression,
                    stored.len() as u64,
                    crc32fast::hash(stored),
                    *raw_len,
                )
            });
        for (kind, compression, len, crc, raw_len) in std::iter::once(first).chain(rest) {
            header.u32_le(kind as u32);
            header.byte(compression);
            header.u64_le(offset);
            header.u64_le(len);
            header.u64_le(raw_len);
            header.u32_le(crc);
            offset += len;
        }
        let crc = crc32fast::hash(header.as_slice());
        header.u32_le(crc);
        header
    }
}

/// Bytes of a container header listing `sections` sections.
pub(crate) const fn header_len(sections: usize) -> usize {
    MAGIC.len() + 8 + sections * ENTRY_BYTES + 4
}

/// Bytes before the section table: magic, version and section count.
pub(crate) const PREAMBLE_LEN: usize = MAGIC.len() + 8;

/// One entry of a block's section table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SectionEntry {
    pub(crate) kind: SectionKind,
    pub(crate) compression: u8,
    /// From the start of the block.
    pub(crate) offset: u64,
    /// Stored (possibly compressed) length.
    pub(crate) len: u64,
    pub(crate) raw_len: u64,
    pub(crate) crc: u32,
}

impl SectionEntry {
    /// Whether the section is stored uncompressed, so its bytes can be
    /// read by range as they are.
    pub(crate) fn is_raw(&self) -> bool {
        self.compression == COMPRESSION_NONE
    }

    /// Checks `stored` (the section's bytes) against the entry's CRC.
    pub(crate) fn verify(&self, stored: &[u8]) -> Result<(), BlockError> {
        if crc32fast::hash(stored) != self.crc {
            return Err(BlockError::ChecksumMismatch {
                section: self.kind.name(),
            });
        }
        Ok(())
    }

    /// The section's decompressed bytes from its verified stored bytes.
    pub(crate) fn inflate(&self, stored: Vec<u8>) -> Result<Vec<u8>, BlockError> {
        self.verify(&stored)?;
        if self.is_raw() {
            return Ok(stored);
        }
        decompress(&stored, self.raw_len, self.kind.name())
    }
}

/// How a block's data blobs are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlobCheck {
    /// Format 1: only by the data section's CRC, so a reader must read the
    /// whole section to trust any blob of it.
    BySection,
    /// Format 2 on: each blob ends with its own CRC.
    ByBlob,
}

impl BlobCheck {
    fn of_version(version: u32) -> Self {
        if version >= BLOB_CRC_VERSION {
            Self::ByBlob
        } else {
            Self::BySection
        }
    }
}

/// What a block's preamble says: how many sections its table lists and
/// how its blobs are checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Preamble {
    pub(crate) sections: u32,
    pub(crate) blob_check: BlobCheck,
}

/// Checks the magic and version at the start of a block and returns its
/// section count and blob check; `bytes` needs only the first
/// [`PREAMBLE_LEN`] bytes.
pub(crate) fn parse_preamble(bytes: &[u8]) -> Result<Preamble, BlockError> {
    let mut reader = Reader::new(bytes);
    let magic = reader.take(MAGIC.len()).map_err(|_| BlockError::BadMagic)?;
    if magic != MAGIC {
        return Err(BlockError::BadMagic);
    }
    let truncated = |_| BlockError::Truncated { what: "header" };
    let version = reader.u32_le().map_err(truncated)?;
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(BlockError::UnsupportedVersion {
            version,
            oldest: OLDEST_FORMAT_VERSION,
            newest: FORMAT_VERSION,
        });
    }
    let count = reader.u32_le().map_err(truncated)?;
    if count > MAX_SECTIONS {
        return Err(BlockError::Corrupt {
            what: "too many sections",
        });
    }
    Ok(Preamble {
        sections: count,
        blob_check: BlobCheck::of_version(version),
    })
}

/// One section's size, as a block's header records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionSize {
    /// The section's name (`strings`, `stacks`, `data`, ...).
    pub kind: &'static str,
    /// Where the section starts, from the start of the block.
    pub offset: u64,
    /// Bytes stored, compressed or not.
    pub stored: u64,
    /// Bytes once decompressed.
    pub raw: u64,
}

/// The sizes of a stored block's sections, read from its header alone
/// (`header` needs only the preamble and the section table), in the order
/// the table lists them. For benchmarks and diagnostics: which part of a
/// block its bytes go to.
pub fn section_sizes(header: &[u8]) -> Result<Vec<SectionSize>, BlockError> {
    let count = parse_preamble(header)?.sections;
    Ok(parse_section_table(header, count)?
        .into_iter()
        .map(|entry| SectionSize {
            kind: entry.kind.name(),
            offset: entry.offset,
            stored: entry.len,
            raw: entry.raw_len,
        })
        .collect())
}

/// Parses the checksummed section table of a header of `count` sections;
/// `bytes` needs only the first [`header_len`]`(count)` bytes. Sections of
/// kinds this build does not know (a compatible writer's) are skipped.
pub(crate) fn parse_section_table(
    bytes: &[u8],
    count: u32,
) -> Result<Vec<SectionEntry>, BlockError> {
    let truncated = |_| BlockError::Truncated {
        what: "section table",
    };
    let entries_len = count as usize * ENTRY_BYTES;
    let header_len = PREAMBLE_LEN + entries_len;
    let mut reader = Reader::new(bytes.get(PREAMBLE_LEN..).unwrap_or_default());
    let mut entries = Reader::new(reader.take(entries_len).map_err(truncated)?);
    let stored_crc = reader.u32_le().map_err(truncated)?;
    if crc32fast::hash(&bytes[..header_len]) != stored_crc {
        return Err(BlockError::ChecksumMismatch {
            section: "section table",
        });
    }
    let mut sections = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let corrupt = |_| BlockError::Corrupt {
            what: "section table",
        };
        let kind = entries.u32_le().map_err(corrupt)?;
        let compression = entries.byte().map_err(corrupt)?;
        let offset = entries.u64_le().map_err(corrupt)?;
        let len = entries.u64_le().map_err(corrupt)?;
        let raw_len = entries.u64_le().map_err(corrupt)?;
        let crc = entries.u32_le().map_err(corrupt)?;
        let Some(kind) = SectionKind::from_u32(kind) else {
            // Unknown sections from a compatible writer are skipped.
            continue;
        };
        if compression != COMPRESSION_NONE && compression != COMPRESSION_ZSTD {
            return Err(BlockError::Corrupt {
                what: "unknown section compression",
            });
        }
        sections.push(SectionEntry {
            kind,
            compression,
            offset,
            len,
            raw_len,
            crc,
        });
    }
    Ok(sections)
}

/// A parsed, checksum-verified container.
#[derive(Debug)]
pub(crate) struct Container<'a> {
    sections: Vec<(SectionKind, u8, &'a [u8], u64)>,
    /// How the data section's blobs are checked.
    pub(crate) blob_check: BlobCheck,
}

impl<'a> Container<'a> {
    /// Parses the header and verifies every checksum.
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self, BlockError> {
        let preamble = parse_preamble(bytes)?;
        let entries = parse_section_table(bytes, preamble.sections)?;
        let mut sections = Vec::with_capacity(entries.len());
        for entry in entries {
            let kind = entry.kind;
            let start = usize::try_from(entry.offset)
                .map_err(|_| BlockError::Truncated { what: kind.name() })?;
            let end = usize::try_from(entry.offset.saturating_add(entry.len))
                .map_err(|_| BlockError::Truncated { what: kind.name() })?;
            let stored = bytes
                .get(start..end)
                .ok_or(BlockError::Truncated { what: kind.name() })?;
            entry.verify(stored)?;
            sections.push((kind, entry.compression, stored, entry.raw_len));
        }
        Ok(Self {
            sections,
            blob_check: preamble.blob_check,
        })
    }

    /// The (decompressed) bytes of section `kind`.
    pub(crate) fn section(&self, kind: SectionKind) -> Result<Cow<'a, [u8]>, BlockError> {
        let &(_, compression, stored, raw_len) = self
            .sections
            .iter()
            .find(|(k, ..)| *k == kind)
            .ok_or(BlockError::MissingSection {
                section: kind.name(),
            })?;
        if compression == COMPRESSION_NONE {
            return Ok(Cow::Borrowed(stored));
        }
        decompress(stored, raw_len, kind.name()).map(Cow::Owned)
    }
}

/// Decompresses zstd `stored` that must inflate to exactly `raw_len` bytes.
pub(crate) fn decompress(
    stored: &[u8],
    raw_len: u64,
    what: &'static str,
) -> Result<Vec<u8>, BlockError> {
    if raw_len > MAX_RAW_LEN {
        return Err(BlockError::Corrupt {
            what: "announced size too large",
        });
    }
    // Grow as data arrives instead of trusting `raw_len` for the allocation.
    let mut out = Vec::with_capacity((raw_len as usize).min(stored.len().saturating_mul(8)));
    with_decompression_context(|context| match context {
        Some(context) => zstd::stream::read::Decoder::with_context(stored, context)
            .take(raw_len + 1)
            .read_to_end(&mut out),
        None => zstd::stream::read::Decoder::with_buffer(stored)?
            .take(raw_len + 1)
            .read_to_end(&mut out),
    })
    .map_err(|source| BlockError::Decompress { what, source })?;
    if out.len() as u64 != raw_len {
        return Err(BlockError::Corrupt {
            what: "decompressed size differs from the announced one",
        });
    }
    Ok(out)
}

thread_local! {
    /// This thread's zstd decompression context, reused from blob to blob:
    /// creating one per blob was 5.6 % of a merge's CPU (issue 13).
    static DECOMPRESSION_CONTEXT: std::cell::RefCell<Option<zstd::zstd_safe::DCtx<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's decompression context, or with `None`
/// (decompress with a context of its own) when none can be had: the
/// allocation failed, or a caller up the stack holds it.
fn with_decompression_context<T>(
    f: impl FnOnce(Option<&mut zstd::zstd_safe::DCtx<'static>>) -> T,
) -> T {
    DECOMPRESSION_CONTEXT.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            if slot.is_none() {
                *slot = zstd::zstd_safe::DCtx::try_create();
            }
            f(slot.as_mut())
        }
        Err(_) => f(None),
    })
}

/// A reusable zstd context: creating one per blob costs more than compressing small blobs.
pub(crate) struct BlobCompressor(zstd::bulk::Compressor<'static>);

impl std::fmt::Debug for BlobCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BlobCompressor")
    }
}

impl BlobCompressor {
    pub(crate) fn new(compression: BlockCompression) -> Result<Self, BlockError> {
        zstd::bulk::Compressor::new(compression.zstd_level())
            .map(Self)
            .map_err(|source| BlockError::Compress {
                what: "zstd context",
                source,
            })
    }
}

/// Compresses a blob inside the data section: `codec byte [raw len]
/// payload crc32`, the CRC of the bytes before it ([`FORMAT_VERSION`]'s
/// layout).
pub(crate) fn write_blob(
    raw: &[u8],
    compressor: &mut BlobCompressor,
    out: &mut Vec<u8>,
) -> Result<(), BlockError> {
    let start = out.len();
    write_blob_body(raw, compressor, out)?;
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// A blob without its CRC, as format 1 laid it out.
fn write_blob_body(
    raw: &[u8],
    compressor: &mut BlobCompressor,
    out: &mut Vec<u8>,
) -> Result<(), BlockError> {
    if raw.len() > 128 {
        let packed = compressor
            .0
            .compress(raw)
            .map_err(|source| BlockError::Compress {
                what: "data blob",
                source,
            })?;
        if packed.len() + 8 < raw.len() {
            let mut w = Writer::new();
            w.byte(COMPRESSION_ZSTD);
            w.varint(raw.len() as u64);
            out.extend_from_slice(w.as_slice());
            out.extend_from_slice(&packed);
            return Ok(());
        }
    }
    out.push(COMPRESSION_NONE);
    out.extend_from_slice(raw);
    Ok(())
}

/// Reads a blob written by [`write_blob`] (or, for [`BlobCheck::BySection`],
/// by a format 1 writer), checking its CRC where it has one.
pub(crate) fn read_blob(blob: &[u8], check: BlobCheck) -> Result<Cow<'_, [u8]>, BlockError> {
    let blob = match check {
        BlobCheck::BySection => blob,
        BlobCheck::ByBlob => {
            let body_len = blob
                .len()
                .checked_sub(BLOB_CRC_BYTES)
                .ok_or(BlockError::Truncated { what: "data blob" })?;
            let (body, crc) = blob.split_at(body_len);
            let mut stored = [0u8; BLOB_CRC_BYTES];
            stored.copy_from_slice(crc);
            if crc32fast::hash(body) != u32::from_le_bytes(stored) {
                return Err(BlockError::ChecksumMismatch {
                    section: "data blob",
                });
            }
            body
        }
    };
    let mut reader = Reader::new(blob);
    let codec = reader
        .byte()
        .map_err(|_| BlockError::Truncated { what: "data blob" })?;
    match codec {
        COMPRESSION_NONE => Ok(Cow::Borrowed(&blob[1..])),
        COMPRESSION_ZSTD => {
            let raw_len = reader
                .varint()
                .map_err(|_| BlockError::Truncated { what: "data blob" })?;
            let packed = reader
                .take(reader.remaining())
                .map_err(|_| BlockError::Truncated { what: "data blob" })?;
            decompress(packed, raw_len, "data blob").map(Cow::Owned)
        }
        _ => Err(BlockError::Corrupt {
            what: "unknown blob compression",
        }),
    }
}

#[cfg(test)]
mod tests;
