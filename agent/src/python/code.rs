//! Code objects read from a CPython process: qualified name, file name,
//! first line and line table, cached per (process, code object) within a
//! byte budget.
//!
//! A code object lives as long as its function, so its address is a stable
//! key for the life of the process (the same key the BPF side records). The
//! type pointer is checked against `PyCode_Type` before anything else is
//! trusted, and every length read from the process is capped.

use std::collections::HashMap;
use std::sync::Arc;

use super::line_table::{self, LineTableFormat};
use super::memory::{MemoryReadError, ProcessMemory};
use super::offsets::VersionOffsets;

/// Longest name or file name kept, in bytes of the string's data.
const MAX_STRING_BYTES: usize = 1024;
/// Longest line table kept; longer tables give the function's first line.
const MAX_LINE_TABLE_BYTES: usize = 16 << 10;

/// What a code object says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname` (3.11+) or `co_name`.
    pub name: Arc<str>,
    /// `co_filename`.
    pub file: Arc<str>,
    /// `co_firstlineno`.
    pub first_line: i32,
    /// `co_linetable` / `co_lnotab`; empty when over the cap.
    pub line_table: Box<[u8]>,
}

impl CodeInfo {
    fn held_bytes(&self) -> usize {
        self.name.len() + self.file.len() + self.line_table.len() + 96
    }

    /// The line being run at `position` (the raw value BPF recorded), or
    /// the first line when the table does not say.
    pub fn line_at(&self, offsets: &VersionOffsets, code: u64, position: u64) -> u32 {
        let format = LineTableFormat::for_minor(offsets.minor);
        let unit = if offsets.position_is_index() {
            let index = position as u32 as i32;
            if index < 0 {
                None
            } else if offsets.minor <= 9 {
                Some(index as u32 / 2) // f_lasti counts bytes before 3.10
            } else {
                Some(index as u32)
            }
        } else {
            position
                .checked_sub(code.wrapping_add(u64::from(offsets.code_adaptive)))
                .and_then(|bytes| u32::try_from(bytes / 2).ok())
        };
        unit.and_then(|u| line_table::line_of(format, self.first_line, &self.line_table, u))
            .unwrap_or_else(|| u32::try_from(self.first_line).unwrap_or(0))
    }
}

/// Why a code object could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodeReadError {
    /// The memory could not be read (the object is gone, or never was).
    #[error(transparent)]
    Memory(#[from] MemoryReadError),
    /// The address does not hold a code object.
    #[error("{address:#x} is not a code object")]
    NotCode {
        /// The address.
        address: u64,
    },
}

/// Reads the code object at `address`.
pub fn read_code(
    memory: &ProcessMemory,
    offsets: &VersionOffsets,
    code_type: u64,
    address: u64,
) -> Result<CodeInfo, CodeReadError> {
    let fields = [
        offsets.object_type,
        offsets.code_name,
        offsets.code_filename,
        offsets.code_firstlineno,
        offsets.code_linetable,
    ];
    let len = usize::from(fields.iter().copied().max().unwrap_or(0)) + 8;
    let bytes = memory.read_vec(address, len)?;
    let u64_at = |offset: u16| -> u64 {
        let at = usize::from(offset);
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    if u64_at(offsets.object_type) != code_type {
        return Err(CodeReadError::NotCode { address });
    }
    let first_line = u64_at(offsets.code_firstlineno) as u32 as i32;
    let name = read_str(memory, offsets, u64_at(offsets.code_name))?;
    let file = read_str(memory, offsets, u64_at(offsets.code_filename))?;
    let line_table = read_bytes(memory, offsets, u64_at(offsets.code_linetable))?;
    Ok(CodeInfo {
        name,
        file,
        first_line,
        line_table,
    })
}

/// A `str` object's text (compact strings; others read as `?`).
fn read_str(
    memory: &ProcessMemory,
    offsets: &VersionOffsets,
    address: u64,
) -> Result<Arc<str>, MemoryReadError> {
    let header = memory.read_vec(address, usize::from(offsets.unicode_compact_data))?;
    let field = |offset: u16, width: usize| -> u64 {
        let at = usize::from(offset);
        let mut raw = [0u8; 8];
        if let Some(b) = header.get(at..at + width) {
            raw[..width].copy_from_slice(b);
        }
        u64::from_le_bytes(raw)
    };
    let length = field(offsets.unicode_length, 8);
    let state = field(offsets.unicode_state, 4);
    let kind = ((state >> 2) & 7) as usize;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return Ok(Arc::from("?"));
    }
    let data = if ascii {
        offsets.unicode_ascii_data
    } else {
        offsets.unicode_compact_data
    };
    let chars = usize::try_from(length)
        .unwrap_or(usize::MAX)
        .min(MAX_STRING_BYTES / kind);
    let raw = memory.read_vec(address.wrapping_add(u64::from(data)), chars * kind)?;
    let text: String = match kind {
        1 => raw.iter().map(|&b| char::from(b)).collect(),
        2 => raw
            .chunks_exact(2)
            .map(|c| char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))).unwrap_or('?'))
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
    };
    Ok(Arc::from(text))
}

