//! Go's function table, `.gopclntab` (pure).
//!
//! Every Go binary keeps it, stripped or not, because Go's own runtime
//! walks stacks and names functions with it. `-ldflags='-s -w'` (the
//! default of many images' builds) removes `.symtab` and `.debug_frame`,
//! which leaves this table as the only source of names, and of where a
//! frame's return address is: a Go leaf function that needs no stack frame
//! keeps no frame pointer, so a frame-pointer walk skips its caller.
//!
//! Read here, for the layouts of Go 1.16 to today (the header's magic
//! names the layout):
//! - the functions: entry address, end and name, for the symbol index;
//! - each function's stack-pointer table (`pcsp`): how far below the
//!   caller's stack pointer the function's own is at each pc, which gives
//!   every Go frame's return address without CFI or frame pointers;
//! - which functions are the roots of their stacks (`TOPFRAME`).
//!
//! Everything is bounds-checked against the section's bytes, every count
//! against what those bytes can hold, and the pc tables' varints against
//! overflow: the section comes from a container's file.

use std::ops::Range;

mod function_index;
mod source;
#[cfg(test)]
mod tests;

pub use function_index::{GoFrameRule, GoFunctionAt, GoFunctionIndex, GoFunctionRules};
pub use source::{MAX_READ, PclntabSource, WindowedSection};
use source::{u8_at, u32_at, u64_at};

/// Why a `.gopclntab` was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoPclntabError {
    /// The magic is not one of the layouts read here (before Go 1.16, or
    /// not a function table at all).
    #[error("unknown .gopclntab magic {magic:#x}")]
    UnknownMagic {
        /// The first four bytes.
        magic: u32,
    },
    /// A field points outside the section, or a count is more than the
    /// section can hold.
    #[error("malformed .gopclntab: {what}")]
    Malformed {
        /// What was wrong.
        what: &'static str,
    },
}

/// The header layouts, by the Go release that introduced them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PclntabLayout {
    /// Go 1.16 and 1.17: absolute entry addresses.
    Go116,
    /// Go 1.18 and 1.19: entries relative to the text start.
    Go118,
    /// Go 1.20 and later: as 1.18, with each function's start line.
    Go120,
}

/// One function of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFunction {
    /// Entry address (stated, as in the ELF file).
    pub entry: u64,
    /// The next function's entry: where this one ends.
    pub end: u64,
    /// Offset of the name in the name table (see [`Pclntab::names`]).
    pub name: u32,
    /// Offset of its stack-pointer table in the pc tables.
    pub pcsp: u32,
    /// Whether Go marks it as the root of its stack (`runtime.goexit`,
    /// `runtime.mstart`, `runtime.rt0_go`).
    pub top_frame: bool,
}

/// A parsed header, with the function table's place in the section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pclntab {
    /// Which layout.
    pub layout: PclntabLayout,
    /// The pc quantum (1 on x86-64).
    quantum: u8,
    /// Functions in the table.
    functions: usize,
    /// Where `entry` offsets count from (1.18 and later).
    text_start: u64,
    /// Offsets in the section.
    names: Range<usize>,
    pc_tables: usize,
    function_table: usize,
}

/// `_func.flag`'s bit for a stack's root.
const FUNC_FLAG_TOPFRAME: u8 = 1;

/// Steps decoded from one function's pc table at most: a stack-pointer
/// table has a few (prologue, epilogue, calls that grow the stack); a
/// forged one stops here.
const MAX_STEPS_PER_TABLE: usize = 4096;

impl Pclntab {
    /// Parses the header of a `.gopclntab` section; `text_section` is the
    /// `.text` section's address, used where the header's text start is 0
    /// (position-independent binaries leave it to a relocation).
    pub fn parse(
        source: &mut impl PclntabSource,
        text_section: u64,
    ) -> Result<Pclntab, GoPclntabError> {
        let malformed = |what| GoPclntabError::Malformed { what };
        let section_len = source.section_len();
        let magic = u32_at(source, 0).ok_or(malformed("header"))?;
        let layout = match magic {
            0xffff_fffa => PclntabLayout::Go116,
            0xffff_fff0 => PclntabLayout::Go118,
            0xffff_fff1 => PclntabLayout::Go120,
            magic => return Err(GoPclntabError::UnknownMagic { magic }),
        };
        let quantum = u8_at(source, 6).ok_or(malformed("header"))?;
        let pointer_size = u8_at(source, 7).ok_or(malformed("header"))?;
        if pointer_size != 8 || !matches!(quantum, 1 | 2 | 4) {
            return Err(malformed("pointer size or pc quantum"));
        }
        let mut words = [0u64; 8];
        for (index, word) in words.iter_mut().enumerate() {
            // 1.16's header has seven words; the eighth is then the
            // function table's first entry, never used as a header word.
            *word = u64_at(source, 8 + index * 8).ok_or(malformed("header"))?;
        }
        let offset = |index: usize| -> Result<usize, GoPclntabError> {
            usize::try_from(words[index])
                .ok()
                .filter(|&at| at <= section_len)
                .ok_or(malformed("an offset past the section"))
        };
        let functions = usize::try_from(words[0]).map_err(|_| malformed("function count"))?;
        // Word 1 is the file count; 1.18 added the text start as word 2.
        let (text_start, first_offset) = match layout {
            PclntabLayout::Go116 => (0, 2),
            PclntabLayout::Go118 | PclntabLayout::Go120 => match words[2] {
                0 => (text_section, 3),
                start => (start, 3),
            },
        };
        let names_start = offset(first_offset)?;
        let names_end = offset(first_offset + 1)?; // the compilation units follow
        let pc_tables = offset(first_offset + 3)?;
        let function_table = offset(first_offset + 4)?;
        if names_start > names_end {
            return Err(malformed("name table bounds"));
        }
        let table = Pclntab {
            layout,
            quantum,
            functions,
            text_start,
            names: names_start..names_end,
            pc_tables,
            function_table,
        };
        // The table holds one more entry than functions (the last end).
        let entries_bytes = functions
            .checked_add(1)
            .and_then(|n| n.checked_mul(table.entry_size()))
            .and_then(|n| n.checked_add(function_table))
            .ok_or(malformed("function count"))?;
        if entries_bytes > section_len {
            return Err(malformed("function count"));
        }
        Ok(table)
    }

