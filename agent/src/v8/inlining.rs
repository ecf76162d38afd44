//! Functions an optimizing compiler inlined, from an optimized code
//! object's own tables (pure).
//!
//! TurboFan and Maglev record, for ranges of their machine code, a *source
//! position*: the script offset being run and an *inlining id*. The id is
//! 0 in the optimized function's own code; an id `k` names entry `k - 1` of
//! the code's *inlining positions*, which gives the inlined function (an
//! index into the deoptimization data's literals) and the position of its
//! call site, whose own inlining id names the caller, down to 0. So a pc
//! gives the chain of inlined functions, innermost first, above the
//! optimized function.
//!
//! The source position table is a byte string of entries, each two
//! zig-zag variable-length integers (7 bits a byte, least significant
//! first, the top bit saying more follow): the code offset's change from
//! the previous entry (its sign holds the entry's "is statement" flag), and
//! the source position's change. The first entry changes code offset -1
//! and source position 0. An inlining position is 16 bytes: the call site's
//! source position (8), the literal index (4), padding.

use super::frames::CodeKind;

/// Bytes of one inlining position.
pub const INLINING_POSITION_BYTES: usize = 16;
/// Deepest chain of inlined functions followed for one pc.
pub const MAX_INLINING_DEPTH: usize = 64;

/// A V8 source position: a script offset and an inlining id, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourcePosition(pub u64);

impl SourcePosition {
    /// The inlining id: 0 in the optimized function's own code, `k` for
    /// inlining position `k - 1`.
    pub fn inlining_id(self) -> u16 {
        (self.0 >> 31) as u16
    }

    /// The offset in the script (0-based); `None` for an external position
    /// (a builtin's file and line) or an unknown one.
    pub fn script_offset(self) -> Option<u32> {
        if self.0 & 1 == 1 {
            return None;
        }
        // Stored plus one, so that "no position" is 0.
        let stored = ((self.0 >> 1) & ((1 << 30) - 1)) as u32;
        stored.checked_sub(1)
    }
}

/// Where a function was inlined: its call site (in the caller's code) and
/// the index of its `SharedFunctionInfo` among the deoptimization literals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InliningPosition {
    /// The call site, whose inlining id names the caller.
    pub call_site: SourcePosition,
    /// Index into the literals; negative when V8 left it unknown.
    pub function: i32,
}

/// The inlining positions held in `bytes` (whole 16-byte entries only).
pub fn parse_inlining_positions(bytes: &[u8]) -> Vec<InliningPosition> {
    bytes
        .chunks_exact(INLINING_POSITION_BYTES)
        .map(|entry| {
            let mut position = [0u8; 8];
            position.copy_from_slice(&entry[..8]);
            let mut function = [0u8; 4];
            function.copy_from_slice(&entry[8..12]);
            InliningPosition {
                call_site: SourcePosition(u64::from_le_bytes(position)),
                function: i32::from_le_bytes(function),
            }
        })
        .collect()
}

/// One zig-zag variable-length integer at `*at`, advancing it; `None` at
/// the end of `bytes` or past 64 bits.
fn signed_vlq(bytes: &[u8], at: &mut usize) -> Option<i64> {
    let mut value = 0u64;
    let mut shift = 0u32;
    loop {
        let byte = *bytes.get(*at)?;
        *at += 1;
        if shift >= 64 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            break;
        }
    }
    Some(((value >> 1) as i64) ^ -((value & 1) as i64))
}

/// The source position recorded for machine-code offset `offset`: that of
/// the last entry at or before it. `None` when the table has none there or
/// is malformed. Work is bounded by the table's length.
pub fn position_at(table: &[u8], offset: u32) -> Option<SourcePosition> {
    let mut at = 0usize;
    let mut code_offset = -1i64;
    let mut source = 0i64;
    let mut found = None;
    while at < table.len() {
        let delta = signed_vlq(table, &mut at)?;
        // A negative change is a non-statement entry's `-change - 1`.
        let delta = if delta >= 0 { delta } else { -(delta + 1) };
        code_offset = code_offset.checked_add(delta)?;
        source = source.wrapping_add(signed_vlq(table, &mut at)?);
        if code_offset > i64::from(offset) {
            break;
        }
        found = Some(SourcePosition(source as u64));
    }
    found
}

/// The literal indices of the functions inlined at `position`, innermost
/// first (the optimized function itself is not among them). Each step must
/// lower the inlining id, so a forged table ends; an id past the table or
/// an unknown function gives `None` (the frame is then named without its
/// inlined functions rather than wrongly).
pub fn inlined_functions(
    position: SourcePosition,
    inlinings: &[InliningPosition],
) -> Option<Vec<usize>> {
    let mut chain = Vec::new();
    let mut id = position.inlining_id();
    while id != 0 {
        if chain.len() >= MAX_INLINING_DEPTH {
            return None;
        }
        let entry = inlinings.get(usize::from(id) - 1)?;
        chain.push(usize::try_from(entry.function).ok()?);
        let parent = entry.call_site.inlining_id();
        if parent >= id {
            return None;
        }
        id = parent;
    }
    Some(chain)
}

/// `native` (leaf first) with the named frames put in, where a frame may
/// have several names (its inlined functions, innermost first, then its
/// own), all at its index and in that order: a JIT frame's address is
/// replaced by them, a builtin frame's names go just leafward of it.
/// `named` is sorted by index.
pub fn weave(native: &[u64], named: &[(usize, CodeKind, u64)]) -> Vec<u64> {
    let mut out = Vec::with_capacity(native.len() + named.len());
    let mut next = named.iter().peekable();
    for (index, &pc) in native.iter().enumerate() {
        let mut kind = None;
        while let Some(&&(at, frame_kind, id)) = next.peek() {
            if at != index {
                break;
            }
            next.next();
            out.push(id);
            kind = Some(frame_kind);
        }
        if kind != Some(CodeKind::Jit) {
            out.push(pc);
        }
    }
    out
}

#[cfg(test)]
mod tests;
