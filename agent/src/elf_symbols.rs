//! Reading the ELF objects processes map, without ever mapping them.
//!
//! A process can truncate a file the agent has mapped, and the agent's next
//! touch of a page past the new end is a SIGBUS that ends it. So objects
//! are read with `pread` (a truncation is then a short read, an error):
//! the size of their symbol tables, their build id, and, for blazesym
//! (which only reads files by mapping them), a copy of just the parts it
//! symbolizes from, in sealed anonymous memory the process cannot touch.

use std::fs::File;
use std::os::unix::fs::FileExt;

use object::elf;
use object::read::elf::{FileHeader, NoteIterator, SectionHeader};
use object::{Endianness, ReadCache};

type Header = elf::FileHeader64<Endianness>;

/// Note sections larger than this are not read for a build id (the GNU
/// build id note is 36 bytes; whole `.note*` sections are a few hundred).
const MAX_NOTE_SECTION_BYTES: u64 = 64 * 1024;

/// Bytes copied per `pread`: a large symbol table is copied through a
/// small buffer, not read whole into memory first.
const COPY_CHUNK_BYTES: usize = 256 * 1024;

/// Why an object could not be copied for symbolization.
#[derive(Debug, thiserror::Error)]
pub enum ElfCopyError {
    /// Not a 64-bit ELF object, or its headers are malformed or use
    /// extended numbering (only unlinked objects need it).
    #[error("not a readable 64-bit ELF object")]
    NotElf,
    /// Headers and symbol and string tables over the cap.
    #[error("{bytes} bytes of headers, symbol and string tables, over the cap of {cap}")]
    TooLarge {
        /// Bytes the copy would hold.
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
    /// Creating, filling or sealing the anonymous copy failed.
    #[error("creating the in-memory copy failed at {step}")]
    Memfd {
        /// The step that failed.
        step: &'static str,
        /// The error.
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

/// Bytes of `.symtab` and `.dynsym` plus their string tables; `None` when
/// the file is not a readable 64-bit ELF object.
pub fn symbol_table_bytes(file: &File) -> Option<u64> {
    let data = ReadCache::new(file);
    let (header, endian) = parse_headers(&data)?;
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

/// A copy of `file` holding what blazesym reads to name file offsets (the
/// ELF header, program and section headers, and every symbol and string
/// table) at their offsets in a sparse anonymous file of the same size,
/// sealed against any change. At most `max_bytes` are copied. Blazesym
/// maps the copy, which nothing outside the agent can truncate.
pub fn symbolization_copy(file: &File, max_bytes: u64) -> Result<File, ElfCopyError> {
    let data = ReadCache::new(file);
    let (header, endian) = parse_headers(&data).ok_or(ElfCopyError::NotElf)?;
    let sections = header
        .sections(endian, &data)
        .map_err(|_| ElfCopyError::NotElf)?;
    let header_table = |offset: u64, count: u16, entry_size: u16| {
        (
            offset,
            u64::from(count).saturating_mul(u64::from(entry_size)),
        )
    };
    let mut ranges = vec![
        (0, size_of::<Header>() as u64),
        header_table(
            header.e_phoff.get(endian),
            header.e_phnum.get(endian),
            header.e_phentsize.get(endian),
        ),
        header_table(
            header.e_shoff.get(endian),
            header.e_shnum.get(endian),
            header.e_shentsize.get(endian),
        ),
    ];
    // The section name table is a string table too.
    ranges.extend(
        sections
            .iter()
            .filter(|s| {
                matches!(
                    s.sh_type(endian),
                    elf::SHT_SYMTAB | elf::SHT_DYNSYM | elf::SHT_STRTAB
                )
            })
            .map(|s| (s.sh_offset(endian), s.sh_size(endian))),
    );
    let bytes = ranges
        .iter()
        .map(|&(_, size)| size)
        .fold(0u64, u64::saturating_add);
    if bytes > max_bytes {
        return Err(ElfCopyError::TooLarge {
            bytes,
            cap: max_bytes,
        });
    }
    let length = file
        .metadata()
        .map_err(|source| ElfCopyError::Read {
            what: "the size",
            source,
        })?
        .len();
    let copy = sealable_memfd()?;
    // Sparse: only the ranges written below take memory.
    copy.set_len(length).map_err(|source| ElfCopyError::Memfd {
        step: "sizing",
        source,
    })?;
    let mut buffer = vec![0; COPY_CHUNK_BYTES];
    for (offset, size) in ranges {
        copy_range(file, &copy, offset, size, &mut buffer)?;
    }
    seal(&copy)?;
    Ok(copy)
}

/// Copies `size` bytes at `offset` from `from` to the same offset of `to`.
fn copy_range(
    from: &File,
    to: &File,
    offset: u64,
    size: u64,
    buffer: &mut [u8],
) -> Result<(), ElfCopyError> {
    let mut done = 0u64;
    while done < size {
        let chunk = usize::try_from(size - done).map_or(buffer.len(), |n| n.min(buffer.len()));
        let at = offset.saturating_add(done);
        // A range past the end (a truncated or lying file) is a short read.
        from.read_exact_at(&mut buffer[..chunk], at)
            .map_err(|source| ElfCopyError::Read {
                what: "a header or symbol table",
                source,
            })?;
        to.write_all_at(&buffer[..chunk], at)
            .map_err(|source| ElfCopyError::Memfd {
                step: "writing",
                source,
            })?;
        done += chunk as u64;
    }
    Ok(())
}

fn sealable_memfd() -> Result<File, ElfCopyError> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: memfd_create with a NUL-terminated name and valid flags.
    let fd = unsafe {
        libc::memfd_create(
            c"kiln-elf-symbols".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(ElfCopyError::Memfd {
            step: "memfd_create",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Seals the copy: its size and contents can no longer change, so a
/// mapping of it can never fault past its end.
fn seal(copy: &File) -> Result<(), ElfCopyError> {
    use std::os::fd::AsRawFd;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(ElfCopyError::Memfd {
            step: "sealing",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
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

    fn name_at(symbolizer: &blazesym::symbolize::Symbolizer, copy: &File, offset: u64) -> String {
        use blazesym::symbolize::source::{Elf, Source};
        use std::os::fd::AsRawFd;
        let mut elf = Elf::new(format!("/proc/self/fd/{}", copy.as_raw_fd()));
        elf.debug_syms = false;
        let results = symbolizer
            .symbolize(
                &Source::Elf(elf),
                blazesym::symbolize::Input::FileOffset(&[offset]),
            )
            .expect("symbolized");
        results[0]
            .as_sym()
            .map(|sym| sym.name.to_string())
            .unwrap_or_default()
    }

    /// A process truncating a library the agent reads: blazesym, which
    /// maps what it reads, would take a SIGBUS on its next touch of the
    /// symbol tables; it reads the sealed copy instead, and the reads of
    /// the original are short reads, so errors.
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

        let symbolizer = blazesym::symbolize::Symbolizer::new();
        let copy = symbolization_copy(&file, u64::MAX).expect("copied");
        assert_eq!(build_id(&file).map(|b| b.len()), Some(20));
        // The first lookup maps the copy; the truncation then drops the
        // original's pages, which a mapping of it would fault on.
        let offset = marker_offset();
        assert!(name_at(&symbolizer, &copy, offset).contains("kiln_truncation_marker"));
        writer.set_len(4096).expect("truncate");
        assert!(name_at(&symbolizer, &copy, offset).contains("kiln_truncation_marker"));
        assert_eq!(build_id(&file), None, "the notes are past the end now");
        assert!(symbolization_copy(&file, u64::MAX).is_err());

        // And while another thread truncates and restores it over and
        // over (reading the original this way, as blazesym did, ends the
        // test with a SIGBUS within a second): every read either succeeds
        // or fails, none signals.
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
                match symbolization_copy(&file, u64::MAX) {
                    Ok(copy) => {
                        let symbolizer = blazesym::symbolize::Symbolizer::new();
                        if name_at(&symbolizer, &copy, offset).contains("kiln_truncation_marker") {
                            named += 1;
                        }
                    }
                    Err(_) => refused += 1,
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            eprintln!("under truncation: {named} copies named the marker, {refused} refused");
        });
    }

    #[test]
    fn the_copy_is_sealed_sparse_and_capped() {
        use std::os::fd::AsRawFd;
        let exe = File::open("/proc/self/exe").expect("own executable");
        let length = exe.metadata().expect("stat").len();
        let copy = symbolization_copy(&exe, u64::MAX).expect("copied");
        assert_eq!(copy.metadata().expect("stat").len(), length);
        // SAFETY: fcntl on a descriptor the test owns.
        let seals = unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_GET_SEALS) };
        assert_ne!(seals & libc::F_SEAL_SHRINK, 0);
        assert!(copy.set_len(0).is_err(), "the copy cannot be truncated");
        let tables = symbol_table_bytes(&exe).expect("tables");
        assert!(matches!(
            symbolization_copy(&exe, tables / 2),
            Err(ElfCopyError::TooLarge { .. })
        ));
        let text = File::open("/proc/self/cmdline").expect("readable");
        assert!(matches!(
            symbolization_copy(&text, u64::MAX),
            Err(ElfCopyError::NotElf)
        ));
    }
}
