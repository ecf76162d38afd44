//! Instruction sequences read from a Ruby process: label, path, first line
//! and the table from instruction positions to lines, cached per (process,
//! iseq) by the caller.
//!
//! An iseq is a GC-managed object, so every read checks what it finds: the
//! object's type bits must say "imemo iseq" before its body is trusted, and
//! every length read from the process is capped.

use std::sync::Arc;

use crate::python::memory::{MemoryReadError, ProcessMemory};

use super::offsets::RubyOffsets;

/// Longest label or path kept, in bytes.
const MAX_STRING_BYTES: u64 = 1024;
/// Most instruction-info entries kept; longer iseqs give their first line.
const MAX_INSN_INFOS: u32 = 16 << 10;
/// Most instructions (VALUE words) an iseq may claim.
const MAX_ISEQ_SIZE: u32 = 1 << 24;

/// `RUBY_T_MASK`, `RUBY_T_IMEMO`, `RUBY_T_STRING`, `RUBY_T_ARRAY`.
const T_MASK: u64 = 0x1f;
const T_IMEMO: u64 = 0x1a;
const T_STRING: u64 = 0x05;
const T_ARRAY: u64 = 0x07;
/// `imemo_iseq`, in the four bits above `FL_USHIFT` (12).
const IMEMO_ISEQ: u64 = 7;
/// `FL_USER1`: a heap string (`RSTRING_NOEMBED`) or an embedded array
/// (`RARRAY_EMBED_FLAG`).
const FL_USER1: u64 = 1 << 13;
/// An embedded string's length: `FL_USER2..6`.
const STRING_EMBED_LEN_SHIFT: u64 = 14;
const STRING_EMBED_LEN_MASK: u64 = 0x1f;
/// An embedded array's length: `FL_USER3..9`.
const ARRAY_EMBED_LEN_SHIFT: u64 = 15;
const ARRAY_EMBED_LEN_MASK: u64 = 0x7f;
/// Entries of the succinct position table answered by its immediate part.
const SUCC_IMMEDIATE: u64 = 54;
/// Bytes of the immediate part and of each 512-position block.
const SUCC_IMMEDIATE_BYTES: u64 = 48;
const SUCC_BLOCK_BYTES: u64 = 80;

/// What an iseq says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IseqInfo {
    /// The method or block label (`kiln_rb_hot`, `block in main`).
    pub label: Arc<str>,
    /// The file it was compiled from (its real path when known).
    pub path: Arc<str>,
    /// `first_lineno`.
    pub first_line: u32,
    /// Address of its instructions.
    pub encoded: u64,
    /// Line of each instruction-info entry; empty when over the cap.
    pub lines: Box<[u32]>,
    /// Where each entry's instructions start, as plain positions or as the
    /// interpreter's succinct bit table.
    pub positions: Positions,
}

/// How an iseq maps instruction positions to its info entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Positions {
    /// The first position of each entry, ascending.
    Plain(Box<[u32]>),
    /// Ruby's succinct index table (bytes as in the process).
    Succinct(Box<[u8]>),
}

/// Why an iseq could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IseqReadError {
    /// Its memory could not be read.
    #[error(transparent)]
    Memory(#[from] MemoryReadError),
    /// The object is not an iseq (a forged or reused address).
    #[error("the object at {address:#x} is not an iseq")]
    NotIseq {
        /// Where it was looked for.
        address: u64,
    },
}

impl IseqInfo {
    /// Bytes this entry holds, for the cache's budget.
    pub fn held_bytes(&self) -> usize {
        let positions = match &self.positions {
            Positions::Plain(p) => p.len() * 4,
            Positions::Succinct(b) => b.len(),
        };
        self.label.len() + self.path.len() + self.lines.len() * 4 + positions + 96
    }

