//! The unwind information of one ELF object: its `.eh_frame` (or
//! `.debug_frame`) and `.eh_frame_hdr` bytes, the section addresses the CFI
//! refers to, and its loadable segments, read with hard caps so that a huge
//! or hostile file costs a bounded amount of memory and time.
//!
//! Only the ELF header, the program and section header tables, the section
//! name table and the unwind sections are read: never symbol tables or code.
//! Everything is bounds-checked by `object`; the caps below are checked
//! before any section is read.

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use object::elf::{FileHeader64, PF_X, PT_LOAD, SHF_COMPRESSED, SHT_NOBITS};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::{Endianness, ReadCache, ReadRef};

use crate::go_pclntab::{GoFunctionIndex, Pclntab, WindowedSection};

/// The smallest page size segments are mapped with on x86-64.
const PAGE_SIZE: u64 = 4096;

/// Caps on what one object may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindInfoLimits {
    /// Most bytes of unwind sections kept for one object.
    pub max_bytes_per_object: u64,
    /// Most section headers read.
    pub max_sections: usize,
    /// Most program headers read.
    pub max_segments: usize,
}

impl Default for UnwindInfoLimits {
    fn default() -> Self {
        UnwindInfoLimits {
            // Enough for CPython, Node or a large C++ service (tens of MB of
            // text have single-digit MB of CFI); ClickHouse-sized objects
            // are refused and fall back to frame pointers.
            max_bytes_per_object: 16 * 1024 * 1024,
            max_sections: 4096,
            max_segments: 256,
        }
    }
}

/// Bytes of one section, shared by every process that maps its object.
/// (`Arc<[u8]>` would copy a `Vec` once more on conversion.)
#[derive(Debug, Clone, Default)]
pub struct SectionBytes(Arc<Vec<u8>>);

impl From<Vec<u8>> for SectionBytes {
    fn from(bytes: Vec<u8>) -> Self {
        SectionBytes(Arc::new(bytes))
    }
}

impl std::ops::Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_offset`.
    pub file_offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_filesz`.
    pub file_size: u64,
    /// Whether the segment is executable.
    pub executable: bool,
}

/// The unwind sections of one object, shared by every process that maps it.
#[derive(Debug, Clone, Default)]
pub struct UnwindSections {
    /// `.text` address range (used to resolve text-relative CFI pointers).
    pub text_svma: Option<Range<u64>>,
    /// `.got` address range (data-relative CFI pointers).
    pub got_svma: Option<Range<u64>>,
    /// `.eh_frame` address range and bytes.
    pub eh_frame: Option<(Range<u64>, SectionBytes)>,
    /// `.eh_frame_hdr` address range and bytes (the binary-search table).
    pub eh_frame_hdr: Option<(Range<u64>, SectionBytes)>,
    /// `.debug_frame` bytes, read only when there is no `.eh_frame`.
    pub debug_frame: Option<SectionBytes>,
    /// Loadable segments, to place the object in an address space.
    pub segments: Vec<LoadSegment>,
    /// A Go binary's function index from `.gopclntab`, and the section's
    /// file offset and size (each function's rules are read from there when
    /// first needed); read only when it has no CFI (`-ldflags=-w` drops
    /// Go's `.debug_frame`).
    pub go_functions: Option<(GoFunctionIndex, (u64, usize))>,
}

impl UnwindSections {
    /// Bytes held (the cost counted against cache budgets).
    pub fn held_bytes(&self) -> u64 {
        let len = |bytes: Option<&SectionBytes>| bytes.map_or(0, |b| b.len() as u64);
        len(self.eh_frame.as_ref().map(|(_, b)| b))
            + len(self.eh_frame_hdr.as_ref().map(|(_, b)| b))
            + len(self.debug_frame.as_ref())
            + (self.segments.len() * size_of::<LoadSegment>()) as u64
            + self
                .go_functions
                .as_ref()
                .map_or(0, |(index, _)| index.held_bytes())
    }

    /// Whether the object has CFI for framehop (else only Go's rules).
    pub fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// The address at which the object's address 0 sits when the file
    /// offset `mapping_offset` is mapped at `mapping_start`; `None` when no
    /// executable segment contains that offset.
    pub fn base_avma(&self, mapping_start: u64, mapping_offset: u64) -> Option<u64> {
        // The kernel maps a segment from its offset rounded down to a page.
        let segment = self.segments.iter().find(|s| {
            s.executable
                && s.file_offset & !(PAGE_SIZE - 1) <= mapping_offset
                && mapping_offset < s.file_offset.saturating_add(s.file_size.max(1))
        })?;
        // avma = mapping_start + (offset - mapping_offset) and
        // svma = offset - p_offset + p_vaddr, so avma - svma is constant:
        Some(
            mapping_start
                .wrapping_sub(mapping_offset)
                .wrapping_add(segment.file_offset)
                .wrapping_sub(segment.vaddr),
        )
    }
}