    /// Functions in the table.
    pub fn function_count(&self) -> usize {
        self.functions
    }

    /// Where the name table lies in the section: names are NUL-terminated.
    pub fn names(&self) -> Range<usize> {
        self.names.clone()
    }

    fn entry_size(&self) -> usize {
        match self.layout {
            PclntabLayout::Go116 => 16,
            PclntabLayout::Go118 | PclntabLayout::Go120 => 8,
        }
    }

    /// The entry address and `_func` offset of table entry `index`.
    fn entry(&self, source: &mut impl PclntabSource, index: usize) -> Option<(u64, usize)> {
        let at = self.function_table + index * self.entry_size();
        match self.layout {
            PclntabLayout::Go116 => Some((
                u64_at(source, at)?,
                usize::try_from(u64_at(source, at + 8)?).ok()?,
            )),
            PclntabLayout::Go118 | PclntabLayout::Go120 => Some((
                self.text_start
                    .checked_add(u64::from(u32_at(source, at)?))?,
                usize::try_from(u32_at(source, at + 4)?).ok()?,
            )),
        }
    }

    /// A record's name offset, stack-pointer table offset and root flag;
    /// `record` counts from the function table, as its entries do.
    fn record_fields(
        &self,
        source: &mut impl PclntabSource,
        record: usize,
    ) -> Option<(u32, u32, bool)> {
        let record = self.function_table.checked_add(record)?;
        // _func: the entry (a word in 1.16, 4 bytes later), then nameOff,
        // args, deferreturn, pcsp; funcID and flag after cuOffset (and
        // 1.20's startLine).
        let (fields, flag_at) = match self.layout {
            PclntabLayout::Go116 => (record + 8, record + 41),
            PclntabLayout::Go118 => (record + 4, record + 37),
            PclntabLayout::Go120 => (record + 4, record + 41),
        };
        let name = u32_at(source, fields)?;
        let pcsp = u32_at(source, fields + 12)?;
        let flag = u8_at(source, flag_at)?;
        Some((name, pcsp, flag & FUNC_FLAG_TOPFRAME != 0))
    }

    /// Function `index`; `None` when its record is out of bounds or its
    /// entries are out of order.
    pub fn function(&self, source: &mut impl PclntabSource, index: usize) -> Option<GoFunction> {
        if index >= self.functions {
            return None;
        }
        let (entry, record) = self.entry(source, index)?;
        let (end, _) = self.entry(source, index + 1)?;
        if end <= entry {
            return None;
        }
        let (name, pcsp, top_frame) = self.record_fields(source, record)?;
        Some(GoFunction {
            entry,
            end,
            name,
            pcsp,
            top_frame,
        })
    }

    /// Calls `each` with the source and every function, in address order;
    /// malformed records are left out.
    pub fn each_function<S: PclntabSource>(
        &self,
        source: &mut S,
        mut each: impl FnMut(&mut S, GoFunction),
    ) {
        for index in 0..self.functions {
            if let Some(function) = self.function(source, index) {
                each(source, function);
            }
        }
    }

    /// The steps of `function`'s stack-pointer table: from each pc to the
    /// next, how many bytes the function's stack pointer is below the one
    /// it was entered with. Ends at the function's end, at a malformed
    /// varint, or after [`MAX_STEPS_PER_TABLE`] steps.
    pub fn sp_steps(
        &self,
        source: &mut impl PclntabSource,
        function: &GoFunction,
    ) -> Vec<(Range<u64>, i32)> {
        let Some(mut at) = self.pc_tables.checked_add(function.pcsp as usize) else {
            return Vec::new();
        };
        let mut steps = Vec::new();
        let (mut pc, mut value) = (function.entry, -1i64);
        while steps.len() < MAX_STEPS_PER_TABLE && pc < function.end {
            let Some((delta, used)) = uvarint_at(source, at) else {
                break;
            };
            // A zero value delta ends the table, except as the first step.
            if delta == 0 && !steps.is_empty() {
                break;
            }
            let Some((pc_delta, used_too)) = uvarint_at(source, at + used) else {
                break;
            };
            at += used + used_too;
            // Zig-zag: the low bit is the sign.
            let delta = if delta & 1 != 0 {
                !(delta >> 1) as i64
            } else {
                (delta >> 1) as i64
            };
            value = value.saturating_add(delta);
            let next = pc_delta
                .checked_mul(u64::from(self.quantum))
                .and_then(|d| pc.checked_add(d))
                .map_or(function.end, |next| next.min(function.end));
            let (Ok(sp), true) = (i32::try_from(value), next > pc) else {
                break;
            };
            steps.push((pc..next, sp));
            pc = next;
        }
        steps
    }
}

/// The varint at `at` and the bytes it took.
fn uvarint_at(source: &mut impl PclntabSource, at: usize) -> Option<(u64, usize)> {
    let len = source.section_len().checked_sub(at)?.min(5);
    let bytes = source.bytes(at, len)?;
    let (value, rest) = uvarint(bytes)?;
    Some((value, len - rest.len()))
}

/// A little-endian base-128 varint of at most 32 bits (Go's pc tables
/// write `uint32`s), and what follows it.
fn uvarint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(5) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[index + 1..]));
        }
    }
    None
}