    /// The line run at `pc` (the frame's saved pc, which points past the
    /// instruction being run), or the first line when the table does not say.
    pub fn line_at(&self, pc: u64) -> u32 {
        self.entry_at(pc)
            .and_then(|i| self.lines.get(i).copied())
            .unwrap_or(self.first_line)
    }

    fn entry_at(&self, pc: u64) -> Option<usize> {
        if self.lines.len() == 1 {
            return Some(0);
        }
        let position = pc.checked_sub(self.encoded)? / 8;
        let position = position.saturating_sub(1);
        match &self.positions {
            Positions::Plain(starts) => {
                let after = starts.partition_point(|&s| u64::from(s) <= position);
                after.checked_sub(1)
            }
            Positions::Succinct(table) => {
                let rank = succinct_rank(table, position)?;
                usize::try_from(rank).ok()?.checked_sub(1)
            }
        }
    }
}

/// The number of entries starting at or before `position`, from Ruby's
/// succinct table: 54 positions answered by 9 seven-bit counts per word,
/// then blocks of 512 bits, each with its rank and the ranks of its eight
/// 64-bit words.
fn succinct_rank(table: &[u8], position: u64) -> Option<u64> {
    let word = |at: u64| -> Option<u64> {
        let at = usize::try_from(at).ok()?;
        Some(u64::from_le_bytes(table.get(at..at + 8)?.try_into().ok()?))
    };
    if position < SUCC_IMMEDIATE {
        let part = word((position / 9) * 8)?;
        return Some((part >> ((position % 9) * 7)) & 0x7f);
    }
    let bit = position - SUCC_IMMEDIATE;
    let block = SUCC_IMMEDIATE_BYTES + (bit / 512) * SUCC_BLOCK_BYTES;
    let rank = word(block)? & 0xffff_ffff;
    let small_ranks = word(block + 8)?;
    let in_block = bit % 512;
    let small = in_block / 64;
    let before = if small == 0 {
        0
    } else {
        (small_ranks >> ((small - 1) * 9)) & 0x1ff
    };
    let bits = word(block + 16 + small * 8)? << (63 - in_block % 64);
    Some(rank + before + u64::from(bits.count_ones()))
}

