//! Reading an ELF file whole, within limits, before any lookup: its build
//! id, its loadable segments, its function symbols and its DWARF.

use std::io::Read;
use std::sync::Arc;

use gimli::{EndianArcSlice, RunTimeEndian};
use object::{
    CompressionFormat, Object, ObjectSection, ObjectSegment, ObjectSymbol, SectionKind,
    SegmentFlags, SymbolKind,
};

use crate::{BuildId, DebugInfoError};

/// The DWARF reader's view of a section: shared bytes, so a parsed file
/// holds its inflated sections itself.
pub(crate) type Reader = EndianArcSlice<RunTimeEndian>;

/// What one file may cost to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugInfoLimits {
    /// Largest file read at all.
    pub max_file_bytes: u64,
    /// Most bytes of DWARF sections, as inflated (and copied) for reading.
    pub max_section_bytes: u64,
    /// Most function symbols kept.
    pub max_symbols: usize,
    /// Deepest nesting of DWARF entries: the DWARF reader follows nested
    /// inlined calls by recursion, so nesting is what bounds its stack.
    pub max_dwarf_depth: u64,
    /// Most DWARF entries in the file.
    pub max_dwarf_entries: u64,
    /// Most frames (inlined calls) given for one address.
    pub max_frames_per_address: usize,
}

impl Default for DebugInfoLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: 1 << 30,
            max_section_bytes: 1 << 30,
            max_symbols: 4_000_000,
            max_dwarf_depth: 256,
            max_dwarf_entries: 200_000_000,
            max_frames_per_address: 64,
        }
    }
}

/// What a file holds, as far as naming frames goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A binary whose segments' file offsets are known (stripped or not).
    Binary,
    /// A file of debug info alone (`objcopy --only-keep-debug`): its
    /// segments record addresses and sizes, not file offsets.
    DebugOnly,
}

/// A loadable segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) file_offset: u64,
    pub(crate) file_size: u64,
    pub(crate) address: u64,
    pub(crate) memory_size: u64,
    pub(crate) executable: bool,
}

/// A function symbol: `[start, end)` and its (mangled) name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Symbol {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) name: Box<str>,
}

/// An ELF file read whole and checked: ready for lookups
/// ([`DebugFile::frames`]).
pub struct DebugFile {
    pub(crate) build_id: Option<BuildId>,
    pub(crate) kind: FileKind,
    pub(crate) segments: Vec<Segment>,
    pub(crate) symbols: Vec<Symbol>,
    pub(crate) dwarf: Option<addr2line::Context<Reader>>,
    pub(crate) limits: DebugInfoLimits,
}

impl std::fmt::Debug for DebugFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugFile")
            .field("build_id", &self.build_id)
            .field("kind", &self.kind)
            .field("segments", &self.segments.len())
            .field("symbols", &self.symbols.len())
            .field("dwarf", &self.dwarf.is_some())
            .finish()
    }
}

impl DebugFile {
    /// Reads `data` within `limits`: refuses anything but an ELF file,
    /// files and sections over their budgets, and DWARF nested or sized
    /// past its limits.
    pub fn parse(data: &[u8], limits: DebugInfoLimits) -> Result<Self, DebugInfoError> {
        let bytes = data.len() as u64;
        if bytes > limits.max_file_bytes {
            return Err(DebugInfoError::TooLarge {
                bytes,
                limit: limits.max_file_bytes,
            });
        }
        let file = object::File::parse(data).map_err(|e| DebugInfoError::NotElf {
            message: e.to_string(),
        })?;
        let build_id = match file.build_id() {
            Ok(Some(bytes)) => BuildId::from_bytes(bytes).ok(),
            Ok(None) | Err(_) => None,
        };
        let segments: Vec<Segment> = file
            .segments()
            .map(|segment| {
                let (file_offset, file_size) = segment.file_range();
                Segment {
                    file_offset,
                    file_size,
                    address: segment.address(),
                    memory_size: segment.size(),
                    executable: matches!(
                        segment.flags(),
                        SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
                    ),
                }
            })
            .collect();
        let kind = if segments.iter().any(|s| s.executable && s.file_size > 0) {
            FileKind::Binary
        } else {
            FileKind::DebugOnly
        };
        let symbols = function_symbols(&file, limits.max_symbols)?;
        let dwarf = load_dwarf(&file, data, &limits)?;
        Ok(Self {
            build_id,
            kind,
            segments,
            symbols,
            dwarf,
            limits,
        })
    }

    /// The build id its note records, if any.
    pub fn build_id(&self) -> Option<&BuildId> {
        self.build_id.as_ref()
    }

    /// Whether it is a binary or debug info alone.
    pub fn kind(&self) -> FileKind {
        self.kind
    }

    /// Whether it has DWARF (names of static and inlined functions, files
    /// and lines), beyond its symbol table.
    pub fn has_dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    /// How many function symbols it has.
    pub fn symbol_count(&self) -> usize {
        self.symbols.len()
    }
}

