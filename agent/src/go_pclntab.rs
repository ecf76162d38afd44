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

/// The bytes of a `.gopclntab`: the whole section in memory, or a file's
/// section read a window at a time ([`WindowedSection`]). A large Go
/// binary's table is tens of MB (kube-apiserver's: 62 MB), and most of it
/// is line tables this module never reads.
pub trait PclntabSource {
    /// The section's length.
    fn section_len(&self) -> usize;
    /// `len` bytes at `offset`: `None` past the end or when reading fails.
    /// `len` is at most [`MAX_READ`].
    fn bytes(&mut self, offset: usize, len: usize) -> Option<&[u8]>;
}

/// The most bytes [`PclntabSource::bytes`] is asked for at once.
pub const MAX_READ: usize = 64;

impl PclntabSource for &[u8] {
    fn section_len(&self) -> usize {
        self.len()
    }

    fn bytes(&mut self, offset: usize, len: usize) -> Option<&[u8]> {
        self.get(offset..offset.checked_add(len)?)
    }
}

/// Bytes per window, and windows kept: the function table and records are
/// read in order, the pc tables mostly in order with a few shared tables
/// read again and again.
const WINDOW_BYTES: usize = 64 * 1024;
const WINDOWS: usize = 4;

/// A file's section read through `read_at(file offset, buffer)` a window
/// at a time, the least recently used window replaced: 256 KiB at most,
/// whatever the section's size.
pub struct WindowedSection<R: FnMut(u64, &mut [u8]) -> bool> {
    read_at: R,
    section_offset: u64,
    section_len: usize,
    window_bytes: usize,
    /// (start in the section, bytes, last use)
    windows: Vec<(usize, Vec<u8>, u64)>,
    clock: u64,
    reads: u64,
}

impl<R: FnMut(u64, &mut [u8]) -> bool> std::fmt::Debug for WindowedSection<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedSection")
            .field("section_offset", &self.section_offset)
            .field("section_len", &self.section_len)
            .field("windows", &self.windows.len())
            .field("reads", &self.reads)
            .finish_non_exhaustive()
    }
}

impl<R: FnMut(u64, &mut [u8]) -> bool> WindowedSection<R> {
    /// The section at `section_offset` of `section_len` bytes, read
    /// 64 KiB at a time (to read it through).
    pub fn new(read_at: R, section_offset: u64, section_len: usize) -> Self {
        Self::with_window(read_at, section_offset, section_len, WINDOW_BYTES)
    }

    /// The same, read `window_bytes` at a time (at least [`MAX_READ`]; to
    /// look up one function: a record and a table, a few dozen bytes each).
    pub fn with_window(
        read_at: R,
        section_offset: u64,
        section_len: usize,
        window_bytes: usize,
    ) -> Self {
        WindowedSection {
            read_at,
            section_offset,
            section_len,
            window_bytes: window_bytes.max(MAX_READ),
            windows: Vec::with_capacity(WINDOWS),
            clock: 0,
            reads: 0,
        }
    }

    /// Windows read so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }
}

impl<R: FnMut(u64, &mut [u8]) -> bool> PclntabSource for WindowedSection<R> {
    fn section_len(&self) -> usize {
        self.section_len
    }

    fn bytes(&mut self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.section_len || len > MAX_READ {
            return None;
        }
        self.clock += 1;
        let clock = self.clock;
        let found = self
            .windows
            .iter()
            .position(|(start, bytes, _)| *start <= offset && end <= start + bytes.len());
        let index = match found {
            Some(index) => index,
            None => {
                // From the page holding `offset`, so that a read just behind
                // the last one still falls in the window.
                let mut start = offset - offset % self.window_bytes.min(4096);
                if end > start + self.window_bytes {
                    start = offset;
                }
                let size = self.window_bytes.min(self.section_len - start);
                let mut bytes = vec![0; size];
                let at = self.section_offset.checked_add(start as u64)?;
                if !(self.read_at)(at, &mut bytes) {
                    return None;
                }
                self.reads += 1;
                if self.windows.len() < WINDOWS {
                    self.windows.push((start, bytes, clock));
                    self.windows.len() - 1
                } else {
                    let oldest = self
                        .windows
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, (_, _, used))| *used)
                        .map_or(0, |(index, _)| index);
                    self.windows[oldest] = (start, bytes, clock);
                    oldest
                }
            }
        };
        let (start, bytes, used) = &mut self.windows[index];
        *used = clock;
        bytes.get(offset - *start..end - *start)
    }
}