fn read_u64(memory: &ProcessMemory, address: u64) -> Result<u64, MemoryReadError> {
    let mut bytes = [0u8; 8];
    memory.read(address, &mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_u32(memory: &ProcessMemory, address: u64) -> Result<u32, MemoryReadError> {
    let mut bytes = [0u8; 4];
    memory.read(address, &mut bytes)?;
    Ok(u32::from_le_bytes(bytes))
}

/// A Ruby String's bytes, lossily decoded; `None` when the object is not a
/// String.
fn read_string(memory: &ProcessMemory, address: u64) -> Result<Option<String>, MemoryReadError> {
    if address & 7 != 0 || address == 0 {
        return Ok(None); // an immediate (nil, a Fixnum), not an object
    }
    let flags = read_u64(memory, address)?;
    if flags & T_MASK != T_STRING {
        return Ok(None);
    }
    let (data, len) = if flags & FL_USER1 != 0 {
        (
            read_u64(memory, address + 24)?,
            read_u64(memory, address + 16)?,
        )
    } else {
        (
            address + 16,
            (flags >> STRING_EMBED_LEN_SHIFT) & STRING_EMBED_LEN_MASK,
        )
    };
    let len = usize::try_from(len.min(MAX_STRING_BYTES)).unwrap_or(0);
    let bytes = memory.read_vec(data, len)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Element `index` of a Ruby Array, or `None` when it is not an Array or
/// is shorter.
fn read_array_element(
    memory: &ProcessMemory,
    address: u64,
    index: u64,
) -> Result<Option<u64>, MemoryReadError> {
    if address & 7 != 0 || address == 0 {
        return Ok(None);
    }
    let flags = read_u64(memory, address)?;
    if flags & T_MASK != T_ARRAY {
        return Ok(None);
    }
    let (items, len) = if flags & FL_USER1 != 0 {
        (
            address + 16,
            (flags >> ARRAY_EMBED_LEN_SHIFT) & ARRAY_EMBED_LEN_MASK,
        )
    } else {
        (
            read_u64(memory, address + 32)?,
            read_u64(memory, address + 16)?,
        )
    };
    if index >= len {
        return Ok(None);
    }
    // Forged pointers and lengths wrap to an unreadable address, never
    // overflow.
    let item = items.wrapping_add(index.wrapping_mul(8));
    Ok(Some(read_u64(memory, item)?))
}

/// The file an iseq's `pathobj` names: its real path when it has one.
fn read_path(memory: &ProcessMemory, pathobj: u64) -> Result<String, MemoryReadError> {
    if let Some(path) = read_string(memory, pathobj)? {
        return Ok(path);
    }
    for index in [1, 0] {
        if let Some(element) = read_array_element(memory, pathobj, index)?
            && let Some(path) = read_string(memory, element)?
        {
            return Ok(path);
        }
    }
    Ok(String::new())
}

/// Reads the iseq at `address`.
pub fn read_iseq(
    memory: &ProcessMemory,
    offsets: &RubyOffsets,
    address: u64,
) -> Result<IseqInfo, IseqReadError> {
    let flags = read_u64(memory, address)?;
    if flags & T_MASK != T_IMEMO || (flags >> 12) & 0xf != IMEMO_ISEQ {
        return Err(IseqReadError::NotIseq { address });
    }
    let body = read_u64(memory, address.wrapping_add(u64::from(offsets.iseq_body)))?;
    // A forged body near 2^64 wraps to an unreadable address.
    let at = |offset: u16| body.wrapping_add(u64::from(offset));
    let label = read_string(memory, read_u64(memory, at(offsets.body_label))?)?.unwrap_or_default();
    let path = read_path(memory, read_u64(memory, at(offsets.body_pathobj))?)?;
    // A Fixnum: (n << 1) | 1.
    let first_line =
        u32::try_from(read_u64(memory, at(offsets.body_first_lineno))? >> 1).unwrap_or(0);
    let encoded = read_u64(memory, at(offsets.body_iseq_encoded))?;
    let iseq_size = read_u32(memory, at(offsets.body_iseq_size))?.min(MAX_ISEQ_SIZE);
    let size = read_u32(memory, at(offsets.insns_size))?;
    let (lines, positions) = if size == 0 || size > MAX_INSN_INFOS {
        (Box::default(), Positions::Plain(Box::default()))
    } else {
        let entries = memory.read_vec(
            read_u64(memory, at(offsets.insns_body))?,
            size as usize * usize::from(offsets.insn_info_size),
        )?;
        let lines: Box<[u32]> = entries
            .chunks_exact(usize::from(offsets.insn_info_size))
            .map(|e| u32::from_le_bytes([e[0], e[1], e[2], e[3]]))
            .collect();
        let plain = read_u64(memory, at(offsets.insns_positions))?;
        let positions = if plain != 0 {
            let bytes = memory.read_vec(plain, size as usize * 4)?;
            Positions::Plain(
                bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            )
        } else {
            let table = read_u64(memory, at(offsets.insns_succ_table))?;
            let blocks = u64::from(iseq_size)
                .saturating_sub(SUCC_IMMEDIATE)
                .div_ceil(512);
            let len = SUCC_IMMEDIATE_BYTES + blocks * SUCC_BLOCK_BYTES;
            Positions::Succinct(memory.read_vec(table, len as usize)?.into_boxed_slice())
        };
        (lines, positions)
    };
    Ok(IseqInfo {
        label: Arc::from(label),
        path: Arc::from(path),
        first_line,
        encoded,
        lines,
        positions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(lines: &[u32], positions: Positions) -> IseqInfo {
        IseqInfo {
            label: Arc::from("hot"),
            path: Arc::from("/app/hot.rb"),
            first_line: 1,
            encoded: 0x1000,
            lines: lines.into(),
            positions,
        }
    }

    #[test]
    fn plain_positions_give_the_line_of_the_instruction_before_pc() {
        let iseq = info(&[2, 3, 5], Positions::Plain(vec![0, 4, 9].into()));
        assert_eq!(iseq.line_at(0x1000 + 8), 2); // running position 0
        assert_eq!(iseq.line_at(0x1000 + 5 * 8), 3); // running position 4
        assert_eq!(iseq.line_at(0x1000 + 20 * 8), 5);
        assert_eq!(iseq.line_at(0x10), 1, "a pc before the code: first line");
    }

    #[test]
    fn forged_objects_are_refused_or_capped() {
        // A fake iseq in this process's own memory: a label String whose
        // heap length claims a terabyte, an info table claiming u32::MAX
        // entries, a path that is neither String nor Array.
        let text = vec![b'x'; 4096];
        let label: Vec<u64> = vec![T_STRING | FL_USER1, 0, 1 << 40, text.as_ptr() as u64];
        let path: Vec<u64> = vec![0x1c, 0, 0, 0];
        let mut body = vec![0u64; 32];
        body[8] = path.as_ptr() as u64; // pathobj at 64
        body[10] = label.as_ptr() as u64; // label at 80
        body[11] = (7 << 1) | 1; // first_lineno 7, a Fixnum
        body[17] = u64::from(u32::MAX); // insns_info.size at 136
        let iseq: Vec<u64> = vec![(IMEMO_ISEQ << 12) | T_IMEMO, 0, body.as_ptr() as u64];
        let memory = ProcessMemory::new(std::process::id());
        let offsets = super::super::offsets::for_version(3, 1).expect("3.1 is known");
        let info = read_iseq(&memory, offsets, iseq.as_ptr() as u64).expect("readable");
        assert_eq!(
            info.label.len(),
            MAX_STRING_BYTES as usize,
            "the label is capped"
        );
        assert_eq!(&*info.path, "", "a path of another type is not read");
        assert!(info.lines.is_empty(), "an oversized line table is not read");
        assert_eq!(info.line_at(0x1234), 7, "the first line stands in");
        // The same bytes not marked as an iseq are refused before the body.
        let other: Vec<u64> = vec![T_STRING, 0, body.as_ptr() as u64];
        assert!(matches!(
            read_iseq(&memory, offsets, other.as_ptr() as u64),
            Err(IseqReadError::NotIseq { .. })
        ));
        assert!(matches!(
            read_iseq(&memory, offsets, 8),
            Err(IseqReadError::Memory(_))
        ));
    }

    #[test]
    fn the_succinct_table_ranks_positions() {
        // Entries start at positions 0, 4 and 60: immediate counts for
        // 0..54 (1 up to 3, 2 from 4), then one block whose bit 6 is 60.
        let mut table = vec![0u8; 48 + 80];
        for position in 0..54u64 {
            let count = if position < 4 { 1 } else { 2 };
            let word = (position / 9) as usize * 8;
            let mut value = u64::from_le_bytes(table[word..word + 8].try_into().unwrap());
            value |= count << ((position % 9) * 7);
            table[word..word + 8].copy_from_slice(&value.to_le_bytes());
        }
        table[48..52].copy_from_slice(&2u32.to_le_bytes()); // rank before the block
        table[64..72].copy_from_slice(&(1u64 << 6).to_le_bytes());
        let iseq = info(&[2, 3, 7], Positions::Succinct(table.into()));
        assert_eq!(iseq.line_at(0x1000 + 8), 2);
        assert_eq!(iseq.line_at(0x1000 + 5 * 8), 3);
        assert_eq!(iseq.line_at(0x1000 + 59 * 8), 3);
        assert_eq!(iseq.line_at(0x1000 + 61 * 8), 7);
        assert_eq!(
            iseq.line_at(0x1000 + 600 * 8),
            1,
            "past the table: first line"
        );
    }
}