/// Why an object's unwind information was not used. Every case falls back
/// to frame pointers for that object.
#[derive(Debug, thiserror::Error)]
pub enum UnwindInfoError {
    /// Not a 64-bit little-endian ELF file.
    #[error("not a 64-bit little-endian ELF object")]
    NotElf,
    /// The ELF structure is inconsistent.
    #[error("malformed ELF: {what}")]
    Malformed {
        /// What was wrong.
        what: &'static str,
    },
    /// More headers than the caps allow.
    #[error("{what} count {count} is over the cap of {cap}")]
    TooManyHeaders {
        /// Which table.
        what: &'static str,
        /// Entries in the file.
        count: usize,
        /// The cap.
        cap: usize,
    },
    /// The unwind sections are bigger than the per-object cap.
    #[error("unwind sections hold {bytes} bytes, over the per-object cap of {cap}")]
    TooLarge {
        /// Bytes the sections would take.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// The object has neither `.eh_frame` nor `.debug_frame`, nor a Go
    /// function table with usable stack-pointer rules.
    #[error("no .eh_frame, .debug_frame or usable .gopclntab section")]
    NoUnwindInfo,
}

impl UnwindInfoError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            UnwindInfoError::NotElf => "not_elf",
            UnwindInfoError::Malformed { .. } => "malformed",
            UnwindInfoError::TooManyHeaders { .. } => "too_many_headers",
            UnwindInfoError::TooLarge { .. } => "too_large",
            UnwindInfoError::NoUnwindInfo => "no_unwind_info",
        }
    }
}

/// Reads the unwind sections of an open file, reading only the parts needed:
/// headers through `object`, section bytes straight into their final buffer
/// (one copy, so a large `.eh_frame` does not cost twice its size).
pub fn read_from_file(
    file: &File,
    limits: &UnwindInfoLimits,
) -> Result<UnwindSections, UnwindInfoError> {
    use std::os::unix::fs::FileExt;
    let cache = ReadCache::new(file);
    read_sections_with(&cache, limits, |offset, size| {
        let mut bytes = vec![0; usize::try_from(size).ok()?];
        file.read_exact_at(&mut bytes, offset).ok()?;
        Some(bytes)
    })
}

/// Reads the unwind sections of an ELF object held in memory.
pub fn read_unwind_sections(
    data: &[u8],
    limits: &UnwindInfoLimits,
) -> Result<UnwindSections, UnwindInfoError> {
    read_sections_with(data, limits, |offset, size| {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(size).ok()?)?;
        data.get(start..end).map(<[u8]>::to_vec)
    })
}

