//! Finding Ruby in a process: the object that defines `ruby_current_ec`
//! (`libruby-X.Y.so`, or a `ruby` linked statically), its version, and how
//! a thread reaches its execution context.
//!
//! Debian's libruby is stripped: only `.dynsym` is read, where
//! `ruby_current_ec` is an `STT_TLS` symbol whose value is its offset in
//! libruby's TLS block. The library is built for the general-dynamic TLS
//! model, so its code finds that block through `__tls_get_addr` with a
//! (module id, offset) pair in its GOT, relocated by `R_X86_64_DTPMOD64`.
//! The agent reads the module id the loader wrote into that GOT slot in the
//! process; the BPF program then follows the thread pointer to the DTV and
//! the DTV to the block. An object that uses static TLS (`TPOFF64`) instead
//! is refused with a reason, not read at a guessed place.
//!
//! Every section read is capped before it is read.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use object::elf;
use object::read::elf::{FileHeader, Rela, SectionHeader, Sym};
use object::{Endianness, ReadCache, SectionIndex};

use crate::abi::RubyProcess;
use crate::proc_maps::MappingKind;
use crate::process_info::ProcessSnapshot;
use crate::python::memory::{MemoryReadError, ProcessMemory};
use crate::runtime_elf::{Segments, dynamic_symbols};

use super::offsets::{self, RubyOffsets};

/// Most bytes of `.dynsym` plus its strings, and of `.rela.dyn`, read.
const MAX_SECTION_BYTES: u64 = 8 << 20;
/// The TLS module ids a loader hands out are small; larger is a forgery.
const MAX_TLS_MODULE: u64 = 1 << 16;

/// A Ruby VM found in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RubyVm {
    /// Offsets of its version.
    pub offsets: RubyOffsets,
    /// `ruby_version`, e.g. `3.1.2`.
    pub version: String,
    /// Where `rb_vm_exec` lies in the process: native frames here run Ruby.
    pub exec_frames: Vec<Range<u64>>,
    /// The BPF map entry.
    pub entry: RubyProcess,
    /// Path of the object it was found in.
    pub object_path: String,
}

/// Why a process that maps Ruby cannot be profiled at the Ruby level.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RubyVmError {
    /// The process maps no Ruby object.
    #[error("no Ruby object is mapped")]
    NotRuby,
    /// A version the offsets table does not know.
    #[error("Ruby {version} is not supported (3.1 is)")]
    UnsupportedVersion {
        /// `ruby_version` as found.
        version: String,
    },
    /// The object lacks a symbol the agent needs.
    #[error("{path} has no dynamic symbol {symbol}")]
    MissingSymbol {
        /// The object.
        path: String,
        /// The symbol.
        symbol: &'static str,
    },
    /// `ruby_current_ec` is not reached through a DTPMOD64 GOT slot.
    #[error("{path}: ruby_current_ec has no DTPMOD64 relocation (static TLS is not supported)")]
    UnsupportedTlsModel {
        /// The object.
        path: String,
    },
    /// The module id could not be read from the process, or is implausible.
    #[error("{path}: libruby's TLS module id at {address:#x} is unreadable or implausible")]
    BadTlsModule {
        /// The object.
        path: String,
        /// The GOT slot in the process.
        address: u64,
        /// The failed read, if the read failed.
        source: Option<MemoryReadError>,
    },
    /// The ELF file could not be read, or is malformed or over the caps.
    #[error("{path}: {what}")]
    BadObject {
        /// The object.
        path: String,
        /// What was wrong.
        what: String,
    },
}

impl RubyVmError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            RubyVmError::NotRuby => "not_ruby",
            RubyVmError::UnsupportedVersion { .. } => "unsupported_version",
            RubyVmError::MissingSymbol { .. } => "missing_symbol",
            RubyVmError::UnsupportedTlsModel { .. } => "unsupported_tls_model",
            RubyVmError::BadTlsModule { .. } => "bad_tls_module",
            RubyVmError::BadObject { .. } => "bad_object",
        }
    }
}

/// Whether a mapped file may hold the Ruby VM: `libruby*.so*` or `ruby*`.
fn may_hold_ruby(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libruby") || name == "ruby" || name.starts_with("ruby3")
}

