//! Optimized code of a live process, found from a pc, with the tables that
//! name the functions inlined into it ([`super::inlining`]).
//!
//! A JIT frame's pc lies in an `InstructionStream`'s instructions, and that
//! object's header (map, then its `Code`) lies just before them, at V8's
//! code alignment. Since V8 13 a `JSFunction` reaches its code only through
//! a dispatch table the postmortem constants do not describe, so the header
//! is looked for backward from the pc: an aligned word that is the
//! instruction-stream map, followed by a `Code` whose instruction stream is
//! that object and whose instructions hold the pc. The scan is capped per
//! lookup ([`MAX_SCAN_BYTES`]) and per process and window (the caller's
//! budget); the first header found ends it.

use super::heap::{Heap, Memory};
use super::inlining::{self, InliningPosition};
use super::layout::{ArrayTypes, CodeLayout, OptimizedFunction};

/// V8's code alignment on x86-64: instruction streams start at multiples.
const CODE_ALIGNMENT: u64 = 32;
/// Most bytes before a pc looked through for its code's header (a regular
/// code page's size: larger code has a page of its own, header first).
pub const MAX_SCAN_BYTES: u64 = 256 << 10;
/// Bytes read at once while scanning.
const SCAN_CHUNK: u64 = 4096;
/// Largest distance from an instruction stream to its instructions.
const MAX_HEADER_BYTES: u64 = 256;
/// Header words after the map where the `Code` pointer is looked for.
const HEADER_CODE_SLOTS: u64 = 3;
/// Largest deoptimization data read (elements).
const MAX_DEOPT_ELEMENTS: i64 = 1 << 16;
/// Most inlined functions read per code object.
const MAX_INLINED_FUNCTIONS: i64 = 4096;
/// Largest source position table read, in bytes.
const MAX_POSITION_TABLE_BYTES: i64 = 1 << 20;
/// Largest inlining positions read, in bytes (16 a call site).
const MAX_INLINING_BYTES: i64 = 1 << 20;

/// What the agent keeps of one code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizedCode {
    /// First instruction.
    pub start: u64,
    /// Past the last instruction.
    pub end: u64,
    /// The `SharedFunctionInfo` it was compiled for (untagged), when the
    /// deoptimization data names it.
    pub shared: Option<u64>,
    /// Its source position table; empty for unoptimized code.
    pub positions: Vec<u8>,
    /// Its inlining positions.
    pub inlinings: Vec<InliningPosition>,
    /// The inlined functions' `SharedFunctionInfo`s (untagged), by literal
    /// index; `None` where the literal is not one.
    pub functions: Vec<Option<u64>>,
}

impl OptimizedCode {
    /// The inlined functions (untagged `SharedFunctionInfo`s) running at
    /// `pc`, innermost first; empty when none, or when any of the chain is
    /// unknown. A return address is looked up one byte back, in its call.
    pub fn inlined_at(&self, pc: u64, return_address: bool) -> Vec<u64> {
        if self.positions.is_empty() || !(self.start..self.end).contains(&pc) {
            return Vec::new();
        }
        let offset = (pc - self.start).saturating_sub(u64::from(return_address));
        let Ok(offset) = u32::try_from(offset) else {
            return Vec::new();
        };
        inlining::position_at(&self.positions, offset)
            .and_then(|position| inlining::inlined_functions(position, &self.inlinings))
            .and_then(|chain| {
                chain
                    .into_iter()
                    .map(|index| self.functions.get(index).copied().flatten())
                    .collect::<Option<Vec<u64>>>()
            })
            .unwrap_or_default()
    }
}

/// What a process's scans have learnt, and what they may still cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanner {
    /// The instruction-stream map, once a header has been found.
    pub map: Option<u64>,
    /// Bytes this process's scans may still read this window.
    pub budget: u64,
}

fn is_one_of(types: &ArrayTypes, kind: u16) -> bool {
    kind != 0 && types.contains(&kind)
}

