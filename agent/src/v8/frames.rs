//! JavaScript frames among native ones (pure).
//!
//! Like Python's ([`crate::python::frames`]), a JavaScript frame goes into
//! the unwound stack as a tagged id naming an entry of the window's
//! [`JsFrameTable`]. Its tag is bit 62 (Python's is bit 63; user addresses
//! have neither).

use std::collections::HashSet;

use super::layout::V8Layout;
use crate::frame_table::{FrameName, FrameTable, FrameTag};
use crate::unwind::FrameRegisters;

/// Marks a stack entry as a JavaScript frame id.
pub const JS_FRAME_TAG: u64 = 1 << 62;
const TAG_BITS: u64 = 3 << 62;

/// Whether a stack entry is a JavaScript frame.
pub fn is_js_frame(entry: u64) -> bool {
    entry & TAG_BITS == JS_FRAME_TAG
}

/// What a JavaScript frame shows in a profile: function name
/// (`(anonymous)` when it has none), script name, line (0: unknown).
pub type JsFrameName = FrameName;

/// The name of frames past a window's capacity.
pub const OVER_CAPACITY: &str = "[javascript frames over the window's limit]";

/// JavaScript's ids: bit 62 without bit 63.
#[derive(Debug)]
pub struct JsTag;

impl FrameTag for JsTag {
    const TAG: u64 = JS_FRAME_TAG;
    const MASK: u64 = TAG_BITS;
    const OVER_CAPACITY: &'static str = OVER_CAPACITY;
}

/// The JavaScript frames of one window, by id, bounded.
pub type JsFrameTable = FrameTable<JsTag>;

/// Where a frame's pc lies, as far as JavaScript is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeKind {
    /// JIT code (an anonymous executable mapping): the frame is the
    /// function's, and its name replaces the address.
    Jit,
    /// The V8 object's own code (the interpreter's and baseline builtins):
    /// the function it runs goes just leafward of it.
    Builtin,
    /// Any other object's code: never a JavaScript frame.
    Native,
}

/// The tagged `JSFunction` pointers of the JavaScript frames of a walked
/// stack, as (frame index, pointer). A frame counts when its code may be
/// V8's, its frame pointer lies in the copied stack, its context slot holds
/// no Smi frame-type marker (typed frames: entry, exit, stubs), and its
/// function slot holds a heap object pointer. When several frames share a
/// frame pointer (a frameless leaf, native code keeping its caller's),
/// only the rootmost is the frame's owner; each frame pointer counts once.
pub fn function_slots(
    layout: &V8Layout,
    frames: &[u64],
    registers: &[FrameRegisters],
    kind: impl Fn(u64) -> CodeKind,
    read_stack: impl Fn(u64) -> Option<u64>,
) -> Vec<(usize, u64)> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    for (index, (&pc, at)) in frames.iter().zip(registers).enumerate() {
        if kind(pc) == CodeKind::Native || at.bp == 0 {
            continue;
        }
        if registers
            .get(index + 1)
            .is_some_and(|next| next.bp == at.bp)
        {
            continue;
        }
        if !seen.insert(at.bp) {
            continue;
        }
        let slot = |offset: i32| at.bp.checked_add_signed(i64::from(offset));
        let Some(marker) = slot(layout.frame.context_or_marker).and_then(&read_stack) else {
            continue;
        };
        if layout.smi(marker).is_some() {
            continue;
        }
        let Some(function) = slot(layout.frame.function).and_then(&read_stack) else {
            continue;
        };
        if layout.is_heap_object(function) {
            found.push((index, function));
        }
    }
    found
}

/// A stack without its JavaScript frames (native and Python ones kept).
pub fn without_js(stack: &[u64]) -> Vec<u64> {
    stack.iter().copied().filter(|&e| !is_js_frame(e)).collect()
}

/// The native entries of a stack (neither JavaScript nor Python frames).
pub fn native_entries(stack: &[u64]) -> Vec<u64> {
    stack
        .iter()
        .copied()
        .filter(|&e| e & TAG_BITS == 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    use crate::v8::layout::tests::node20_constants;

    fn layout() -> V8Layout {
        V8Layout::from_constants(&node20_constants()).expect("layout")
    }

    fn name(function: &str) -> JsFrameName {
        JsFrameName {
            function: Arc::from(function),
            file: Arc::from("/app/main.js"),
            line: 1,
        }
    }

    #[test]
    fn ids_are_tagged_apart_from_python_and_bounded() {
        let mut table = JsFrameTable::new(3);
        let hot = table.intern(name("hot"));
        assert!(is_js_frame(hot));
        assert!(!crate::python::frames::is_python_frame(hot));
        assert!(!is_js_frame(crate::python::frames::PYTHON_FRAME_TAG | 1));
        assert_eq!(table.intern(name("hot")), hot);
        table.intern(name("caller"));
        let over = table.intern(name("third"));
        assert_eq!(table.intern(name("fourth")), over);
        assert_eq!(table.get(over).map(|n| &*n.function), Some(OVER_CAPACITY));
        assert_eq!(table.get(hot), Some(&name("hot")));
        assert_eq!(table.get(0x4000), None);
        assert_eq!(native_entries(&[0x4000, hot, 0x5000]), vec![0x4000, 0x5000]);
        table.clear();
        assert!(table.is_empty());
    }

    #[test]
    fn frames_with_markers_shared_pointers_or_native_code_are_not_javascript() {
        let layout = layout();
        let smi = |v: u64| v << 32;
        // Stack words by address: four frames' slots.
        let stack: HashMap<u64, u64> = [
            (0x1000 - 8, 0x7001),  // JIT frame: context
            (0x1000 - 16, 0xa001), // its function
            (0x2000 - 8, smi(1)),  // entry frame: a Smi marker
            (0x2000 - 16, 0xb001),
            (0x3000 - 8, 0x7001), // interpreted frame
            (0x3000 - 16, 0xc001),
            (0x4000 - 8, 0x7001), // a native frame's stale bp
            (0x4000 - 16, 0xd001),
        ]
        .into_iter()
        .collect();
        let frames = [0x10, 0x20, 0x30, 0x40, 0x50, 0x60];
        let bp = |bp| FrameRegisters { sp: 0, bp };
        let registers = [
            bp(0x1000),
            bp(0x2000),
            bp(0x3000),
            bp(0x3000),
            bp(0x4000),
            bp(0x1000),
        ];
        let kind = |pc| match pc {
            0x10 => CodeKind::Jit,
            0x50 => CodeKind::Native,
            _ => CodeKind::Builtin,
        };
        let found = function_slots(&layout, &frames, &registers, kind, |a| {
            stack.get(&a).copied()
        });
        // Frame 2 shares its bp with frame 3, which owns it; frame 5 reuses
        // frame 0's.
        assert_eq!(found, vec![(0, 0xa001), (3, 0xc001)]);
        let woven = crate::v8::inlining::weave(
            &frames,
            &[
                (0, CodeKind::Jit, JS_FRAME_TAG),
                (3, CodeKind::Builtin, JS_FRAME_TAG | 1),
            ],
        );
        assert_eq!(
            woven,
            vec![JS_FRAME_TAG, 0x20, 0x30, JS_FRAME_TAG | 1, 0x40, 0x50, 0x60]
        );
    }
}
