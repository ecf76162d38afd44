//! Finding CPython in a process: the object that holds `_PyRuntime` (the
//! executable, or a `libpython3.x.so` in uWSGI and embedded interpreters),
//! its version, its offsets, and the addresses the agent needs in that
//! process.
//!
//! Only the ELF header, program headers, section headers and `.dynsym` (with
//! its string table) are read, each capped before it is read, so a hostile
//! file costs at most those caps. From 3.13 on, the offsets come from the
//! `_Py_DebugOffsets` table at `_PyRuntime` in the process's memory: a
//! fixed number of bytes, checked whole ([`debug_offsets::parse`]).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use object::elf;
use object::read::elf::{FileHeader, Sym};
use object::{Endianness, ReadCache};

use crate::proc_maps::MappingKind;
use crate::process_info::ProcessSnapshot;
use crate::runtime_elf::{Segments, dynamic_symbols};

use super::debug_offsets::{self, DebugOffsetsError};
use super::eval_parts;
use super::memory::{MemoryReadError, ProcessMemory};
use super::offsets::{self, VersionOffsets};

/// Most bytes of `.dynsym` plus its string table read per object.
const MAX_DYNSYM_BYTES: u64 = 8 << 20;
/// Most bytes of the eval function's entry scanned for its parts.
const MAX_EVAL_ENTRY_BYTES: u64 = 1 << 20;
/// Most bytes of `.eh_frame_hdr` read per object.
const MAX_EH_FRAME_HDR_BYTES: u64 = 4 << 20;

/// A CPython interpreter found in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Offsets of its version: the agent's table's (3.9-3.12) or those of
    /// the process's own `_Py_DebugOffsets` (3.13+).
    pub offsets: VersionOffsets,
    /// Address of `_PyRuntime`.
    pub runtime: u64,
    /// Where `_PyEval_EvalFrameDefault` lies, with its out-of-line parts
    /// ([`eval_parts`]): native frames here run Python.
    pub eval_frames: Vec<Range<u64>>,
    /// Address of `PyCode_Type`, to tell code objects from anything else.
    pub code_type: u64,
    /// Path of the object it was found in.
    pub object_path: String,
}

/// Why a process that maps CPython cannot be profiled at the Python level.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InterpreterError {
    /// The process maps no CPython object.
    #[error("no CPython object is mapped")]
    NotPython,
    /// A version before 3.9.
    #[error("CPython 3.{minor} is not supported (3.9 and later are)")]
    UnsupportedVersion {
        /// The minor version found.
        minor: u8,
    },
    /// The object lacks a symbol the agent needs.
    #[error("{path} has no dynamic symbol {symbol}")]
    MissingSymbol {
        /// The object.
        path: String,
        /// The symbol.
        symbol: &'static str,
    },
    /// The `_Py_DebugOffsets` table (3.13+) could not be read from the
    /// process's memory.
    #[error("{path}: the _Py_DebugOffsets table at {address:#x} is unreadable: {source}")]
    DebugOffsetsUnreadable {
        /// The object.
        path: String,
        /// Where `_PyRuntime` is in the process.
        address: u64,
        /// The failed read.
        source: MemoryReadError,
    },
    /// The `_Py_DebugOffsets` table is not one this agent can use (forged,
    /// or moved by a release newer than the agent).
    #[error("{path}: CPython's _Py_DebugOffsets table is refused: {source}")]
    BadDebugOffsets {
        /// The object.
        path: String,
        /// What was wrong.
        source: DebugOffsetsError,
    },
    /// The table declares another version than the object's `Py_Version`.
    #[error("{path}: _Py_DebugOffsets says 3.{table} but Py_Version says 3.{object}")]
    VersionMismatch {
        /// The object.
        path: String,
        /// The minor version in the table.
        table: u8,
        /// The minor version in the object's `Py_Version`.
        object: u8,
    },
    /// The ELF file could not be read or is malformed or over the caps.
    #[error("{path}: {what}")]
    BadObject {
        /// The object.
        path: String,
        /// What was wrong.
        what: String,
    },
}