/// Function symbols of `.symtab` and `.dynsym` with a size, sorted by
/// start, one per start address.
fn function_symbols(file: &object::File<'_>, limit: usize) -> Result<Vec<Symbol>, DebugInfoError> {
    let mut symbols = Vec::new();
    for symbol in file.symbols().chain(file.dynamic_symbols()) {
        if symbol.kind() != SymbolKind::Text || symbol.size() == 0 || !symbol.is_definition() {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        if name.is_empty() {
            continue;
        }
        if symbols.len() >= limit.saturating_mul(2) {
            return Err(DebugInfoError::TooManySymbols { limit });
        }
        symbols.push(Symbol {
            start: symbol.address(),
            end: symbol.address().saturating_add(symbol.size()),
            name: name.into(),
        });
    }
    symbols.sort_by(|a, b| a.start.cmp(&b.start).then(a.name.cmp(&b.name)));
    symbols.dedup_by_key(|s| s.start);
    if symbols.len() > limit {
        return Err(DebugInfoError::TooManySymbols { limit });
    }
    Ok(symbols)
}

/// The DWARF sections, inflated within the budget, and the lookup context
/// over them; `None` when the file has no `.debug_info`.
fn load_dwarf(
    file: &object::File<'_>,
    data: &[u8],
    limits: &DebugInfoLimits,
) -> Result<Option<addr2line::Context<Reader>>, DebugInfoError> {
    let has_info = file
        .section_by_name(".debug_info")
        .is_some_and(|s| s.file_range().is_some_and(|(_, size)| size > 0));
    if !has_info {
        return Ok(None);
    }
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let mut budget = limits.max_section_bytes;
    let dwarf = gimli::Dwarf::load(|id: gimli::SectionId| {
        let bytes = match file.section_by_name(id.name()) {
            Some(section) => section_bytes(&section, data, &mut budget, limits)?,
            None => Vec::new(),
        };
        Ok::<_, DebugInfoError>(EndianArcSlice::new(Arc::from(bytes), endian))
    })?;
    check_entries(&dwarf, limits)?;
    addr2line::Context::from_dwarf(dwarf)
        .map(Some)
        .map_err(|source| DebugInfoError::Dwarf { source })
}

/// One section's bytes, inflated when compressed, taken from `budget`.
fn section_bytes(
    section: &object::Section<'_, '_>,
    data: &[u8],
    budget: &mut u64,
    limits: &DebugInfoLimits,
) -> Result<Vec<u8>, DebugInfoError> {
    let name = section.name().unwrap_or("?").to_owned();
    let fail = |message: String| DebugInfoError::Section {
        section: name.clone(),
        message,
    };
    if section.kind() == SectionKind::UninitializedData || section.file_range().is_none() {
        return Ok(Vec::new());
    }
    let range = section
        .compressed_file_range()
        .map_err(|e| fail(e.to_string()))?;
    let size = match range.format {
        CompressionFormat::None => range.compressed_size,
        _ => range.uncompressed_size,
    };
    if size > *budget {
        return Err(DebugInfoError::SectionBudget {
            limit: limits.max_section_bytes,
        });
    }
    *budget -= size;
    let raw = usize::try_from(range.offset)
        .ok()
        .zip(usize::try_from(range.compressed_size).ok())
        .and_then(|(start, len)| data.get(start..start.checked_add(len)?))
        .ok_or_else(|| fail("outside the file".to_owned()))?;
    let expected = usize::try_from(size).map_err(|_| fail("too large".to_owned()))?;
    match range.format {
        CompressionFormat::None => Ok(raw.to_vec()),
        CompressionFormat::Zlib => {
            let mut out = Vec::with_capacity(expected.min(raw.len().saturating_mul(64)));
            flate2::read::ZlibDecoder::new(raw)
                .take(size)
                .read_to_end(&mut out)
                .map_err(|e| fail(format!("zlib: {e}")))?;
            check_inflated(out, expected, &fail)
        }
        CompressionFormat::Zstandard => {
            let mut out = Vec::with_capacity(expected.min(raw.len().saturating_mul(64)));
            zstd::stream::read::Decoder::new(raw)
                .map_err(|e| fail(format!("zstd: {e}")))?
                .take(size)
                .read_to_end(&mut out)
                .map_err(|e| fail(format!("zstd: {e}")))?;
            check_inflated(out, expected, &fail)
        }
        _ => Err(fail("unknown compression".to_owned())),
    }
}

fn check_inflated(
    out: Vec<u8>,
    expected: usize,
    fail: &impl Fn(String) -> DebugInfoError,
) -> Result<Vec<u8>, DebugInfoError> {
    if out.len() == expected {
        Ok(out)
    } else {
        Err(fail(format!(
            "inflated to {} bytes, its header says {expected}",
            out.len()
        )))
    }
}

/// Walks every entry of every unit once, without recursion: refuses
/// nesting past `max_dwarf_depth` (the DWARF reader recurses per level)
/// and more than `max_dwarf_entries` entries.
fn check_entries(
    dwarf: &gimli::Dwarf<Reader>,
    limits: &DebugInfoLimits,
) -> Result<(), DebugInfoError> {
    let gimli_error = |source| DebugInfoError::Dwarf { source };
    let mut entries_seen = 0u64;
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(gimli_error)? {
        let unit = dwarf.unit(header).map_err(gimli_error)?;
        let mut entries = unit.entries_raw(None).map_err(gimli_error)?;
        while !entries.is_empty() {
            let depth = entries.next_depth();
            if depth < 0 || depth as u64 > limits.max_dwarf_depth {
                return Err(DebugInfoError::DwarfLimit {
                    what: "nesting",
                    limit: limits.max_dwarf_depth,
                });
            }
            let Some(abbreviation) = entries.read_abbreviation().map_err(gimli_error)? else {
                continue;
            };
            entries_seen += 1;
            if entries_seen > limits.max_dwarf_entries {
                return Err(DebugInfoError::DwarfLimit {
                    what: "entries",
                    limit: limits.max_dwarf_entries,
                });
            }
            entries
                .skip_attributes(abbreviation.attributes())
                .map_err(gimli_error)?;
        }
    }
    Ok(())
}
