//! The symbolizer's parsers: an ELF file (a binary or a split debug file,
//! from an upload or a debuginfod server) read whole within limits and
//! then looked up at a few offsets; and the symbol cache file as the
//! bucket returns it. [`elf_seed`] is the seed: a small ELF file written
//! here, with a loadable segment, a build id note, a function symbol and
//! DWARF naming that function and a call inlined into it.

use kiln_debuginfo::cache_file::{self, CacheContents, MissingBuildId, ResolvedAddress};
use kiln_debuginfo::{BuildId, DebugFile, DebugInfoLimits, Frame};

/// Limits small enough that a fuzzed file cannot take the fuzzer's memory.
fn limits() -> DebugInfoLimits {
    DebugInfoLimits {
        max_file_bytes: 1 << 20,
        max_section_bytes: 8 << 20,
        max_symbols: 10_000,
        max_dwarf_depth: 64,
        max_dwarf_entries: 100_000,
        max_frames_per_address: 16,
    }
}

/// An ELF file read, then looked up at offsets in and around its code.
pub fn debuginfo(data: &[u8]) {
    let limits = limits();
    match DebugFile::parse(data, limits) {
        Ok(file) => {
            let end = data.len() as u64;
            for offset in [0, TEXT_OFFSET, TEXT_OFFSET + 0x10, TEXT_OFFSET + 0x3f, end] {
                for mapping_offset in [0, TEXT_OFFSET & !0xfff, 0x1000] {
                    let frames = file.frames(offset, mapping_offset);
                    assert!(frames.len() <= limits.max_frames_per_address);
                    assert!(frames.iter().all(|f| !f.function.is_empty()));
                }
            }
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
}

/// A symbol cache file: refused, or read into contents that write back to
/// a file reading the same.
pub fn symbol_cache(data: &[u8]) {
    match cache_file::decode(data, 1 << 20) {
        Ok(contents) => {
            let again = cache_file::decode(&cache_file::encode(&contents), 1 << 21);
            assert!(again.is_ok_and(|c| c == contents));
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
}

/// A cache of two resolved addresses and one missing build id.
pub fn symbol_cache_seed() -> Vec<u8> {
    let id = |text: &str| BuildId::parse(text).expect("a valid build id");
    let frame = |function: &str, line| Frame {
        function: function.to_owned(),
        file: "fuzz.c".to_owned(),
        line,
    };
    cache_file::encode(&CacheContents {
        resolved: vec![
            ResolvedAddress {
                build_id: id("0123456789abcdef0123456789abcdef01234567"),
                file_offset: 0x210,
                frames: vec![frame("fuzz_inlined", 3), frame("fuzz_hot", 9)],
            },
            ResolvedAddress {
                build_id: id("0123456789abcdef0123456789abcdef01234567"),
                file_offset: 0x999,
                frames: Vec::new(),
            },
        ],
        missing: vec![MissingBuildId {
            build_id: id("ffff"),
            retry_at_ms: 1_795_310_560_000,
        }],
    })
}

/// Where the seed's code starts, in the file and in memory alike.
pub const TEXT_OFFSET: u64 = 0x200;
const TEXT_SIZE: u64 = 0x40;

fn u16le(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u32le(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u64le(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn pad_to(out: &mut Vec<u8>, align: usize) {
    while !out.len().is_multiple_of(align) {
        out.push(0);
    }
}

/// DWARF 4: a compile unit holding `fuzz_hot` ([0x200, 0x240)) with
/// `fuzz_inlined` inlined at [0x210, 0x220); (abbrev, info).
fn dwarf() -> (Vec<u8>, Vec<u8>) {
    const STRING: u8 = 0x08;
    const ADDR: u8 = 0x01;
    const DATA8: u8 = 0x07;
    const DATA1: u8 = 0x0b;
    const REF4: u8 = 0x13;
    let abbrev = vec![
        1, 0x11, 1, 0x03, STRING, 0x11, ADDR, 0x12, DATA8, 0, 0, // compile unit
        2, 0x2e, 1, 0x03, STRING, 0x11, ADDR, 0x12, DATA8, 0, 0, // subprogram
        3, 0x2e, 0, 0x03, STRING, 0x20, DATA1, 0, 0, // inline subprogram
        4, 0x1d, 0, 0x31, REF4, 0x11, ADDR, 0x12, DATA8, 0, 0, // inlined call
        0,
    ];
    let mut dies = Vec::new();
    // Offsets in a unit count from its header, which is 11 bytes.
    dies.push(1);
    dies.extend_from_slice(b"fuzz.c\0");
    u64le(&mut dies, TEXT_OFFSET);
    u64le(&mut dies, TEXT_SIZE);
    let inline_offset = 11 + dies.len() as u32;
    dies.push(3);
    dies.extend_from_slice(b"fuzz_inlined\0");
    dies.push(1);
    dies.push(2);
    dies.extend_from_slice(b"fuzz_hot\0");
    u64le(&mut dies, TEXT_OFFSET);
    u64le(&mut dies, TEXT_SIZE);
    dies.push(4);
    u32le(&mut dies, inline_offset);
    u64le(&mut dies, TEXT_OFFSET + 0x10);
    u64le(&mut dies, 0x10);
    dies.push(0); // end of fuzz_hot's children
    dies.push(0); // end of the unit's children
    let mut info = Vec::new();
    u32le(&mut info, 7 + dies.len() as u32);
    u16le(&mut info, 4);
    u32le(&mut info, 0);
    info.push(8);
    info.extend_from_slice(&dies);
    (abbrev, info)
}

/// One section header's fields.
struct Section {
    name: &'static str,
    kind: u32,
    flags: u64,
    address: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
}

/// A section header without an address, link, info or entry size.
fn section(name: &'static str, kind: u32, offset: u64, size: u64) -> Section {
    Section {
        name,
        kind,
        flags: 0,
        address: 0,
        offset,
        size,
        link: 0,
        info: 0,
        align: 1,
        entsize: 0,
    }
}

/// The seed ELF file; see the module docs.
pub fn elf_seed() -> Vec<u8> {
    let mut out = vec![0u8; TEXT_OFFSET as usize];
    out.extend(std::iter::repeat_n(0x90, TEXT_SIZE as usize));
    let mut sections = vec![section("", 0, 0, 0)];
    sections.push(Section {
        flags: 6,
        address: TEXT_OFFSET,
        align: 16,
        ..section(".text", 1, TEXT_OFFSET, TEXT_SIZE)
    });
    pad_to(&mut out, 4);
    let note = out.len() as u64;
    u32le(&mut out, 4);
    u32le(&mut out, 20);
    u32le(&mut out, 3);
    out.extend_from_slice(b"GNU\0");
    out.extend((0..20u8).map(|i| i.wrapping_mul(17)));
    sections.push(Section {
        flags: 2,
        address: note,
        align: 4,
        ..section(".note.gnu.build-id", 7, note, 36)
    });
    let strtab = b"\0fuzz_hot\0".to_vec();
    pad_to(&mut out, 8);
    let symtab = out.len() as u64;
    out.extend_from_slice(&[0u8; 24]);
    u32le(&mut out, 1); // "fuzz_hot"
    out.push(0x02); // local function
    out.push(0);
    u16le(&mut out, 1); // in .text
    u64le(&mut out, TEXT_OFFSET);
    u64le(&mut out, TEXT_SIZE);
    sections.push(Section {
        link: 4,
        info: 2,
        align: 8,
        entsize: 24,
        ..section(".symtab", 2, symtab, 48)
    });
    let strtab_at = out.len() as u64;
    out.extend_from_slice(&strtab);
    sections.push(section(".strtab", 3, strtab_at, strtab.len() as u64));
    let (abbrev, info) = dwarf();
    let abbrev_at = out.len() as u64;
    out.extend_from_slice(&abbrev);
    sections.push(section(".debug_abbrev", 1, abbrev_at, abbrev.len() as u64));
    let info_at = out.len() as u64;
    out.extend_from_slice(&info);
    sections.push(section(".debug_info", 1, info_at, info.len() as u64));
    let mut names = vec![0u8];
    let mut name_offsets = Vec::new();
    for section in &sections {
        name_offsets.push(if section.name.is_empty() {
            0
        } else {
            let at = names.len() as u32;
            names.extend_from_slice(section.name.as_bytes());
            names.push(0);
            at
        });
    }
    let shstrtab_name = names.len() as u32;
    names.extend_from_slice(b".shstrtab\0");
    let names_at = out.len() as u64;
    out.extend_from_slice(&names);
    sections.push(section(".shstrtab", 3, names_at, names.len() as u64));
    name_offsets.push(shstrtab_name);
    pad_to(&mut out, 8);
    let loaded = out.len() as u64;
    let section_headers = out.len() as u64;
    for (s, &name) in sections.iter().zip(&name_offsets) {
        u32le(&mut out, name);
        u32le(&mut out, s.kind);
        u64le(&mut out, s.flags);
        u64le(&mut out, s.address);
        u64le(&mut out, s.offset);
        u64le(&mut out, s.size);
        u32le(&mut out, s.link);
        u32le(&mut out, s.info);
        u64le(&mut out, s.align);
        u64le(&mut out, s.entsize);
    }
    let mut header = Vec::with_capacity(120);
    header.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    u16le(&mut header, 3); // a shared object (PIE)
    u16le(&mut header, 62); // x86-64
    u32le(&mut header, 1);
    u64le(&mut header, TEXT_OFFSET);
    u64le(&mut header, 64);
    u64le(&mut header, section_headers);
    u32le(&mut header, 0);
    u16le(&mut header, 64);
    u16le(&mut header, 56);
    u16le(&mut header, 1);
    u16le(&mut header, 64);
    u16le(&mut header, sections.len() as u16);
    u16le(&mut header, (sections.len() - 1) as u16);
    // One loadable, executable segment: the file from its start.
    u32le(&mut header, 1);
    u32le(&mut header, 5);
    u64le(&mut header, 0);
    u64le(&mut header, 0);
    u64le(&mut header, 0);
    u64le(&mut header, loaded);
    u64le(&mut header, loaded);
    u64le(&mut header, 0x1000);
    out[..header.len()].copy_from_slice(&header);
    out
}
