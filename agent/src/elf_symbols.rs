//! Reading the ELF objects processes map, without ever mapping them.
//!
//! A process can truncate a file the agent has mapped, and the agent's next
//! touch of a page past the new end is a SIGBUS that ends it. So objects
//! are read with `pread` (a truncation is then a short read, an error):
//! their build id, their code symbols into a compact index
//! (`symbol_index`), and the names of the symbols a lookup finds.

use std::fs::File;
use std::os::unix::fs::FileExt;

use object::elf;
use object::read::elf::{FileHeader, NoteIterator, ProgramHeader, SectionHeader};
use object::{Endianness, ReadCache, SectionIndex};

use crate::go_pclntab::{Pclntab, WindowedSection};
use crate::symbol_index::{
    FoundSymbol, RawSymbol, SymbolIndex, SymbolIndexBuilder, SymbolTableKind,
};

type Header = elf::FileHeader64<Endianness>;
type Symbol = elf::Sym64<Endianness>;

/// Note sections larger than this are not read for a build id (the GNU
/// build id note is 36 bytes; whole `.note*` sections are a few hundred).
const MAX_NOTE_SECTION_BYTES: u64 = 64 * 1024;

/// Symbols read per `pread` (256 KiB): a large symbol table is indexed
/// through a small buffer, not read whole into memory first.
const SYMBOLS_PER_READ: usize = 256 * 1024 / size_of::<Symbol>();

/// The longest symbol name read. Longer ones (a few C++ template
/// instantiations) stay unnamed rather than cost the agent their bytes.
const MAX_NAME_BYTES: u64 = 16 * 1024;

/// Why an object's symbols could not be indexed.
#[derive(Debug, thiserror::Error)]
pub enum ElfSymbolsError {
    /// Not a 64-bit ELF object, or its headers are malformed or use
    /// extended numbering (only unlinked objects need it).
    #[error("not a readable 64-bit ELF object")]
    NotElf,
    /// Symbol and string tables over the cap.
    #[error("{bytes} bytes of symbol and string tables, over the cap of {cap}")]
    TooLarge {
        /// Bytes of `.symtab` and `.dynsym` with their string tables.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// Reading the object failed: truncated (or grown) while it was read.
    #[error("reading {what} of the object failed")]
    Read {
        /// The part being read.
        what: &'static str,
        /// The error (`UnexpectedEof` for a truncated file).
        #[source]
        source: std::io::Error,
    },
}

/// The parsed header and section headers of an object, read through
/// `pread`, refusing header tables that could cost more than a few MiB.
fn parse_headers<'data>(data: &'data ReadCache<&File>) -> Option<(&'data Header, Endianness)> {
    let header = Header::parse(data).ok()?;
    let endian = header.endian().ok()?;
    // Extended numbering (e_shnum 0 with section headers, e_phnum
    // PN_XNUM) takes the real counts from the first section header, up to
    // 2^32 headers; 65,535 headers of 64 bytes are at most 4 MiB.
    if header.e_shnum.get(endian) == 0 && header.e_shoff.get(endian) != 0 {
        return None;
    }
    if header.e_phnum.get(endian) == elf::PN_XNUM {
        return None;
    }
    Some((header, endian))
}

/// The GNU build id of an ELF object, from its note sections; `None` when
/// it has none or cannot be read.
pub fn build_id(file: &File) -> Option<Vec<u8>> {
    let data = ReadCache::new(file);
    let (header, endian) = parse_headers(&data)?;
    let sections = header.sections(endian, &data).ok()?;
    for section in sections.iter() {
        let size = section.sh_size(endian);
        if section.sh_type(endian) != elf::SHT_NOTE || size > MAX_NOTE_SECTION_BYTES {
            continue;
        }
        let mut bytes = vec![0; usize::try_from(size).ok()?];
        file.read_exact_at(&mut bytes, section.sh_offset(endian))
            .ok()?;
        let Ok(mut notes) =
            NoteIterator::<Header>::new(endian, section.sh_addralign(endian), &bytes)
        else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                return Some(note.desc().to_vec());
            }
        }
    }
    None
}