fn u8_at(source: &mut impl PclntabSource, at: usize) -> Option<u8> {
    Some(source.bytes(at, 1)?[0])
}

fn u32_at(source: &mut impl PclntabSource, at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(source.bytes(at, 4)?.try_into().ok()?))
}

fn u64_at(source: &mut impl PclntabSource, at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(source.bytes(at, 8)?.try_into().ok()?))
}

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

/// What [`GoFunctionRules::rule_at`] says of a pc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoFrameRule {
    /// The stack pointer is this many bytes below the one the function was
    /// entered with, where its return address lies.
    StackPointerBelowEntry(u32),
    /// The function is its stack's root: there is no caller.
    Root,
}

/// A Go binary's functions by address, from the function table alone (8
/// bytes a function: kube-apiserver's 138,620 take 1.1 MB); a function's
/// stack-pointer table is read only when a pc first lands in it
/// ([`GoFunctionIndex::rules`]), since most functions are never sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFunctionIndex {
    header: Pclntab,
    /// Stated address the starts count from.
    base: u64,
    /// (start from `base`, record offset from the function table), sorted.
    functions: Box<[(u32, u32)]>,
    /// Where the last function ends, from `base`.
    end: u32,
}

/// Where a pc's function is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFunctionAt {
    /// Its position in the table (the key of its rules).
    pub index: u32,
    /// Its entry and end (stated addresses).
    pub entry: u64,
    pub end: u64,
}

/// One function's rules: the steps of its stack-pointer table as (offset
/// from its entry, bytes below the entry stack pointer), or root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoFunctionRules {
    /// `runtime.goexit` and the other roots.
    Root,
    /// Steps in order; none where its table was missing or malformed.
    Steps(Box<[(u32, u32)]>),
}

impl GoFunctionRules {
    /// The rule at `offset` bytes into the function.
    pub fn rule_at(&self, offset: u64) -> Option<GoFrameRule> {
        match self {
            GoFunctionRules::Root => Some(GoFrameRule::Root),
            GoFunctionRules::Steps(steps) => {
                let offset = u32::try_from(offset).ok()?;
                let after = steps.partition_point(|&(start, _)| start <= offset);
                let (_, below) = steps[after.checked_sub(1)?];
                Some(GoFrameRule::StackPointerBelowEntry(below))
            }
        }
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> u64 {
        match self {
            GoFunctionRules::Root => 0,
            GoFunctionRules::Steps(steps) => (steps.len() * size_of::<(u32, u32)>()) as u64,
        }
    }
}

impl GoFunctionIndex {
    /// Reads the function table of `pclntab` (entries only, in order),
    /// starts counted from `base` (the binary's lowest load address);
    /// `None` when it is empty, unsorted or out of reach of 32-bit offsets.
    pub fn build(
        pclntab: &Pclntab,
        source: &mut impl PclntabSource,
        base: u64,
    ) -> Option<GoFunctionIndex> {
        let relative = |address: u64| u32::try_from(address.checked_sub(base)?).ok();
        let mut functions: Vec<(u32, u32)> =
            Vec::with_capacity(pclntab.function_count().min(1 << 16));
        for index in 0..pclntab.function_count() {
            let (entry, record) = pclntab.entry(source, index)?;
            let start = relative(entry)?;
            // Overlapping or unsorted functions would break the search.
            if functions.last().is_some_and(|&(last, _)| last >= start) {
                return None;
            }
            functions.push((start, u32::try_from(record).ok()?));
        }
        let (end, _) = pclntab.entry(source, pclntab.function_count())?;
        let end = relative(end)?;
        if functions.last().is_none_or(|&(last, _)| last >= end) {
            return None;
        }
        Some(GoFunctionIndex {
            header: pclntab.clone(),
            base,
            functions: functions.into_boxed_slice(),
            end,
        })
    }

