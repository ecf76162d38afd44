//! The block container: magic, format version, a checksummed section table,
//! and sections each with its own CRC32 and optional zstd compression.
//!
//! ```text
//! magic "KILNBLK\x01" | version u32 | section count u32
//! count x (kind u32 | compression u8 | offset u64 | stored len u64 | raw len u64 | crc32 u32)
//! header crc32 u32 | section bytes...
//! ```
//! All integers little-endian. Offsets are from the start of the block.

use std::borrow::Cow;
use std::io::Read;

use crate::error::BlockError;
use crate::wire::{Reader, Writer};

pub(crate) const MAGIC: &[u8; 8] = b"KILNBLK\x01";
/// The block format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const ENTRY_BYTES: usize = 4 + 1 + 8 + 8 + 8 + 4;
const MAX_SECTIONS: u32 = 64;
const COMPRESSION_NONE: u8 = 0;
const COMPRESSION_ZSTD: u8 = 1;
const ZSTD_LEVEL: i32 = 3;
/// A decompressed section or blob may not exceed this (8 GiB).
const MAX_RAW_LEN: u64 = 8 << 30;

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
}

impl ContainerWriter {
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
                zstd::bulk::compress(&raw, ZSTD_LEVEL).map_err(|source| BlockError::Compress {
                    what: kind.name(),
                    source,
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

    pub(crate) fn finish(self) -> Vec<u8> {
        let header_len = MAGIC.len() + 8 + self.sections.len() * ENTRY_BYTES + 4;
        let mut header = Writer::new();
        header.raw(MAGIC);
        header.u32_le(FORMAT_VERSION);
        header.u32_le(self.sections.len() as u32);
        let mut offset = header_len as u64;
        for (kind, compression, stored, raw_len) in &self.sections {
            header.u32_le(*kind as u32);
            header.byte(*compression);
            header.u64_le(offset);
            header.u64_le(stored.len() as u64);
            header.u64_le(*raw_len);
            header.u32_le(crc32fast::hash(stored));
            offset += stored.len() as u64;
        }
        let crc = crc32fast::hash(header.as_slice());
        header.u32_le(crc);
        let mut out = header.into_vec();
        out.reserve(offset as usize - header_len);
        for (_, _, stored, _) in &self.sections {
            out.extend_from_slice(stored);
        }
        out
    }
}

/// A parsed, checksum-verified container.
#[derive(Debug)]
pub(crate) struct Container<'a> {
    sections: Vec<(SectionKind, u8, &'a [u8], u64)>,
}

impl<'a> Container<'a> {
    /// Parses the header and verifies every checksum.
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self, BlockError> {
        let truncated = |what| move |_| BlockError::Truncated { what };
        let mut reader = Reader::new(bytes);
        let magic = reader.take(MAGIC.len()).map_err(|_| BlockError::BadMagic)?;
        if magic != MAGIC {
            return Err(BlockError::BadMagic);
        }
        let version = reader.u32_le().map_err(truncated("header"))?;
        if version != FORMAT_VERSION {
            return Err(BlockError::UnsupportedVersion {
                version,
                supported: FORMAT_VERSION,
            });
        }
        let count = reader.u32_le().map_err(truncated("header"))?;
        if count > MAX_SECTIONS {
            return Err(BlockError::Corrupt {
                what: "too many sections",
            });
        }
        let entries_len = count as usize * ENTRY_BYTES;
        let header_len = MAGIC.len() + 8 + entries_len;
        let mut entries = Reader::new(
            reader
                .take(entries_len)
                .map_err(truncated("section table"))?,
        );
        let stored_crc = reader.u32_le().map_err(truncated("section table"))?;
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
            let start =
                usize::try_from(offset).map_err(|_| BlockError::Truncated { what: kind.name() })?;
            let end = usize::try_from(offset.saturating_add(len))
                .map_err(|_| BlockError::Truncated { what: kind.name() })?;
            let stored = bytes
                .get(start..end)
                .ok_or(BlockError::Truncated { what: kind.name() })?;
            if crc32fast::hash(stored) != crc {
                return Err(BlockError::ChecksumMismatch {
                    section: kind.name(),
                });
            }
            if compression != COMPRESSION_NONE && compression != COMPRESSION_ZSTD {
                return Err(BlockError::Corrupt {
                    what: "unknown section compression",
                });
            }
            sections.push((kind, compression, stored, raw_len));
        }
        Ok(Self { sections })
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
    let decoder = zstd::stream::read::Decoder::with_buffer(stored)
        .map_err(|source| BlockError::Decompress { what, source })?;
    // Grow as data arrives instead of trusting `raw_len` for the allocation.
    let mut out = Vec::with_capacity((raw_len as usize).min(stored.len().saturating_mul(8)));
    decoder
        .take(raw_len + 1)
        .read_to_end(&mut out)
        .map_err(|source| BlockError::Decompress { what, source })?;
    if out.len() as u64 != raw_len {
        return Err(BlockError::Corrupt {
            what: "decompressed size differs from the announced one",
        });
    }
    Ok(out)
}

/// A reusable zstd context: creating one per blob costs more than compressing small blobs.
pub(crate) struct BlobCompressor(zstd::bulk::Compressor<'static>);

impl std::fmt::Debug for BlobCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BlobCompressor")
    }
}

impl BlobCompressor {
    pub(crate) fn new() -> Result<Self, BlockError> {
        zstd::bulk::Compressor::new(ZSTD_LEVEL)
            .map(Self)
            .map_err(|source| BlockError::Compress {
                what: "zstd context",
                source,
            })
    }
}

/// Compresses a blob inside the data section: `codec byte [raw len] payload`.
pub(crate) fn write_blob(
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

/// Reads a blob written by [`write_blob`].
pub(crate) fn read_blob(blob: &[u8]) -> Result<Cow<'_, [u8]>, BlockError> {
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