/// One symbol table of an object: its kind, where it lies (offset,
/// size) and where its string table lies.
type TableRange = (SymbolTableKind, (u64, u64), (u64, u64));

/// The code symbols of `file`'s `.symtab` and `.dynsym`, indexed by
/// address; refused when the two tables and their strings hold more than
/// `max_table_bytes`, before any of them is read.
pub fn read_symbol_index(
    file: &File,
    max_table_bytes: u64,
) -> Result<SymbolIndex, ElfSymbolsError> {
    let (loads, tables, go_table, endian) = {
        let data = ReadCache::new(file);
        let (header, endian) = parse_headers(&data).ok_or(ElfSymbolsError::NotElf)?;
        let loads: Vec<(u64, u64, u64)> = header
            .program_headers(endian, &data)
            .map_err(|_| ElfSymbolsError::NotElf)?
            .iter()
            .filter(|segment| segment.p_type(endian) == elf::PT_LOAD)
            .map(|segment| {
                (
                    segment.p_offset(endian),
                    segment.p_filesz(endian),
                    segment.p_vaddr(endian),
                )
            })
            .collect();
        let sections = header
            .sections(endian, &data)
            .map_err(|_| ElfSymbolsError::NotElf)?;
        let mut tables: Vec<TableRange> = Vec::new();
        for section in sections.iter() {
            let kind = match section.sh_type(endian) {
                elf::SHT_SYMTAB => SymbolTableKind::Full,
                elf::SHT_DYNSYM => SymbolTableKind::Dynamic,
                _ => continue,
            };
            let Some(strings) = sections
                .section(SectionIndex(section.sh_link(endian) as usize))
                .ok()
                .filter(|strings| strings.sh_type(endian) == elf::SHT_STRTAB)
            else {
                continue;
            };
            tables.push((
                kind,
                (section.sh_offset(endian), section.sh_size(endian)),
                (strings.sh_offset(endian), strings.sh_size(endian)),
            ));
        }
        // A stripped Go binary names its functions only in Go's own table.
        let go_table = if tables
            .iter()
            .any(|(kind, ..)| *kind == SymbolTableKind::Full)
        {
            None
        } else {
            let text = sections
                .section_by_name(endian, b".text")
                .map_or(0, |(_, text)| text.sh_addr(endian));
            sections
                .section_by_name(endian, b".gopclntab")
                .filter(|(_, section)| section.sh_type(endian) == elf::SHT_PROGBITS)
                .map(|(_, section)| (section.sh_offset(endian), section.sh_size(endian), text))
        };
        (loads, tables, go_table, endian)
    };
    let bytes = tables
        .iter()
        .map(|&(_, (_, size), (_, strings))| size.saturating_add(strings))
        .fold(0u64, u64::saturating_add);
    if bytes > max_table_bytes {
        return Err(ElfSymbolsError::TooLarge {
            bytes,
            cap: max_table_bytes,
        });
    }
    let mut builder = SymbolIndexBuilder::new(loads);
    let mut buffer = vec![0u8; SYMBOLS_PER_READ * size_of::<Symbol>()];
    for (kind, (offset, size), strings) in tables {
        // The tables are within the cap, so their count fits memory.
        let count = usize::try_from(size / size_of::<Symbol>() as u64).unwrap_or(0);
        builder.start_table(kind, strings, count);
        let mut done = 0;
        while done < count {
            let batch = (count - done).min(SYMBOLS_PER_READ);
            let chunk = &mut buffer[..batch * size_of::<Symbol>()];
            let at = offset.saturating_add((done * size_of::<Symbol>()) as u64);
            file.read_exact_at(chunk, at)
                .map_err(|source| ElfSymbolsError::Read {
                    what: "a symbol table",
                    source,
                })?;
            let symbols: &[Symbol] =
                object::pod::slice_from_all_bytes(chunk).map_err(|_| ElfSymbolsError::NotElf)?;
            for symbol in symbols {
                builder.add(
                    kind,
                    RawSymbol {
                        name: symbol.st_name.get(endian),
                        info: symbol.st_info,
                        section: symbol.st_shndx.get(endian),
                        address: symbol.st_value.get(endian),
                        size: symbol.st_size.get(endian),
                    },
                );
            }
            done += batch;
        }
    }
    if let Some(go_table) = go_table {
        add_go_functions(file, go_table, max_table_bytes - bytes, &mut builder)?;
    }
    Ok(builder.finish())
}

