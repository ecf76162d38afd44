//! What the runtime readers (CPython, Ruby, HotSpot, V8) read of a
//! runtime's ELF file: its load segments, where a mapping of it puts its
//! stated addresses, and its dynamic symbols, bounded.
//!
//! Every runtime is found through `.dynsym` alone, because distributions
//! strip `.symtab` (Debian's `libruby`, `libjvm.so`, `node`). The table's
//! size is capped before it is read, because the file is the profiled
//! process's, and a process can ship a library that claims millions of
//! symbols to make the node's agent parse them.

use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, SectionTable, SymbolTable};
use object::{Endianness, ReadRef, SectionIndex};

use crate::proc_maps::MapEntry;

/// Why a file's dynamic symbols were not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DynsymError {
    /// The file has no `.dynsym`.
    #[error("no .dynsym section")]
    Missing,
    /// The table and its strings are larger than the reader accepts.
    #[error(".dynsym and its strings hold {bytes} bytes, over the cap of {cap}")]
    TooLarge { bytes: u64, cap: u64 },
    /// The table could not be parsed.
    #[error("{reason}")]
    Malformed { reason: String },
}

/// A file's `PT_LOAD` segments, each as (file offset, file size, stated
/// address), the executable ones among them, and `PT_GNU_EH_FRAME`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    pub loads: Vec<(u64, u64, u64)>,
    pub executable: Vec<(u64, u64, u64)>,
    pub eh_frame_hdr: Option<(u64, u64, u64)>,
}

impl Segments {
    /// The segments of a parsed header.
    pub fn read<'data, R: ReadRef<'data>>(
        header: &FileHeader64<Endianness>,
        endian: Endianness,
        data: R,
    ) -> Result<Segments, String> {
        let mut found = Segments::default();
        for segment in header
            .program_headers(endian, data)
            .map_err(|e| e.to_string())?
        {
            let entry = (
                segment.p_offset(endian),
                segment.p_filesz(endian),
                segment.p_vaddr(endian),
            );
            match segment.p_type(endian) {
                elf::PT_GNU_EH_FRAME => found.eh_frame_hdr = Some(entry),
                elf::PT_LOAD => {
                    found.loads.push(entry);
                    if segment.p_flags(endian) & elf::PF_X != 0 {
                        found.executable.push(entry);
                    }
                }
                _ => {}
            }
        }
        Ok(found)
    }

    /// The difference between addresses in the process and stated
    /// addresses in the file, from the executable segment `entry` maps.
    pub fn load_bias(&self, entry: &MapEntry) -> Option<u64> {
        let page = 4096u64;
        let &(offset, _, vaddr) = self.executable.iter().find(|(offset, size, _)| {
            offset & !(page - 1) <= entry.file_offset
                && entry.file_offset < offset.saturating_add((*size).max(1))
        })?;
        Some(
            entry
                .start
                .wrapping_sub(entry.file_offset)
                .wrapping_add(offset)
                .wrapping_sub(vaddr),
        )
    }
}

/// The file's dynamic symbol table and its section index, refused when the
/// table and its strings hold more than `cap` bytes.
pub fn dynamic_symbols<'data, R: ReadRef<'data>>(
    sections: &SectionTable<'data, FileHeader64<Endianness>, R>,
    endian: Endianness,
    data: R,
    cap: u64,
) -> Result<
    (
        SectionIndex,
        SymbolTable<'data, FileHeader64<Endianness>, R>,
    ),
    DynsymError,
> {
    let (index, dynsym) = sections
        .iter()
        .enumerate()
        .find(|(_, s)| s.sh_type(endian) == elf::SHT_DYNSYM)
        .ok_or(DynsymError::Missing)?;
    let strings_size = sections
        .section(SectionIndex(dynsym.sh_link(endian) as usize))
        .map(|s| s.sh_size(endian))
        .unwrap_or(0);
    let bytes = dynsym.sh_size(endian).saturating_add(strings_size);
    if bytes > cap {
        return Err(DynsymError::TooLarge { bytes, cap });
    }
    let table = sections
        .symbol_table_by_index(endian, data, SectionIndex(index))
        .map_err(|e| DynsymError::Malformed {
            reason: e.to_string(),
        })?;
    Ok((SectionIndex(index), table))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc_maps::MappingKind;

    fn mapping(start: u64, file_offset: u64) -> MapEntry {
        MapEntry {
            start,
            end: start + 0x10000,
            file_offset,
            executable: true,
            kind: MappingKind::Anonymous,
        }
    }

    #[test]
    fn load_bias_comes_from_the_executable_segment_the_mapping_covers() {
        let segments = Segments {
            loads: vec![(0, 0x1000, 0), (0x1000, 0x8000, 0x401000)],
            executable: vec![(0x1000, 0x8000, 0x401000)],
            eh_frame_hdr: None,
        };
        // A PIE mapped at 0x7f00_0000_1000 for its text at file offset 0x1000.
        assert_eq!(
            segments.load_bias(&mapping(0x7f00_0000_1000, 0x1000)),
            Some(0x7f00_0000_1000 - 0x401000)
        );
        assert_eq!(
            segments.load_bias(&mapping(0x7f00_0000_0000, 0x20000)),
            None
        );
    }

    #[test]
    fn this_test_binary_has_segments_and_dynamic_symbols_within_a_cap() {
        let Ok(exe) = std::fs::read("/proc/self/exe") else {
            panic!("cannot read this test's own executable");
        };
        let data = &exe[..];
        let header = FileHeader64::<Endianness>::parse(data).expect("ELF header");
        let endian = header.endian().expect("endianness");
        let segments = Segments::read(header, endian, data).expect("segments");
        assert!(!segments.executable.is_empty());
        let sections = header.sections(endian, data).expect("sections");
        match dynamic_symbols(&sections, endian, data, 1) {
            Err(DynsymError::TooLarge { cap: 1, .. }) | Err(DynsymError::Missing) => {}
            other => panic!("a one-byte cap refuses the table: {other:?}"),
        }
    }
}