impl InterpreterError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            InterpreterError::NotPython => "not_python",
            InterpreterError::UnsupportedVersion { .. } => "unsupported_version",
            InterpreterError::MissingSymbol { .. } => "missing_symbol",
            InterpreterError::BadObject { .. } => "bad_object",
            InterpreterError::DebugOffsetsUnreadable { .. } => "debug_offsets_unreadable",
            InterpreterError::BadDebugOffsets { .. } => "bad_debug_offsets",
            InterpreterError::VersionMismatch { .. } => "version_mismatch",
        }
    }
}

/// The minor version in a CPython object's file name: `python3.11`,
/// `libpython3.12.so.1.0`, `python3.13t`; `None` for anything else.
pub fn minor_from_file_name(path: &str) -> Option<u8> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let rest = name
        .strip_prefix("libpython3.")
        .or_else(|| name.strip_prefix("python3."))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    let valid_suffix = after.is_empty()
        || after.starts_with(".so")
        || after.starts_with('t')
        || after.starts_with('d')
        || after.starts_with('m');
    if digits.is_empty() || !valid_suffix {
        return None;
    }
    digits.parse().ok()
}

/// Finds the interpreter of `process`, if it maps one.
pub fn find(process: &ProcessSnapshot) -> Result<Interpreter, InterpreterError> {
    let mut candidate = None;
    for (entry, file) in process.maps.iter().zip(&process.files) {
        let MappingKind::File { path, .. } = &entry.kind else {
            continue;
        };
        let Some(minor) = minor_from_file_name(path) else {
            continue;
        };
        let Some(file) = file else {
            continue;
        };
        // A libpython wins over the executable that loads it.
        let is_library = path
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("libpython"));
        if candidate.is_none() || is_library {
            candidate = Some((entry, file, minor));
        }
    }
    let (entry, file, name_minor) = candidate.ok_or(InterpreterError::NotPython)?;
    let symbols = read_symbols(&file.file, &file.path)?;
    // Py_Version (3.11+) is exact where the file name is not (a `python`
    // built in place has no version in its name).
    let minor = symbols.py_version_minor.unwrap_or(name_minor);
    if minor < debug_offsets::FIRST_MINOR && offsets::for_minor(minor).is_none() {
        return Err(InterpreterError::UnsupportedVersion { minor });
    }
    let bias = symbols
        .segments
        .load_bias(entry)
        .ok_or_else(|| bad(&file.path, "no executable segment covers the mapping"))?;
    let missing = |symbol| InterpreterError::MissingSymbol {
        path: file.path.clone(),
        symbol,
    };
    let runtime = symbols.runtime.ok_or_else(|| missing("_PyRuntime"))?;
    let eval = symbols
        .eval_frame
        .clone()
        .ok_or_else(|| missing("_PyEval_EvalFrameDefault"))?;
    let eval_frames = std::iter::once(eval)
        .chain(symbols.eval_parts.iter().cloned())
        .map(|range| range.start.wrapping_add(bias)..range.end.wrapping_add(bias))
        .collect();
    let code_type = symbols.code_type.ok_or_else(|| missing("PyCode_Type"))?;
    let runtime = runtime.wrapping_add(bias);
    let offsets = if minor < debug_offsets::FIRST_MINOR {
        *offsets::for_minor(minor).ok_or(InterpreterError::UnsupportedVersion { minor })?
    } else {
        read_debug_offsets(
            &ProcessMemory::new(process.pid),
            runtime,
            &file.path,
            symbols.py_version_minor,
        )?
    };
    Ok(Interpreter {
        offsets,
        runtime,
        eval_frames,
        code_type: code_type.wrapping_add(bias),
        object_path: file.path.clone(),
    })
}