/// Parses headers from `data` and reads each unwind section with
/// `fetch(file offset, size)`, which returns `None` past the end.
fn read_sections_with<'data, R: ReadRef<'data>>(
    data: R,
    limits: &UnwindInfoLimits,
    fetch: impl Fn(u64, u64) -> Option<Vec<u8>>,
) -> Result<UnwindSections, UnwindInfoError> {
    let header = FileHeader64::<Endianness>::parse(data).map_err(|_| UnwindInfoError::NotElf)?;
    let endian = header
        .endian()
        .map_err(|_| UnwindInfoError::Malformed { what: "endianness" })?;
    if endian != Endianness::Little {
        return Err(UnwindInfoError::NotElf);
    }
    check_header_counts(header, endian, data, limits)?;

    let segments = header
        .program_headers(endian, data)
        .map_err(|_| UnwindInfoError::Malformed {
            what: "program headers",
        })?
        .iter()
        .filter(|p| p.p_type(endian) == PT_LOAD)
        .map(|p| LoadSegment {
            file_offset: p.p_offset(endian),
            vaddr: p.p_vaddr(endian),
            file_size: p.p_filesz(endian),
            executable: p.p_flags(endian) & PF_X != 0,
        })
        .collect::<Vec<_>>();
    let sections = header
        .sections(endian, data)
        .map_err(|_| UnwindInfoError::Malformed {
            what: "section headers",
        })?;
    let find = |name: &[u8]| {
        sections
            .section_by_name(endian, name)
            .map(|(_, section)| section)
            .filter(|section| section.sh_type(endian) != SHT_NOBITS)
    };
    let range = |section: &<FileHeader64<Endianness> as FileHeader>::SectionHeader| {
        let start = section.sh_addr(endian);
        start..start.saturating_add(section.sh_size(endian))
    };

    let eh_frame = find(b".eh_frame").filter(|s| s.sh_size(endian) > 0);
    let eh_frame_hdr = find(b".eh_frame_hdr").filter(|s| s.sh_size(endian) > 0);
    // .debug_frame only matters where there is no .eh_frame.
    let debug_frame = match eh_frame {
        Some(_) => None,
        None => find(b".debug_frame").filter(|s| s.sh_size(endian) > 0),
    };
    let text_svma = find(b".text").map(range);
    if eh_frame.is_none() && debug_frame.is_none() {
        let go_functions = find(b".gopclntab")
            .filter(|s| s.sh_size(endian) > 0)
            .ok_or(UnwindInfoError::NoUnwindInfo)
            .and_then(|section| {
                // Only the function table is read, a window at a time (see
                // go_pclntab): a large table costs reads, not memory.
                let size = usize::try_from(section.sh_size(endian)).map_err(|_| {
                    UnwindInfoError::Malformed {
                        what: ".gopclntab size",
                    }
                })?;
                let mut source = WindowedSection::new(
                    |at, buffer: &mut [u8]| {
                        fetch(at, buffer.len() as u64)
                            .filter(|bytes| bytes.len() == buffer.len())
                            .map(|bytes| buffer.copy_from_slice(&bytes))
                            .is_some()
                    },
                    section.sh_offset(endian),
                    size,
                );
                let text = text_svma.as_ref().map_or(0, |t| t.start);
                let pclntab =
                    Pclntab::parse(&mut source, text).map_err(|_| UnwindInfoError::Malformed {
                        what: ".gopclntab header",
                    })?;
                let base = segments.iter().map(|s| s.vaddr).min().unwrap_or(0);
                GoFunctionIndex::build(&pclntab, &mut source, base)
                    .map(|index| (index, (section.sh_offset(endian), size)))
                    .ok_or(UnwindInfoError::NoUnwindInfo)
            })?;
        return Ok(UnwindSections {
            text_svma,
            segments,
            go_functions: Some(go_functions),
            ..UnwindSections::default()
        });
    }
    let bytes: u64 = [eh_frame, eh_frame_hdr, debug_frame]
        .iter()
        .flatten()
        .map(|s| s.sh_size(endian))
        .fold(0u64, u64::saturating_add);
    if bytes > limits.max_bytes_per_object {
        return Err(UnwindInfoError::TooLarge {
            bytes,
            cap: limits.max_bytes_per_object,
        });
    }
    let read = |section: &<FileHeader64<Endianness> as FileHeader>::SectionHeader,
                what: &'static str|
     -> Result<SectionBytes, UnwindInfoError> {
        fetch(section.sh_offset(endian), section.sh_size(endian))
            .map(SectionBytes::from)
            .ok_or(UnwindInfoError::Malformed { what })
    };
    let eh_frame = eh_frame
        .map(|s| Ok::<_, UnwindInfoError>((range(s), read(s, ".eh_frame data")?)))
        .transpose()?;
    let eh_frame_hdr = eh_frame_hdr
        .map(|s| Ok::<_, UnwindInfoError>((range(s), read(s, ".eh_frame_hdr data")?)))
        .transpose()?
        // A search table that points outside .eh_frame is dropped; the
        // unwinder then indexes .eh_frame itself.
        .filter(|(hdr_range, hdr)| {
            eh_frame.as_ref().is_some_and(|(eh_range, _)| {
                search_table_is_sound(hdr, hdr_range.start, eh_range.clone())
            })
        });
    let debug_frame = match debug_frame {
        None => None,
        Some(section) if section.sh_flags(endian) & u64::from(SHF_COMPRESSED) != 0 => {
            let compressed = read(section, ".debug_frame data")?;
            Some(inflate_section(&compressed, limits.max_bytes_per_object)?)
        }
        Some(section) => Some(read(section, ".debug_frame data")?),
    };
    Ok(UnwindSections {
        text_svma,
        got_svma: find(b".got").map(range),
        eh_frame,
        eh_frame_hdr,
        debug_frame,
        segments,
        go_functions: None,
    })
}