/// The code object whose instructions hold `pc`; `None` when none is found
/// within the caps, or what is found does not check out.
pub fn code_at<M: Memory>(
    heap: &mut Heap<'_, M>,
    code: &CodeLayout,
    scanner: &mut Scanner,
    pc: u64,
) -> Option<OptimizedCode> {
    let layout = heap.layout();
    let lowest = pc.saturating_sub(MAX_SCAN_BYTES) & !(CODE_ALIGNMENT - 1);
    let mut chunk_end = (pc & !(CODE_ALIGNMENT - 1)).checked_add(CODE_ALIGNMENT)?;
    let mut buffer = vec![0u8; SCAN_CHUNK as usize];
    while chunk_end > lowest {
        let chunk_start = ((chunk_end - 1) & !(SCAN_CHUNK - 1)).max(lowest);
        let length = chunk_end - chunk_start;
        if scanner.budget < length {
            return None;
        }
        scanner.budget -= length;
        let bytes = &mut buffer[..length as usize];
        if !heap.read(chunk_start, bytes) {
            return None;
        }
        let words: Vec<(u64, u64)> = (0..length / CODE_ALIGNMENT)
            .rev()
            .filter_map(|slot| {
                let at = (slot * CODE_ALIGNMENT) as usize;
                let word = u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
                Some((chunk_start + slot * CODE_ALIGNMENT, word))
            })
            .collect();
        for (address, word) in words {
            if !layout.is_heap_object(word) || scanner.map.is_some_and(|map| map != word) {
                continue;
            }
            if scanner.map.is_none() && heap.map_type(word) != Some(code.instruction_stream_type) {
                continue;
            }
            let Some(found) = code_of_stream(heap, code, address) else {
                continue;
            };
            scanner.map = Some(word);
            // The first header before the pc is its code's, or the pc is in
            // no live code.
            return read_code(heap, code, found, address, pc);
        }
        chunk_end = chunk_start;
    }
    None
}

/// The `Code` (untagged) that the instruction stream at `stream` belongs
/// to: a header word pointing to a `Code` that points back.
fn code_of_stream<M: Memory>(
    heap: &mut Heap<'_, M>,
    code: &CodeLayout,
    stream: u64,
) -> Option<u64> {
    let layout = heap.layout();
    (1..=HEADER_CODE_SLOTS).find_map(|slot| {
        let tagged = heap.word(stream.checked_add(slot * 8)?)?;
        let (address, kind) = heap.object(tagged)?;
        if kind != code.code_type {
            return None;
        }
        let back = heap.field(address, code.instruction_stream)?;
        (layout.is_heap_object(back) && layout.untag(back) == stream).then_some(address)
    })
}

/// The code object at `address` (untagged), its instructions checked to
/// follow the stream at `stream` and hold `pc`, with its tables when it is
/// optimized.
fn read_code<M: Memory>(
    heap: &mut Heap<'_, M>,
    code: &CodeLayout,
    address: u64,
    stream: u64,
    pc: u64,
) -> Option<OptimizedCode> {
    let start = heap.field(address, code.instruction_start)?;
    let mut size = [0u8; 4];
    let mut flags = [0u8; 4];
    if !heap.read(
        address.checked_add(u64::from(code.instruction_size))?,
        &mut size,
    ) || !heap.read(address.checked_add(u64::from(code.flags))?, &mut flags)
    {
        return None;
    }
    let size = u64::try_from(i32::from_le_bytes(size)).ok()?;
    let end = start.checked_add(size)?;
    if start <= stream || start - stream > MAX_HEADER_BYTES || !(start..end).contains(&pc) {
        return None;
    }
    let mut found = OptimizedCode {
        start,
        end,
        shared: None,
        positions: Vec::new(),
        inlinings: Vec::new(),
        functions: Vec::new(),
    };
    let kind = (u32::from_le_bytes(flags) & code.kind_mask) >> code.kind_shift;
    // Only the optimizing tiers (Maglev, TurboFan), which follow baseline
    // code's kind, inline; unreadable tables leave the range known, with
    // no inlined functions.
    if kind > code.baseline_kind {
        let _ = read_tables(heap, code, address, &mut found);
    }
    Some(found)
}

