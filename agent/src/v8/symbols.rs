//! Reading the `v8dbg_*` postmortem constants from the ELF object that
//! embeds V8 (the `node` executable, or `libnode.so`).
//!
//! Only the ELF header, section headers, `.dynsym` and its string table are
//! read, capped before they are read, and each constant is one `pread` of
//! at most 8 bytes. The object is never mapped, so a process that truncates
//! it costs an error, not a signal.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::{Endianness, ReadCache};

use crate::runtime_elf::{DynsymError, dynamic_symbols};

/// Most bytes of `.dynsym` plus its string table read (Node 20's are 7 MiB).
const MAX_DYNSYM_BYTES: u64 = 24 << 20;
/// Most `v8dbg_` constants kept (V8 exports about 600).
const MAX_CONSTANTS: usize = 4096;
/// The prefix of the postmortem constants.
const PREFIX: &[u8] = b"v8dbg_";

/// Why an object's constants could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SymbolsError {
    /// Not a readable 64-bit ELF object, or no `.dynsym`.
    #[error("{path}: {what}")]
    BadObject {
        /// The object.
        path: String,
        /// What was wrong.
        what: String,
    },
    /// `.dynsym` and its strings are over the cap.
    #[error("{path}: .dynsym and its strings hold {bytes} bytes, over the cap of {cap}")]
    TooLarge {
        /// The object.
        path: String,
        /// Their size.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// The object exports no postmortem constants (a V8 built without them).
    #[error("{path} exports no v8dbg_ constants")]
    NoConstants {
        /// The object.
        path: String,
    },
}

impl SymbolsError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SymbolsError::BadObject { .. } => "bad_object",
            SymbolsError::TooLarge { .. } => "symbols_over_cap",
            SymbolsError::NoConstants { .. } => "no_postmortem_constants",
        }
    }
}

/// Whether a mapped file's name is one that embeds V8 with its constants:
/// `node`, `nodejs`, `node20`, `libnode.so.115`.
pub fn is_v8_object_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    if let Some(version) = name.strip_prefix("libnode.so") {
        return version.is_empty() || version.starts_with('.');
    }
    let rest = name
        .strip_prefix("nodejs")
        .or_else(|| name.strip_prefix("node"));
    rest.is_some_and(|digits| digits.chars().all(|c| c.is_ascii_digit()))
}

/// The `v8dbg_` constants of `file` (names without the prefix), each read
/// as the signed integer of its symbol's size (4 or 8 bytes); constants in
/// `.bss` are zero.
pub fn read_constants(file: &File, path: &str) -> Result<BTreeMap<String, i64>, SymbolsError> {
    let bad = |what: String| SymbolsError::BadObject {
        path: path.to_owned(),
        what,
    };
    let data = ReadCache::new(file);
    let header = elf::FileHeader64::<Endianness>::parse(&data).map_err(|e| bad(e.to_string()))?;
    let endian = header.endian().map_err(|e| bad(e.to_string()))?;
    if header.e_shnum.get(endian) == 0 && header.e_shoff.get(endian) != 0 {
        return Err(bad("extended section numbering".to_owned()));
    }
    let sections = header
        .sections(endian, &data)
        .map_err(|e| bad(e.to_string()))?;
    let (_, table) =
        dynamic_symbols(&sections, endian, &data, MAX_DYNSYM_BYTES).map_err(|e| match e {
            DynsymError::TooLarge { bytes, cap } => SymbolsError::TooLarge {
                path: path.to_owned(),
                bytes,
                cap,
            },
            other => bad(other.to_string()),
        })?;
    let strings = table.strings();
    let mut constants = BTreeMap::new();
    for symbol in table.symbols() {
        if constants.len() >= MAX_CONSTANTS {
            break;
        }
        let Ok(name) = symbol.name(endian, strings) else {
            continue;
        };
        let Some(name) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        let size = symbol.st_size(endian);
        if size != 4 && size != 8 {
            continue;
        }
        let Ok(section) =
            sections.section(object::SectionIndex(usize::from(symbol.st_shndx(endian))))
        else {
            continue;
        };
        let value = if section.sh_type(endian) == elf::SHT_NOBITS {
            0
        } else {
            let Some(offset) = symbol
                .st_value(endian)
                .checked_sub(section.sh_addr(endian))
                .filter(|&offset| offset.saturating_add(size) <= section.sh_size(endian))
            else {
                continue;
            };
            let mut bytes = [0u8; 8];
            let width = size as usize;
            file.read_exact_at(
                &mut bytes[..width],
                section.sh_offset(endian).saturating_add(offset),
            )
            .map_err(|e| bad(format!("reading v8dbg_{name}: {e}")))?;
            if width == 4 {
                i64::from(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
            } else {
                i64::from_le_bytes(bytes)
            }
        };
        constants.insert(name.to_owned(), value);
    }
    if constants.is_empty() {
        return Err(SymbolsError::NoConstants {
            path: path.to_owned(),
        });
    }
    Ok(constants)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn node_binaries_are_recognised_by_name() {
        for path in [
            "/usr/bin/node",
            "/usr/bin/nodejs",
            "/opt/node20",
            "/usr/lib/libnode.so.115",
            "/usr/lib/libnode.so",
            "/usr/bin/node (deleted)",
        ] {
            assert!(is_v8_object_name(path), "{path}");
        }
        for path in [
            "/usr/bin/nodemon",
            "/usr/lib/libnodes.so",
            "/bin/sh",
            "/x/nodejs-x",
        ] {
            assert!(!is_v8_object_name(path), "{path}");
        }
    }

    #[test]
    fn the_node_on_this_machine_gives_a_layout() {
        let path = "/usr/bin/node";
        let Ok(file) = File::open(path) else {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {path} is not installed");
            return;
        };
        let constants = read_constants(&file, path).expect("node exports v8dbg_ constants");
        let layout = crate::v8::layout::V8Layout::from_constants(&constants)
            .expect("a layout the agent can use");
        assert_eq!(layout.frame.function, -16, "{layout:?}");
        assert_eq!(constants.get("HeapObjectTag"), Some(&1));
    }

    #[test]
    fn objects_without_constants_are_refused_with_a_reason() {
        let exe = File::open("/proc/self/exe").expect("own executable");
        let error = read_constants(&exe, "self").expect_err("no v8dbg_ here");
        assert!(matches!(
            error.reason(),
            "no_postmortem_constants" | "bad_object"
        ));
        let text = File::open("/proc/self/cmdline").expect("readable");
        assert_eq!(
            read_constants(&text, "cmdline").map_err(|e| e.reason()),
            Err("bad_object")
        );
    }
}
