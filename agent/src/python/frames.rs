//! Python frames among native ones (pure).
//!
//! A Python frame goes into the unwound stack as an id with the top bit set
//! ([`PYTHON_FRAME_TAG`]), naming an entry of the window's
//! [`PythonFrameTable`] ([`crate::frame_table`]).

use std::ops::Range;

use crate::frame_table::{FrameName, FrameTable, FrameTag};

/// Marks a stack entry as a Python frame id rather than an address.
pub const PYTHON_FRAME_TAG: u64 = 1 << 63;

/// Whether a stack entry is a Python frame.
pub fn is_python_frame(entry: u64) -> bool {
    entry & PYTHON_FRAME_TAG != 0
}

/// The native entries of a stack, in order.
pub fn native_entries(stack: &[u64]) -> Vec<u64> {
    stack
        .iter()
        .copied()
        .filter(|&e| !is_python_frame(e))
        .collect()
}

/// What a Python frame shows in a profile: qualified function name,
/// source file, line being run (0: unknown).
pub type PythonFrameName = FrameName;

/// The name given to frames past a window's capacity, and to frames whose
/// code object could not be read.
pub const UNKNOWN_FUNCTION: &str = "[unknown python frame]";

/// Python's ids: the top bit.
#[derive(Debug)]
pub struct PythonTag;

impl FrameTag for PythonTag {
    const TAG: u64 = PYTHON_FRAME_TAG;
    const MASK: u64 = PYTHON_FRAME_TAG;
    const OVER_CAPACITY: &'static str = UNKNOWN_FUNCTION;
}

/// The Python frames of one window, by id, bounded.
pub type PythonFrameTable = FrameTable<PythonTag>;

/// Puts Python frames (tagged, leaf first, with `group_ends[i]` true on the
/// root-most frame of each eval-loop call) into the native stack (leaf
/// first): each call's frames go just leafward of the native frame of the
/// eval function running them (in any of its parts, `eval`), the `n`th call from the leaf at the `n`th
/// such native frame. Calls left over when the native stack ends (it was
/// cut short) go at the root end.
pub fn interleave(
    native: &[u64],
    python: &[u64],
    group_ends: &[bool],
    eval: &[Range<u64>],
) -> Vec<u64> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (i, &end) in group_ends.iter().enumerate().take(python.len()) {
        if end {
            groups.push(&python[start..=i]);
            start = i + 1;
        }
    }
    if start < python.len() {
        groups.push(&python[start..]);
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut next = groups.iter();
    for (depth, &pc) in native.iter().enumerate() {
        // Callers hold return addresses, one past the call.
        let site = if depth == 0 { pc } else { pc.saturating_sub(1) };
        if eval.iter().any(|part| part.contains(&site))
            && let Some(group) = next.next()
        {
            out.extend_from_slice(group);
        }
        out.push(pc);
    }
    for group in next {
        out.extend_from_slice(group);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn name(function: &str, line: u32) -> PythonFrameName {
        PythonFrameName {
            function: Arc::from(function),
            file: Arc::from("/app/work.py"),
            line,
        }
    }

    #[test]
    fn ids_are_tagged_stable_and_bounded() {
        let mut table = PythonFrameTable::new(3);
        let hot = table.intern(name("hot", 3));
        assert!(is_python_frame(hot));
        assert_eq!(table.intern(name("hot", 3)), hot);
        let other = table.intern(name("hot", 4));
        assert_ne!(other, hot);
        let over = table.intern(name("cold", 1));
        assert_eq!(
            table.get(over).map(|n| &*n.function),
            Some(UNKNOWN_FUNCTION)
        );
        assert_eq!(
            table.intern(name("colder", 1)),
            over,
            "one entry past capacity"
        );
        assert_eq!(table.get(hot), Some(&name("hot", 3)));
        assert_eq!(table.get(0x4000), None, "addresses are not frames");
        table.clear();
        assert!(table.is_empty());
    }

    #[test]
    fn each_eval_call_gets_its_own_frames() {
        // The eval function at 0x5000 and its cold part at 0x9000.
        let eval = [0x5000..0x6000, 0x9000..0xa000];
        let (hot, middle, outer) = (
            PYTHON_FRAME_TAG | 1,
            PYTHON_FRAME_TAG | 2,
            PYTHON_FRAME_TAG | 3,
        );
        // 3.9-style: one eval call per frame.
        let native = [0x1010, 0x5100, 0x7000, 0x5200, 0x7100, 0x5300, 0x8000];
        let merged = interleave(&native, &[hot, middle, outer], &[true, true, true], &eval);
        assert_eq!(
            merged,
            vec![
                0x1010, hot, 0x5100, 0x7000, middle, 0x5200, 0x7100, outer, 0x5300, 0x8000
            ]
        );
        // 3.11-style: hot and middle ran in the leaf call, outer in the next.
        let native = [0x5100, 0x7000, 0x5200, 0x8000];
        let merged = interleave(&native, &[hot, middle, outer], &[false, true, true], &eval);
        assert_eq!(
            merged,
            vec![hot, middle, 0x5100, 0x7000, outer, 0x5200, 0x8000]
        );
        // The same with the loop running in its cold part.
        let native = [0x9100, 0x7000, 0x9200, 0x8000];
        let merged = interleave(&native, &[hot, middle, outer], &[false, true, true], &eval);
        assert_eq!(
            merged,
            vec![hot, middle, 0x9100, 0x7000, outer, 0x9200, 0x8000]
        );
    }

    #[test]
    fn calls_beyond_a_cut_native_stack_go_at_the_root_end() {
        let eval = std::slice::from_ref(&(0x5000..0x6000));
        let frames = [PYTHON_FRAME_TAG | 1, PYTHON_FRAME_TAG | 2];
        let merged = interleave(&[0x1000, 0x5001], &frames, &[true, true], eval);
        assert_eq!(merged, vec![0x1000, frames[0], 0x5001, frames[1]]);
        assert_eq!(native_entries(&merged), vec![0x1000, 0x5001]);
        // No frames: the native stack as it was.
        assert_eq!(
            interleave(&[0x1000, 0x5001], &[], &[], eval),
            vec![0x1000, 0x5001]
        );
    }
}