/// The bytes of the byte array `tagged` points to, when it has one of
/// `types` and at most `cap` bytes.
fn byte_array<M: Memory>(
    heap: &mut Heap<'_, M>,
    types: &ArrayTypes,
    tagged: u64,
    cap: i64,
) -> Option<Vec<u8>> {
    let fields = heap.layout().fields;
    let (address, kind) = heap.object(tagged)?;
    if !is_one_of(types, kind) {
        return None;
    }
    let length = heap
        .layout()
        .smi(heap.field(address, fields.fixed_array_length)?)?;
    if !(0..=cap).contains(&length) {
        return None;
    }
    let mut bytes = vec![0u8; length as usize];
    heap.read(
        address.checked_add(u64::from(fields.fixed_array_data))?,
        &mut bytes,
    )
    .then_some(bytes)
}

/// The first `count` elements of the array `tagged` points to, when it has
/// one of `types` and that many elements.
fn elements<M: Memory>(
    heap: &mut Heap<'_, M>,
    types: &ArrayTypes,
    tagged: u64,
    count: i64,
) -> Option<Vec<u64>> {
    let fields = heap.layout().fields;
    let (address, kind) = heap.object(tagged)?;
    if !is_one_of(types, kind) {
        return None;
    }
    let length = heap
        .layout()
        .smi(heap.field(address, fields.fixed_array_length)?)?;
    if !(count..=MAX_DEOPT_ELEMENTS).contains(&length) {
        return None;
    }
    let mut bytes = vec![0u8; usize::try_from(count).ok()?.checked_mul(8)?];
    if !heap.read(
        address.checked_add(u64::from(fields.fixed_array_data))?,
        &mut bytes,
    ) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
            .collect(),
    )
}

/// The `SharedFunctionInfo` (untagged) a tagged value points to, strongly
/// or weakly (a weak reference has both low bits set).
fn shared<M: Memory>(heap: &mut Heap<'_, M>, tagged: u64) -> Option<u64> {
    let strong = if tagged & 3 == 3 { tagged & !2 } else { tagged };
    let (address, kind) = heap.object(strong)?;
    (kind == heap.layout().types.shared_function_info).then_some(address)
}

/// Fills `found`'s tables from the code object at `address`.
fn read_tables<M: Memory>(
    heap: &mut Heap<'_, M>,
    code: &CodeLayout,
    address: u64,
    found: &mut OptimizedCode,
) -> Option<()> {
    let last = [
        code.inlined_count_index,
        code.literals_index,
        code.inlining_positions_index,
        match code.optimized_function {
            Some(
                OptimizedFunction::Shared { index } | OptimizedFunction::Wrapped { index, .. },
            ) => index,
            None => 0,
        },
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let deopt = heap.field(address, code.deoptimization_data)?;
    let data = elements(heap, &code.fixed_array_types, deopt, i64::from(last) + 1)?;
    let at = |index: u32| data.get(index as usize).copied();
    found.shared = match code.optimized_function {
        Some(OptimizedFunction::Shared { index }) => shared(heap, at(index)?),
        Some(OptimizedFunction::Wrapped {
            index,
            wrapper_type,
            offset,
        }) => {
            let (wrapper, kind) = heap.object(at(index)?)?;
            if kind != wrapper_type {
                return None;
            }
            let inner = heap.field(wrapper, offset)?;
            shared(heap, inner)
        }
        None => None,
    };
    let count = heap.layout().smi(at(code.inlined_count_index)?)?;
    if !(0..=MAX_INLINED_FUNCTIONS).contains(&count) {
        return None;
    }
    let positions = heap.field(address, code.source_positions)?;
    found.positions = byte_array(
        heap,
        &code.byte_array_types,
        positions,
        MAX_POSITION_TABLE_BYTES,
    )?;
    if count == 0 {
        return Some(());
    }
    let literals = elements(
        heap,
        &code.literal_array_types,
        at(code.literals_index)?,
        count,
    )?;
    found.functions = literals.into_iter().map(|l| shared(heap, l)).collect();
    let inlinings = byte_array(
        heap,
        &code.byte_array_types,
        at(code.inlining_positions_index)?,
        MAX_INLINING_BYTES,
    )?;
    found.inlinings = inlining::parse_inlining_positions(&inlinings);
    Some(())
}

#[cfg(test)]
mod tests;