/// The offsets of the `_Py_DebugOffsets` table at `runtime` in `memory`;
/// `object_minor` is the object's `Py_Version`, which the table must agree
/// with.
pub fn read_debug_offsets(
    memory: &ProcessMemory,
    runtime: u64,
    path: &str,
    object_minor: Option<u8>,
) -> Result<VersionOffsets, InterpreterError> {
    let table = memory
        .read_vec(runtime, debug_offsets::TABLE_BYTES)
        .map_err(|source| InterpreterError::DebugOffsetsUnreadable {
            path: path.to_owned(),
            address: runtime,
            source,
        })?;
    let offsets =
        debug_offsets::parse(&table).map_err(|source| InterpreterError::BadDebugOffsets {
            path: path.to_owned(),
            source,
        })?;
    match object_minor {
        Some(object) if object != offsets.minor => Err(InterpreterError::VersionMismatch {
            path: path.to_owned(),
            table: offsets.minor,
            object,
        }),
        _ => Ok(offsets),
    }
}

fn bad(path: &str, what: impl Into<String>) -> InterpreterError {
    InterpreterError::BadObject {
        path: path.to_owned(),
        what: what.into(),
    }
}

/// What the agent needs from a CPython object, as stated addresses.
#[derive(Debug, Default)]
struct ObjectSymbols {
    runtime: Option<u64>,
    eval_frame: Option<Range<u64>>,
    code_type: Option<u64>,
    py_version_minor: Option<u8>,
    /// Out-of-line parts of `_PyEval_EvalFrameDefault` (stated addresses).
    eval_parts: Vec<Range<u64>>,
    /// Where the file's segments load.
    segments: Segments,
}

fn read_symbols(file: &File, path: &str) -> Result<ObjectSymbols, InterpreterError> {
    let data = ReadCache::new(file);
    let header =
        elf::FileHeader64::<Endianness>::parse(&data).map_err(|e| bad(path, e.to_string()))?;
    let endian = header.endian().map_err(|e| bad(path, e.to_string()))?;
    let mut found = ObjectSymbols {
        segments: Segments::read(header, endian, &data).map_err(|e| bad(path, e))?,
        ..ObjectSymbols::default()
    };
    let sections = header
        .sections(endian, &data)
        .map_err(|e| bad(path, e.to_string()))?;
    let (_, table) = dynamic_symbols(&sections, endian, &data, MAX_DYNSYM_BYTES)
        .map_err(|e| bad(path, e.to_string()))?;
    let strings = table.strings();
    for symbol in table.symbols() {
        let Ok(name) = symbol.name(endian, strings) else {
            continue;
        };
        let value = symbol.st_value(endian);
        match name {
            b"_PyRuntime" => found.runtime = Some(value),
            b"_PyEval_EvalFrameDefault" => {
                found.eval_frame = Some(value..value.saturating_add(symbol.st_size(endian).max(1)));
            }
            b"PyCode_Type" => found.code_type = Some(value),
            b"Py_Version" => {
                found.py_version_minor = read_py_version(file, &found.segments.loads, value)
            }
            _ => {}
        }
    }
    if let (Some(eval), Some(hdr)) = (&found.eval_frame, found.segments.eh_frame_hdr) {
        found.eval_parts =
            read_eval_parts(file, &found.segments.loads, eval, hdr).unwrap_or_default();
    }
    Ok(found)
}

/// The out-of-line parts of the eval function at `eval`, from its code and
/// the `.eh_frame_hdr` search table `hdr` (file offset, size, address);
/// `None` when either is over its cap or unreadable.
fn read_eval_parts(
    file: &File,
    loads: &[(u64, u64, u64)],
    eval: &Range<u64>,
    (hdr_offset, hdr_size, hdr_vaddr): (u64, u64, u64),
) -> Option<Vec<Range<u64>>> {
    let length = eval.end.checked_sub(eval.start)?;
    if length > MAX_EVAL_ENTRY_BYTES || hdr_size > MAX_EH_FRAME_HDR_BYTES {
        return None;
    }
    let &(offset, _, vaddr) = loads
        .iter()
        .find(|(_, size, vaddr)| *vaddr <= eval.start && eval.end <= vaddr.saturating_add(*size))?;
    let mut code = vec![0u8; usize::try_from(length).ok()?];
    file.read_exact_at(&mut code, eval.start - vaddr + offset)
        .ok()?;
    let mut hdr = vec![0u8; usize::try_from(hdr_size).ok()?];
    file.read_exact_at(&mut hdr, hdr_offset).ok()?;
    let starts = eval_parts::function_starts(&hdr, hdr_vaddr)?;
    Some(eval_parts::out_of_line_parts(&code, eval.start, &starts))
}