/// Indexes the functions of a Go binary's `.gopclntab` (offset, size and
/// the `.text` address) as its full symbol table: their names lie in the
/// table's name section, NUL-terminated like a string table's. The table
/// is read a window at a time; it is charged as the `.symtab` and
/// `.strtab` it stands in for (24 bytes a function, and its names)
/// against `max_table_bytes`. A header that is not one Go writes adds
/// nothing.
fn add_go_functions(
    file: &File,
    (offset, size, text): (u64, u64, u64),
    max_table_bytes: u64,
    builder: &mut SymbolIndexBuilder,
) -> Result<(), ElfSymbolsError> {
    let size = usize::try_from(size).map_err(|_| ElfSymbolsError::NotElf)?;
    let mut source = WindowedSection::new(
        |at, buffer: &mut [u8]| file.read_exact_at(buffer, at).is_ok(),
        offset,
        size,
    );
    let Ok(pclntab) = Pclntab::parse(&mut source, text) else {
        return Ok(());
    };
    let names = pclntab.names();
    let bytes = (pclntab.function_count() as u64)
        .saturating_mul(size_of::<Symbol>() as u64)
        .saturating_add(names.len() as u64);
    if bytes > max_table_bytes {
        return Err(ElfSymbolsError::TooLarge {
            bytes,
            cap: max_table_bytes,
        });
    }
    builder.start_table(
        SymbolTableKind::Full,
        (offset + names.start as u64, names.len() as u64),
        pclntab.function_count(),
    );
    pclntab.each_function(&mut source, |_, function| {
        builder.add(
            SymbolTableKind::Full,
            RawSymbol {
                name: function.name,
                info: GO_FUNCTION_INFO,
                section: GO_FUNCTION_SECTION,
                address: function.entry,
                size: function.end - function.entry,
            },
        );
    });
    Ok(())
}

/// What a Go function is indexed as: a defined (`STT_FUNC`) symbol of
/// some section, as the symbol table would have said before strip.
const GO_FUNCTION_INFO: u8 = 2;
const GO_FUNCTION_SECTION: u16 = 1;