/// A `bytes` object's contents, or nothing when over the cap.
fn read_bytes(
    memory: &ProcessMemory,
    offsets: &VersionOffsets,
    address: u64,
) -> Result<Box<[u8]>, MemoryReadError> {
    let mut size = [0u8; 8];
    memory.read(
        address.wrapping_add(u64::from(offsets.bytes_size)),
        &mut size,
    )?;
    let size = usize::try_from(i64::from_le_bytes(size)).unwrap_or(usize::MAX);
    if size > MAX_LINE_TABLE_BYTES {
        return Ok(Box::default());
    }
    Ok(memory
        .read_vec(address.wrapping_add(u64::from(offsets.bytes_data)), size)?
        .into_boxed_slice())
}

/// Code objects by (pid, process start, address), within a byte budget:
/// two generations, the older dropped when the younger fills half the
/// budget, so recently used objects survive and memory never exceeds it.
#[derive(Debug)]
pub struct CodeCache {
    young: HashMap<(u32, u64, u64), Arc<CodeInfo>>,
    old: HashMap<(u32, u64, u64), Arc<CodeInfo>>,
    young_bytes: usize,
    old_bytes: usize,
    half_budget: usize,
}

impl CodeCache {
    /// A cache holding at most `budget_bytes` of code objects.
    pub fn new(budget_bytes: usize) -> CodeCache {
        CodeCache {
            young: HashMap::new(),
            old: HashMap::new(),
            young_bytes: 0,
            old_bytes: 0,
            half_budget: (budget_bytes / 2).max(1),
        }
    }

    /// The cached object, refreshed.
    pub fn get(&mut self, key: (u32, u64, u64)) -> Option<Arc<CodeInfo>> {
        if let Some(info) = self.young.get(&key) {
            return Some(Arc::clone(info));
        }
        let info = self.old.remove(&key)?;
        self.old_bytes -= info.held_bytes();
        self.insert(key, Arc::clone(&info));
        Some(info)
    }

    /// Caches `info` under `key`.
    pub fn insert(&mut self, key: (u32, u64, u64), info: Arc<CodeInfo>) {
        let bytes = info.held_bytes();
        if self.young_bytes + bytes > self.half_budget {
            self.old = std::mem::take(&mut self.young);
            self.old_bytes = std::mem::replace(&mut self.young_bytes, 0);
        }
        if let Some(previous) = self.young.insert(key, info) {
            self.young_bytes -= previous.held_bytes();
        }
        self.young_bytes += bytes;
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> usize {
        self.young_bytes + self.old_bytes
    }

    /// Drops every entry of a process.
    pub fn forget_process(&mut self, pid: u32, start: u64) {
        for (map, bytes) in [
            (&mut self.young, &mut self.young_bytes),
            (&mut self.old, &mut self.old_bytes),
        ] {
            map.retain(|key, info| {
                let keep = (key.0, key.1) != (pid, start);
                if !keep {
                    *bytes -= info.held_bytes();
                }
                keep
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, table: usize) -> Arc<CodeInfo> {
        Arc::new(CodeInfo {
            name: Arc::from(name),
            file: Arc::from("/app/x.py"),
            first_line: 1,
            line_table: vec![0; table].into_boxed_slice(),
        })
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_recent_entries() {
        let mut cache = CodeCache::new(64 << 10);
        for i in 0..10_000u64 {
            cache.insert((1, 2, i), info("f", 500));
            assert!(cache.held_bytes() <= 64 << 10, "{}", cache.held_bytes());
        }
        assert!(cache.get((1, 2, 9_999)).is_some());
        assert!(cache.get((1, 2, 0)).is_none());
        cache.forget_process(1, 2);
        assert_eq!(cache.held_bytes(), 0);
    }

    #[test]
    fn lines_follow_the_position_kind_of_each_version() {
        use super::super::offsets::for_minor;
        // 3.11 location table: 2 units on line first+1, then 2 on first+3.
        let table = vec![0x80 | (11 << 3) | 1, 0, 0, 0x80 | (12 << 3) | 1, 0, 0];
        let code = CodeInfo {
            name: Arc::from("f"),
            file: Arc::from("f.py"),
            first_line: 10,
            line_table: table.into_boxed_slice(),
        };
        let v311 = for_minor(11).expect("3.11");
        let base = 0x1000 + u64::from(v311.code_adaptive);
        assert_eq!(code.line_at(v311, 0x1000, base), 11);
        assert_eq!(code.line_at(v311, 0x1000, base + 6), 13);
        assert_eq!(
            code.line_at(v311, 0x1000, 0x10),
            10,
            "before the code: first line"
        );
        // 3.9 counts bytes, 3.10 instructions; -1 means not started.
        let lnotab = CodeInfo {
            line_table: vec![4, 1, 4, 1].into_boxed_slice(),
            ..code.clone()
        };
        let v39 = for_minor(9).expect("3.9");
        assert_eq!(lnotab.line_at(v39, 0, 4), 11);
        assert_eq!(lnotab.line_at(v39, 0, u64::from(u32::MAX)), 10);
    }
}