/// Reads `Py_Version` (`PY_VERSION_HEX`, a constant in the file) and returns
/// its minor version.
fn read_py_version(file: &File, loads: &[(u64, u64, u64)], address: u64) -> Option<u8> {
    let &(offset, _, vaddr) = loads
        .iter()
        .find(|(_, size, vaddr)| *vaddr <= address && address < vaddr.saturating_add(*size))?;
    let mut bytes = [0u8; 4];
    file.read_exact_at(&mut bytes, address - vaddr + offset)
        .ok()?;
    let hex = u32::from_le_bytes(bytes);
    (hex >> 24 == 3).then_some(((hex >> 16) & 0xff) as u8)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn versions_come_from_interpreter_and_library_names_only() {
        assert_eq!(minor_from_file_name("/usr/bin/python3.11"), Some(11));
        assert_eq!(
            minor_from_file_name("/usr/lib/libpython3.12.so.1.0"),
            Some(12)
        );
        assert_eq!(minor_from_file_name("/opt/py/bin/python3.13t"), Some(13));
        assert_eq!(minor_from_file_name("/opt/py/bin/python3.9d"), Some(9));
        assert_eq!(minor_from_file_name("/usr/bin/python3"), None);
        assert_eq!(minor_from_file_name("/usr/bin/python3.11-config"), None);
        assert_eq!(minor_from_file_name("/usr/bin/xz"), None);
        assert_eq!(minor_from_file_name("/x/python3.x"), None);
    }

    #[test]
    fn debian_python_exports_what_the_agent_needs() {
        let path = "/usr/bin/python3.11";
        let Ok(file) = File::open(path) else {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {path} is not installed");
            return;
        };
        let symbols = read_symbols(&file, path).expect("a real CPython ELF");
        assert!(symbols.runtime.is_some());
        assert!(symbols.code_type.is_some());
        let eval = symbols.eval_frame.expect("_PyEval_EvalFrameDefault");
        assert!(eval.end - eval.start > 1000, "a sized function: {eval:?}");
        assert_eq!(symbols.py_version_minor, Some(11));
        assert!(
            symbols.eval_parts.len() <= 1,
            "bookworm's eval loop is one function, give or take a cold part: {:x?}",
            symbols.eval_parts
        );
        assert!(!symbols.segments.executable.is_empty());
    }

    #[test]
    fn a_split_eval_loop_is_found_with_its_cold_part() {
        // Debian forky's 3.13, as `./kiln-dev test` unpacks it: the exported
        // symbol is the entry; the loop runs in a cold part no symbol names.
        let tools =
            std::env::var_os("KILN_TOOLS_DIR").unwrap_or_else(|| "/var/tmp/kiln-tools".into());
        let path = std::path::Path::new(&tools).join("debian-forky-python/usr/bin/python3.13");
        let Ok(file) = File::open(&path) else {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {} is not unpacked",
                path.display()
            );
            return;
        };
        let symbols = read_symbols(&file, &path.to_string_lossy()).expect("a real CPython ELF");
        let eval = symbols.eval_frame.expect("_PyEval_EvalFrameDefault");
        assert!(eval.end - eval.start < 0x1000, "a small entry: {eval:x?}");
        let largest = symbols
            .eval_parts
            .iter()
            .map(|part| part.end - part.start)
            .max()
            .unwrap_or(0);
        assert!(
            largest > 0x10000,
            "the cold part holds the loop: {:x?}",
            symbols.eval_parts
        );
    }

    #[test]
    fn files_that_are_not_elf_are_refused_with_a_reason() {
        let file = File::open("/proc/self/cmdline").expect("readable");
        let error = read_symbols(&file, "/proc/self/cmdline").expect_err("not ELF");
        assert_eq!(error.reason(), "bad_object");
    }
}