/// Finds the Ruby VM of `process`, if it maps one.
pub fn find(process: &ProcessSnapshot) -> Result<RubyVm, RubyVmError> {
    let mut candidate = None;
    for (entry, file) in process.maps.iter().zip(&process.files) {
        let MappingKind::File { path, .. } = &entry.kind else {
            continue;
        };
        let (true, Some(file)) = (may_hold_ruby(path), file) else {
            continue;
        };
        let is_library = path
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("libruby"));
        if candidate.is_none() || is_library {
            candidate = Some((entry, file));
        }
    }
    let (entry, file) = candidate.ok_or(RubyVmError::NotRuby)?;
    let path = &file.path;
    let symbols = read_symbols(&file.file, path)?;
    let missing = |symbol| RubyVmError::MissingSymbol {
        path: path.clone(),
        symbol,
    };
    let ec = symbols
        .current_ec
        .ok_or_else(|| missing("ruby_current_ec"))?;
    let version = symbols
        .version
        .clone()
        .ok_or_else(|| missing("ruby_version"))?;
    let offsets = parse_version(&version)
        .and_then(|(major, minor)| offsets::for_version(major, minor))
        .ok_or_else(|| RubyVmError::UnsupportedVersion {
            version: version.clone(),
        })?;
    let exec = symbols
        .vm_exec
        .clone()
        .ok_or_else(|| missing("rb_vm_exec"))?;
    let slot = symbols
        .dtpmod_slot
        .ok_or_else(|| RubyVmError::UnsupportedTlsModel { path: path.clone() })?;
    let bias = symbols
        .segments
        .load_bias(entry)
        .ok_or_else(|| bad(path, "no executable segment covers the mapping"))?;
    let address = slot.wrapping_add(bias);
    let mut bytes = [0u8; 8];
    let module = ProcessMemory::new(process.pid)
        .read(address, &mut bytes)
        .map(|()| u64::from_le_bytes(bytes))
        .map_err(|source| RubyVmError::BadTlsModule {
            path: path.clone(),
            address,
            source: Some(source),
        })?;
    if module == 0 || module > MAX_TLS_MODULE {
        return Err(RubyVmError::BadTlsModule {
            path: path.clone(),
            address,
            source: None,
        });
    }
    Ok(RubyVm {
        offsets: *offsets,
        version,
        exec_frames: std::iter::once(exec.start.wrapping_add(bias)..exec.end.wrapping_add(bias))
            .collect(),
        entry: offsets.kernel_entry(module, ec),
        object_path: path.clone(),
    })
}

/// (major, minor) of a `ruby_version` string such as `3.1.2`.
pub fn parse_version(version: &str) -> Option<(u8, u8)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn bad(path: &str, what: impl Into<String>) -> RubyVmError {
    RubyVmError::BadObject {
        path: path.to_owned(),
        what: what.into(),
    }
}

/// What the agent needs from a Ruby object, as stated addresses.
#[derive(Debug, Default)]
struct ObjectSymbols {
    /// `ruby_current_ec`'s offset in the module's TLS block.
    current_ec: Option<u64>,
    /// The GOT slot the loader fills with the module id.
    dtpmod_slot: Option<u64>,
    vm_exec: Option<Range<u64>>,
    version: Option<String>,
    /// Where the file's segments load.
    segments: Segments,
}

fn read_symbols(file: &File, path: &str) -> Result<ObjectSymbols, RubyVmError> {
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
    let (SectionIndex(index), table) = dynamic_symbols(&sections, endian, &data, MAX_SECTION_BYTES)
        .map_err(|e| bad(path, e.to_string()))?;
    let mut ec_index = None;
    for (i, symbol) in table.symbols().iter().enumerate() {
        let Ok(name) = symbol.name(endian, table.strings()) else {
            continue;
        };
        let value = symbol.st_value(endian);
        match name {
            b"ruby_current_ec" if symbol.st_type() == elf::STT_TLS => {
                found.current_ec = Some(value);
                ec_index = Some(i);
            }
            b"rb_vm_exec" => {
                found.vm_exec = Some(value..value.saturating_add(symbol.st_size(endian).max(1)));
            }
            b"ruby_version" => found.version = read_c_string(file, &found.segments.loads, value),
            _ => {}
        }
    }
    let Some(ec_index) = ec_index else {
        return Ok(found);
    };
    for section in sections.iter() {
        if section.sh_type(endian) != elf::SHT_RELA || section.sh_link(endian) as usize != index {
            continue;
        }
        if section.sh_size(endian) > MAX_SECTION_BYTES {
            return Err(bad(path, "a dynamic relocation section is over the cap"));
        }
        let Ok(Some((relocations, _))) = section.rela(endian, &data) else {
            continue;
        };
        if let Some(rela) = relocations.iter().find(|r| {
            r.r_type(endian, false) == elf::R_X86_64_DTPMOD64
                && r.r_sym(endian, false) as usize == ec_index
        }) {
            found.dtpmod_slot = Some(rela.r_offset(endian));
        }
    }
    Ok(found)
}

/// A short NUL-terminated string at stated address `address` in the file.
fn read_c_string(file: &File, loads: &[(u64, u64, u64)], address: u64) -> Option<String> {
    let &(offset, size, vaddr) = loads
        .iter()
        .find(|(_, size, vaddr)| *vaddr <= address && address < vaddr.saturating_add(*size))?;
    let available = (vaddr + size - address).min(32);
    let mut bytes = vec![0u8; usize::try_from(available).ok()?];
    file.read_exact_at(&mut bytes, address - vaddr + offset)
        .ok()?;
    let end = bytes.iter().position(|&b| b == 0)?;
    String::from_utf8(bytes[..end].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn versions_parse_and_names_are_recognised() {
        assert_eq!(parse_version("3.1.2"), Some((3, 1)));
        assert_eq!(parse_version("3"), None);
        assert!(may_hold_ruby(
            "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"
        ));
        assert!(may_hold_ruby("/usr/bin/ruby3.1"));
        assert!(!may_hold_ruby("/usr/bin/python3.11"));
    }

    #[test]
    fn debian_libruby_exports_what_the_agent_needs() {
        let path = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1";
        let Ok(file) = File::open(path) else {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {path} is not installed");
            return;
        };
        let symbols = read_symbols(&file, path).expect("a real libruby");
        assert!(symbols.current_ec.is_some(), "ruby_current_ec in .dynsym");
        assert!(symbols.dtpmod_slot.is_some(), "general-dynamic TLS");
        assert_eq!(
            symbols.version.as_deref().and_then(parse_version),
            Some((3, 1))
        );
        assert!(symbols.vm_exec.is_some());
    }
}