/// The name of a symbol an index found, read from its string table in
/// `file`; `None` when it cannot be read (a truncated file: a short
/// read), is empty, has no terminator within [`MAX_NAME_BYTES`] or is not
/// UTF-8.
pub fn read_symbol_name(file: &File, found: &FoundSymbol) -> Option<String> {
    let limit = found.name_limit.min(MAX_NAME_BYTES);
    let mut name: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 256];
    while (name.len() as u64) < limit {
        let want =
            usize::try_from(limit - name.len() as u64).map_or(chunk.len(), |n| n.min(chunk.len()));
        let at = found.name_offset.saturating_add(name.len() as u64);
        let read = file.read_at(&mut chunk[..want], at).ok()?;
        if read == 0 {
            return None;
        }
        if let Some(end) = chunk[..read].iter().position(|&b| b == 0) {
            name.extend_from_slice(&chunk[..end]);
            return String::from_utf8(name).ok().filter(|n| !n.is_empty());
        }
        name.extend_from_slice(&chunk[..read]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_id_is_the_one_blazesym_reads() {
        let exe = File::open("/proc/self/exe").expect("own executable");
        let ours = build_id(&exe).expect("the test binary has a build id");
        let blazesym = blazesym::helper::read_elf_build_id("/proc/self/exe")
            .expect("blazesym reads it")
            .expect("a build id");
        assert_eq!(ours, blazesym.to_vec());
        let text = File::open("/proc/self/cmdline").expect("readable");
        assert_eq!(build_id(&text), None);
    }

    #[inline(never)]
    fn kiln_truncation_marker() -> u64 {
        std::hint::black_box(7)
    }

    /// The file offset of `kiln_truncation_marker` in the test binary.
    fn marker_offset() -> u64 {
        let address = kiln_truncation_marker as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("own maps");
        let maps = crate::proc_maps::parse_executable_maps(&maps).expect("parse");
        let index = crate::proc_maps::find_mapping(&maps, address).expect("mapped");
        maps[index].file_offset_of(address)
    }

    fn name_at(file: &File, index: &SymbolIndex, offset: u64) -> Option<String> {
        read_symbol_name(file, &index.find(offset)?)
    }

    #[test]
    fn the_agents_own_function_is_named_as_blazesym_names_it() {
        assert_eq!(kiln_truncation_marker(), 7);
        let exe = File::open("/proc/self/exe").expect("own executable");
        let index = read_symbol_index(&exe, u64::MAX).expect("indexed");
        assert!(!index.is_empty());
        let offset = marker_offset();
        let ours = name_at(&exe, &index, offset).expect("named");
        assert!(ours.contains("kiln_truncation_marker"), "got {ours}");
        let symbolizer = blazesym::symbolize::Symbolizer::builder()
            .enable_demangling(false)
            .build();
        let mut elf = blazesym::symbolize::source::Elf::new("/proc/self/exe");
        elf.debug_syms = false;
        let theirs = symbolizer
            .symbolize(
                &blazesym::symbolize::source::Source::Elf(elf),
                blazesym::symbolize::Input::FileOffset(&[offset]),
            )
            .expect("symbolized");
        let theirs = theirs[0].as_sym().map(|sym| sym.name.to_string());
        assert_eq!(Some(ours), theirs);
    }

    #[test]
    fn text_files_and_tables_over_the_cap_are_refused() {
        let text = File::open("/proc/self/cmdline").expect("readable");
        assert!(matches!(
            read_symbol_index(&text, u64::MAX),
            Err(ElfSymbolsError::NotElf)
        ));
        let exe = File::open("/proc/self/exe").expect("own executable");
        assert!(matches!(
            read_symbol_index(&exe, 1),
            Err(ElfSymbolsError::TooLarge { cap: 1, .. })
        ));
    }

    /// A process truncating a library the agent reads: every read is a
    /// `pread`, so a truncated file is a short read (no name, or an
    /// error), never a SIGBUS.
    #[test]
    fn truncating_the_object_while_it_is_read_is_an_error_not_a_signal() {
        use std::os::unix::fs::FileExt;
        assert_eq!(kiln_truncation_marker(), 7);
        let original = std::fs::read("/proc/self/exe").expect("own executable");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("libvictim.so");
        std::fs::write(&path, &original).expect("copy");
        let file = File::open(&path).expect("open");
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("writable");

        let index = read_symbol_index(&file, u64::MAX).expect("indexed");
        assert_eq!(build_id(&file).map(|b| b.len()), Some(20));
        let offset = marker_offset();
        assert!(
            name_at(&file, &index, offset).is_some_and(|n| n.contains("kiln_truncation_marker"))
        );
        writer.set_len(4096).expect("truncate");
        assert_eq!(
            name_at(&file, &index, offset),
            None,
            "its strings are past the end now"
        );
        assert_eq!(build_id(&file), None, "the notes are past the end now");
        assert!(read_symbol_index(&file, u64::MAX).is_err());

        // And while another thread truncates and restores it over and
        // over: every read either succeeds or fails, none signals.
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    writer.set_len(4096).expect("truncate");
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    writer.write_all_at(&original, 0).expect("restore");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            });
            let (mut named, mut refused) = (0, 0);
            let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
            while std::time::Instant::now() < until {
                let _ = build_id(&file);
                match read_symbol_index(&file, u64::MAX) {
                    Ok(index) => {
                        if name_at(&file, &index, offset)
                            .is_some_and(|n| n.contains("kiln_truncation_marker"))
                        {
                            named += 1;
                        }
                    }
                    Err(_) => refused += 1,
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            eprintln!("under truncation: {named} indexes named the marker, {refused} refused");
        });
    }
}
