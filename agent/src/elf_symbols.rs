//! How many bytes of symbol tables an ELF object holds, read from its
//! section headers only, so the symbolizer can refuse an object whose
//! tables would take too much memory to parse before parsing any of it.

use std::fs::File;

use object::elf;
use object::read::elf::{FileHeader, SectionHeader};
use object::{Endianness, ReadCache};

/// Bytes of `.symtab` and `.dynsym` plus their string tables; `None` when
/// the file is not a readable 64-bit ELF object.
pub fn symbol_table_bytes(file: &File) -> Option<u64> {
    let data = ReadCache::new(file);
    let header = elf::FileHeader64::<Endianness>::parse(&data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, &data).ok()?;
    let mut total: u64 = 0;
    for section in sections.iter() {
        let kind = section.sh_type(endian);
        if kind != elf::SHT_SYMTAB && kind != elf::SHT_DYNSYM {
            continue;
        }
        let strings = sections
            .section(object::SectionIndex(section.sh_link(endian) as usize))
            .map_or(0, |s| s.sh_size(endian));
        total = total
            .saturating_add(section.sh_size(endian))
            .saturating_add(strings);
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_own_binary_has_symbols_and_text_files_have_none() {
        let exe = File::open("/proc/self/exe").expect("own executable");
        assert!(symbol_table_bytes(&exe).is_some_and(|b| b > 0));
        let text = File::open("/proc/self/cmdline").expect("readable");
        assert_eq!(symbol_table_bytes(&text), None);
    }
}