/// The bytes of an `SHF_COMPRESSED` section: Go's linker and `ld
/// --compress-debug-sections` write `.debug_frame` so, and Go binaries
/// have no `.eh_frame`, so it is their only way past a frameless leaf.
/// zlib only (zstd is refused); the size the header declares must be
/// within `cap` before anything is inflated, and must be exactly what
/// comes out.
fn inflate_section(compressed: &[u8], cap: u64) -> Result<SectionBytes, UnwindInfoError> {
    use std::io::Read as _;
    const ELFCOMPRESS_ZLIB: u32 = 1;
    let malformed = |what| UnwindInfoError::Malformed { what };
    // Elf64_Chdr: type, reserved, size, alignment.
    let header = compressed
        .get(..24)
        .ok_or(malformed("compressed section header"))?;
    let word = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let mut size = [0u8; 8];
    size.copy_from_slice(&header[8..16]);
    let size = u64::from_le_bytes(size);
    if word(0) != ELFCOMPRESS_ZLIB {
        return Err(malformed("compressed section (not zlib)"));
    }
    if size > cap {
        return Err(UnwindInfoError::TooLarge { bytes: size, cap });
    }
    let expected = usize::try_from(size).map_err(|_| malformed("compressed section size"))?;
    let mut bytes = Vec::with_capacity(expected);
    flate2::read::ZlibDecoder::new(&compressed[24..])
        .take(size.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|_| malformed("compressed section data"))?;
    if bytes.len() != expected {
        return Err(malformed("compressed section size"));
    }
    Ok(SectionBytes::from(bytes))
}

/// Whether an `.eh_frame_hdr` at `hdr_svma` is the standard binary-search
/// table (version 1; `pcrel|sdata4` frame pointer, `udata4` count,
/// `datarel|sdata4` entries) whose entries are sorted and all point into
/// `.eh_frame`. Anything else is not handed to the unwinder, whose lookups
/// trust these offsets.
pub fn search_table_is_sound(hdr: &[u8], hdr_svma: u64, eh_frame_svma: Range<u64>) -> bool {
    const PCREL_SDATA4: u8 = 0x1b;
    const UDATA4: u8 = 0x03;
    const DATAREL_SDATA4: u8 = 0x3b;
    let i32_at = |offset: usize| -> Option<i64> {
        Some(i64::from(i32::from_le_bytes(
            hdr.get(offset..offset + 4)?.try_into().ok()?,
        )))
    };
    let relative = |value: i64| hdr_svma.checked_add_signed(value);
    if hdr.get(..4) != Some(&[1, PCREL_SDATA4, UDATA4, DATAREL_SDATA4][..]) {
        return false;
    }
    // eh_frame_ptr is relative to its own position (offset 4).
    let Some(eh_frame_ptr) = i32_at(4).and_then(|v| relative(v + 4)) else {
        return false;
    };
    let Some(count) = hdr
        .get(8..12)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
    else {
        return false;
    };
    let Ok(count) = usize::try_from(count) else {
        return false;
    };
    if eh_frame_ptr != eh_frame_svma.start
        || count.checked_mul(8).and_then(|n| n.checked_add(12)) > Some(hdr.len())
    {
        return false;
    }
    let mut previous = None;
    for entry in 0..count {
        let at = 12 + entry * 8;
        let (Some(location), Some(fde)) = (
            i32_at(at).and_then(relative),
            i32_at(at + 4).and_then(relative),
        ) else {
            return false;
        };
        if !eh_frame_svma.contains(&fde) || previous.is_some_and(|p| p > location) {
            return false;
        }
        previous = Some(location);
    }
    true
}

/// Refuses header tables over the caps before `object` reads them, and
/// extended section numbering (more than 65,535 sections), which only
/// unlinked objects use.
fn check_header_counts<'data, R: ReadRef<'data>>(
    header: &FileHeader64<Endianness>,
    endian: Endianness,
    data: R,
    limits: &UnwindInfoLimits,
) -> Result<(), UnwindInfoError> {
    let sections = usize::from(header.e_shnum.get(endian));
    if sections == 0 && header.e_shoff.get(endian) != 0 {
        return Err(UnwindInfoError::TooManyHeaders {
            what: "section header",
            count: usize::MAX,
            cap: limits.max_sections,
        });
    }
    if sections > limits.max_sections {
        return Err(UnwindInfoError::TooManyHeaders {
            what: "section header",
            count: sections,
            cap: limits.max_sections,
        });
    }
    let segments = header
        .phnum(endian, data)
        .map_err(|_| UnwindInfoError::Malformed {
            what: "program header count",
        })?;
    if segments > limits.max_segments {
        return Err(UnwindInfoError::TooManyHeaders {
            what: "program header",
            count: segments,
            cap: limits.max_segments,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