    /// The function holding stated address `pc`.
    pub fn function_at(&self, pc: u64) -> Option<GoFunctionAt> {
        let relative = u32::try_from(pc.checked_sub(self.base)?).ok()?;
        if relative >= self.end {
            return None;
        }
        let after = self
            .functions
            .partition_point(|&(start, _)| start <= relative);
        let index = after.checked_sub(1)?;
        let (start, _) = self.functions[index];
        let end = self
            .functions
            .get(after)
            .map_or(self.end, |&(next, _)| next);
        Some(GoFunctionAt {
            index: u32::try_from(index).ok()?,
            entry: self.base + u64::from(start),
            end: self.base + u64::from(end),
        })
    }

    /// The rules of the function `at`, read from `source` (its record and
    /// its stack-pointer table: a few dozen bytes).
    pub fn rules(&self, source: &mut impl PclntabSource, at: &GoFunctionAt) -> GoFunctionRules {
        let no_rules = GoFunctionRules::Steps(Box::default());
        let Some(&(_, record)) = self.functions.get(at.index as usize) else {
            return no_rules;
        };
        let Some((_, pcsp, top_frame)) = self.header.record_fields(source, record as usize) else {
            return no_rules;
        };
        if top_frame {
            return GoFunctionRules::Root;
        }
        let function = GoFunction {
            entry: at.entry,
            end: at.end,
            name: 0,
            pcsp,
            top_frame,
        };
        let steps = self
            .header
            .sp_steps(source, &function)
            .into_iter()
            // A negative offset is no frame Go writes: the table ends there.
            .map_while(|(range, sp)| {
                Some((
                    u32::try_from(range.start - at.entry).ok()?,
                    u32::try_from(sp).ok()?,
                ))
            })
            .collect();
        GoFunctionRules::Steps(steps)
    }

