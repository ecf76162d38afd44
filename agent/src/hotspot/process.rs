//! Finding HotSpot in a process: the mapped `libjvm.so`, the addresses of
//! its exported table symbols in that process, and from the tables the
//! layout and code heaps the unwinder reads.

use std::fs::File;

use object::elf;
use object::read::elf::{FileHeader, Sym};
use object::{Endianness, ReadCache};

use crate::proc_maps::{MapEntry, MappingKind};
use crate::process_info::ProcessSnapshot;
use crate::python::memory::ProcessMemory;
use crate::runtime_elf::{Segments, dynamic_symbols};

use super::code_cache::{self, CodeHeap};
use super::layout::{JvmLayout, WANTED_TYPES};
use super::vmstructs::{self, ExportedSymbols, VmStructsError};

/// Most bytes of `.dynsym` plus its strings read (libjvm's: 20 KiB).
const MAX_DYNSYM_BYTES: u64 = 8 << 20;

/// Why a process is profiled without Java frames.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JvmError {
    /// The process maps no `libjvm.so`.
    #[error("no libjvm.so is mapped")]
    NotJvm,
    /// `libjvm.so` could not be read, or is malformed or over the caps.
    #[error("{path}: {what}")]
    BadObject { path: String, what: String },
    /// `libjvm.so` lacks one of the table symbols.
    #[error("{path} exports no {symbol}")]
    MissingSymbol { path: String, symbol: &'static str },
    /// The tables or the code cache could not be read or were refused.
    #[error("{path}: {source}")]
    Tables {
        path: String,
        source: VmStructsError,
    },
}

impl JvmError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            JvmError::NotJvm => "not_jvm",
            JvmError::BadObject { .. } => "bad_object",
            JvmError::MissingSymbol { .. } => "missing_symbol",
            JvmError::Tables { source, .. } => source.reason(),
        }
    }
}

/// A JVM found in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundJvm {
    pub layout: JvmLayout,
    pub heaps: Vec<CodeHeap>,
    /// `[CodeCache::_low_bound, _high_bound)`: every heap lies inside.
    pub code_cache: std::ops::Range<u64>,
    /// Path of the `libjvm.so`.
    pub path: String,
}

/// Whether the process maps a `libjvm.so`.
pub fn maps_libjvm(process: &ProcessSnapshot) -> bool {
    libjvm(process).is_some()
}

fn libjvm(process: &ProcessSnapshot) -> Option<(&MapEntry, &File, &str)> {
    process
        .maps
        .iter()
        .zip(&process.files)
        .find_map(|(entry, file)| {
            let MappingKind::File { path, .. } = &entry.kind else {
                return None;
            };
            if path.rsplit('/').next() != Some("libjvm.so") {
                return None;
            }
            Some((entry, &file.as_ref()?.file, path.as_str()))
        })
}

/// Finds HotSpot in `process` and reads its tables and code heaps.
pub fn find(process: &ProcessSnapshot) -> Result<FoundJvm, JvmError> {
    let (entry, file, path) = libjvm(process).ok_or(JvmError::NotJvm)?;
    let bad = |what: String| JvmError::BadObject {
        path: path.to_owned(),
        what,
    };
    let tables_error = |source| JvmError::Tables {
        path: path.to_owned(),
        source,
    };
    let symbols = read_exported_symbols(file, entry).map_err(bad)?;
    if let Some(symbol) = symbols.first_missing() {
        return Err(JvmError::MissingSymbol {
            path: path.to_owned(),
            symbol,
        });
    }
    let memory = ProcessMemory::new(process.pid);
    let tables = vmstructs::read(&memory, &symbols, WANTED_TYPES).map_err(tables_error)?;
    let layout = JvmLayout::from_vmstructs(&tables).map_err(tables_error)?;
    let heaps = code_cache::read_heaps(&memory, &layout).map_err(tables_error)?;
    let low =
        vmstructs::read_u64(&memory, layout.code_low_bound).map_err(|e| tables_error(e.into()))?;
    let high =
        vmstructs::read_u64(&memory, layout.code_high_bound).map_err(|e| tables_error(e.into()))?;
    if low >= high || heaps.iter().any(|h| h.low < low || h.high > high) {
        return Err(tables_error(VmStructsError::BadLayout {
            table: "code cache",
            what: format!("bounds {low:#x}..{high:#x} do not hold its heaps"),
        }));
    }
    Ok(FoundJvm {
        layout,
        heaps,
        code_cache: low..high,
        path: path.to_owned(),
    })
}

/// The table symbols' addresses in the process that maps `file`'s
/// executable segment at `entry`.
fn read_exported_symbols(file: &File, entry: &MapEntry) -> Result<ExportedSymbols, String> {
    let data = ReadCache::new(file);
    let header = elf::FileHeader64::<Endianness>::parse(&data).map_err(|e| e.to_string())?;
    let endian = header.endian().map_err(|e| e.to_string())?;
    let bias = Segments::read(header, endian, &data)?
        .load_bias(entry)
        .ok_or("no executable segment covers the mapping")?;
    let sections = header.sections(endian, &data).map_err(|e| e.to_string())?;
    let (_, table) =
        dynamic_symbols(&sections, endian, &data, MAX_DYNSYM_BYTES).map_err(|e| e.to_string())?;
    let mut symbols = ExportedSymbols::default();
    for symbol in table.symbols() {
        if symbol.st_value(endian) == 0 {
            continue;
        }
        if let Ok(name) = symbol.name(endian, table.strings()) {
            symbols.set(name, symbol.st_value(endian).wrapping_add(bias));
        }
    }
    Ok(symbols)
}