    /// Bytes the index holds.
    pub fn held_bytes(&self) -> u64 {
        (self.functions.len() * size_of::<(u32, u32)>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn functions(table: &Pclntab, mut section: &[u8]) -> Vec<GoFunction> {
        let mut all = Vec::new();
        table.each_function(&mut section, |_, function| all.push(function));
        all
    }

    /// A table of two functions at 0x401000 and 0x401040 (the first a
    /// root), ending at 0x401080, in `layout`, as Go's linker lays it out.
    fn table(layout: PclntabLayout) -> Vec<u8> {
        let mut section = vec![0u8; 0x200];
        let magic: u32 = match layout {
            PclntabLayout::Go116 => 0xffff_fffa,
            PclntabLayout::Go118 => 0xffff_fff0,
            PclntabLayout::Go120 => 0xffff_fff1,
        };
        section[..4].copy_from_slice(&magic.to_le_bytes());
        section[6] = 1; // quantum
        section[7] = 8; // pointer size
        // nfunc, nfiles, [textStart,] funcname, cu, filetab, pctab, pcln
        let words: Vec<u64> = match layout {
            PclntabLayout::Go116 => vec![2, 0, 0x60, 0x70, 0x70, 0x80, 0x100],
            _ => vec![2, 0, 0x401000, 0x60, 0x70, 0x70, 0x80, 0x100],
        };
        for (i, word) in words.iter().enumerate() {
            section[8 + i * 8..16 + i * 8].copy_from_slice(&word.to_le_bytes());
        }
        section[0x60..0x6a].copy_from_slice(b"main.root\0");
        section[0x6a..0x70].copy_from_slice(b"main.\0");
        // pcsp of the second function: 0 for 4 bytes, 24 for 0x38, 0 to the end.
        // Value deltas are zig-zag: +1 from -1 is 2, +24 is 48, -24 is 47.
        section[0x80..0x86].copy_from_slice(&[2, 4, 48, 0x38, 47, 4]);
        // The function table, (entry, funcoff) x 3, then the _func records
        // at 0x140 and 0x170 (offsets from the table): the name offset, the
        // pcsp offset (0 for both) and the flag where the layout puts them.
        let entries = [(0x401000u64, 0x40u64), (0x401040, 0x70), (0x401080, 0)];
        let (fields, flag) = match layout {
            PclntabLayout::Go116 => {
                for (i, (entry, func)) in entries.iter().enumerate() {
                    section[0x100 + i * 16..0x108 + i * 16].copy_from_slice(&entry.to_le_bytes());
                    section[0x108 + i * 16..0x110 + i * 16].copy_from_slice(&func.to_le_bytes());
                }
                (8, 41)
            }
            PclntabLayout::Go118 | PclntabLayout::Go120 => {
                for (i, (entry, func)) in entries.iter().enumerate() {
                    let entry = (entry - 0x401000) as u32;
                    let func = *func as u32;
                    section[0x100 + i * 8..0x104 + i * 8].copy_from_slice(&entry.to_le_bytes());
                    section[0x104 + i * 8..0x108 + i * 8].copy_from_slice(&func.to_le_bytes());
                }
                (
                    4,
                    if layout == PclntabLayout::Go118 {
                        37
                    } else {
                        41
                    },
                )
            }
        };
        section[0x140 + fields..0x144 + fields].copy_from_slice(&0u32.to_le_bytes());
        section[0x140 + flag] = FUNC_FLAG_TOPFRAME;
        section[0x170 + fields..0x174 + fields].copy_from_slice(&5u32.to_le_bytes());
        section
    }

    fn table_120() -> Vec<u8> {
        table(PclntabLayout::Go120)
    }

    #[test]
    fn the_go_116_and_118_layouts_read_as_the_120_one() {
        for layout in [PclntabLayout::Go116, PclntabLayout::Go118] {
            let section = table(layout);
            let table = Pclntab::parse(&mut section.as_slice(), 0).expect("parsed");
            assert_eq!(table.layout, layout);
            let reference = table_120();
            let expected = functions(
                &Pclntab::parse(&mut reference.as_slice(), 0).expect("parsed"),
                &reference,
            );
            let functions: Vec<GoFunction> = functions(&table, &section);
            assert_eq!(functions, expected, "{layout:?}");
            assert_eq!(
                table.sp_steps(&mut section.as_slice(), &functions[1]).len(),
                3
            );
        }
    }

    #[test]
    fn a_go_120_table_gives_each_function_its_range_name_and_root_flag() {
        let section = table_120();
        let table = Pclntab::parse(&mut section.as_slice(), 0).expect("parsed");
        assert_eq!(table.layout, PclntabLayout::Go120);
        assert_eq!(table.names(), 0x60..0x70);
        let functions: Vec<GoFunction> = functions(&table, &section);
        assert_eq!(functions.len(), 2);
        assert_eq!(
            (functions[0].entry, functions[0].end, functions[0].top_frame),
            (0x401000, 0x401040, true)
        );
        assert_eq!(
            (functions[1].entry, functions[1].end, functions[1].name),
            (0x401040, 0x401080, 5)
        );
        assert_eq!(
            table.sp_steps(&mut section.as_slice(), &functions[1]),
            vec![
                (0x401040..0x401044, 0),
                (0x401044..0x40107c, 24),
                (0x40107c..0x401080, 0)
            ]
        );
    }

    #[test]
    fn the_function_index_finds_each_pcs_function_and_reads_its_rules() {
        let section = table_120();
        let pclntab = Pclntab::parse(&mut section.as_slice(), 0).expect("parsed");
        let index =
            GoFunctionIndex::build(&pclntab, &mut section.as_slice(), 0x400000).expect("built");
        assert_eq!(index.held_bytes(), 16);
        let rule = |pc: u64| {
            let at = index.function_at(pc)?;
            index
                .rules(&mut section.as_slice(), &at)
                .rule_at(pc - at.entry)
        };
        assert_eq!(rule(0x401010), Some(GoFrameRule::Root));
        assert_eq!(rule(0x401040), Some(GoFrameRule::StackPointerBelowEntry(0)));
        assert_eq!(
            rule(0x401050),
            Some(GoFrameRule::StackPointerBelowEntry(24))
        );
        assert_eq!(rule(0x40107f), Some(GoFrameRule::StackPointerBelowEntry(0)));
        assert_eq!(index.function_at(0x401080), None, "past the last function");
        assert_eq!(index.function_at(0x400fff), None, "before the first");
        assert_eq!(index.function_at(0x3fffff), None, "below the base");
        // A table that reads as nothing gives no rule, not a neighbour's.
        let mut broken = section.clone();
        broken[0x80..0x86].copy_from_slice(&[0xff; 6]);
        let at = index.function_at(0x401050).expect("found");
        assert_eq!(index.rules(&mut broken.as_slice(), &at).rule_at(0x10), None);
    }

    #[test]
    fn a_small_window_reads_across_its_edges() {
        let section = table_120();
        let mut reads = 0;
        let mut source = WindowedSection::with_window(
            |at, buffer: &mut [u8]| {
                reads += 1;
                let at = at as usize;
                buffer.copy_from_slice(&section[at..at + buffer.len()]);
                true
            },
            0,
            section.len(),
            100,
        );
        for offset in [0, 60, 95, 99, 0x100, 0x1c0] {
            assert_eq!(
                source.bytes(offset, 16).map(<[u8]>::to_vec),
                Some(section[offset..offset + 16].to_vec())
            );
        }
        assert_eq!(source.bytes(section.len() - 4, 8), None, "past the end");
        assert_eq!(source.bytes(0, MAX_READ + 1), None, "over the read size");
    }

    #[test]
    fn forged_headers_and_tables_are_refused_or_cut_short() {
        let section = table_120();
        assert!(matches!(
            Pclntab::parse(&mut &section[..4], 0),
            Err(GoPclntabError::Malformed { .. })
        ));
        let mut wrong = section.clone();
        wrong[..4].copy_from_slice(&0xffff_fffbu32.to_le_bytes());
        assert_eq!(
            Pclntab::parse(&mut wrong.as_slice(), 0),
            Err(GoPclntabError::UnknownMagic { magic: 0xffff_fffb })
        );
        // More functions than the section holds.
        let mut many = section.clone();
        many[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Pclntab::parse(&mut many.as_slice(), 0).is_err());
        // An offset past the end.
        let mut far = section.clone();
        far[64..72].copy_from_slice(&0x10_0000u64.to_le_bytes());
        assert!(Pclntab::parse(&mut far.as_slice(), 0).is_err());
        // A pc table of endless varints and one that never ends.
        let mut endless = section.clone();
        endless[0x80..0x86].copy_from_slice(&[0xff; 6]);
        let table = Pclntab::parse(&mut endless.as_slice(), 0).expect("header is fine");
        let function = table
            .function(&mut endless.as_slice(), 1)
            .expect("record is fine");
        assert!(
            table
                .sp_steps(&mut endless.as_slice(), &function)
                .is_empty()
        );
        let mut long = section.clone();
        long[0x80..0x84].copy_from_slice(&[2, 1, 2, 1]);
        long[0x84..0x100].fill(1);
        let table = Pclntab::parse(&mut long.as_slice(), 0).expect("header is fine");
        let function = table
            .function(&mut long.as_slice(), 1)
            .expect("record is fine");
        let steps = table.sp_steps(&mut long.as_slice(), &function);
        assert!(steps.len() <= 0x40, "bounded by the function's size");
        assert!(steps.iter().all(|(range, _)| range.end <= 0x401080));
    }

    #[test]
    fn varints_past_32_bits_are_malformed() {
        assert_eq!(uvarint(&[0x05, 9]), Some((5, &[9u8][..])));
        assert_eq!(uvarint(&[0x80, 0x01]), Some((128, &[][..])));
        assert_eq!(uvarint(&[0x80; 6]), None);
        assert_eq!(uvarint(&[]), None);
    }
}
