//! Go frames walked by Go's own stack-pointer rules (`.gopclntab`), for
//! binaries without CFI: a frameless leaf's caller is where its stack
//! pointer says, not where a frame-pointer walk looks.
//!
//! A function's rules are read from its binary (a few dozen bytes through
//! `pread`) the first time a pc lands in it, then kept with the binary's
//! cached object, within [`MAX_FUNCTIONS_KEPT`]; most of a binary's
//! functions are never sampled.

use std::collections::HashMap;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use super::{FrameRegisters, RuntimeStep, RuntimeUnwinder};
use crate::go_pclntab::{GoFrameRule, GoFunctionRules, WindowedSection};
use crate::process_info::MappedFile;
use crate::unwind_info::UnwindSections;

/// Functions whose rules one binary keeps; past it they are read again.
const MAX_FUNCTIONS_KEPT: usize = 4096;

/// Bytes read at a time for one function's record and table.
const LOOKUP_WINDOW_BYTES: usize = 512;

/// One Go binary's function index and the rules read so far, shared by
/// every process that maps it.
#[derive(Debug)]
pub(super) struct GoObject {
    /// The binary's sections, with its function index and the place of its
    /// `.gopclntab` in the file.
    sections: Arc<UnwindSections>,
    /// The file the rules are read from.
    file: Arc<MappedFile>,
    rules: Mutex<HashMap<u32, Arc<GoFunctionRules>>>,
}

impl GoObject {
    /// `None` unless `sections` holds a Go function index.
    pub fn new(sections: Arc<UnwindSections>, file: Arc<MappedFile>) -> Option<Self> {
        sections.go_functions.as_ref()?;
        Some(GoObject {
            sections,
            file,
            rules: Mutex::new(HashMap::new()),
        })
    }

    /// The rule at stated address `pc`.
    fn rule(&self, pc: u64) -> Option<GoFrameRule> {
        let (index, (section_offset, section_len)) = self.sections.go_functions.as_ref()?;
        let at = index.function_at(pc)?;
        let offset = pc - at.entry;
        let known = self
            .rules
            .lock()
            .ok()
            .and_then(|rules| rules.get(&at.index).cloned());
        let rules = match known {
            Some(rules) => rules,
            None => {
                let file = &self.file.file;
                let mut source = WindowedSection::with_window(
                    |at, buffer: &mut [u8]| file.read_exact_at(buffer, at).is_ok(),
                    *section_offset,
                    *section_len,
                    LOOKUP_WINDOW_BYTES,
                );
                let rules = Arc::new(index.rules(&mut source, &at));
                if let Ok(mut kept) = self.rules.lock() {
                    if kept.len() >= MAX_FUNCTIONS_KEPT {
                        kept.clear();
                    }
                    kept.insert(at.index, rules.clone());
                }
                rules
            }
        };
        rules.rule_at(offset)
    }
}

/// One executable mapping of a Go binary whose index was read.
#[derive(Debug, Clone)]
pub(super) struct GoModule {
    /// The mapping's addresses.
    pub range: Range<u64>,
    /// Where the binary's address 0 sits in the process.
    pub base_avma: u64,
    pub object: Arc<GoObject>,
}

/// Asks the Go modules of a process first, then `then` (a JIT's unwinder).
pub(super) struct GoFrames<'a> {
    pub modules: &'a [GoModule],
    pub then: &'a dyn RuntimeUnwinder,
}

impl RuntimeUnwinder for GoFrames<'_> {
    fn step(
        &self,
        pc: u64,
        registers: FrameRegisters,
        read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<RuntimeStep> {
        let rule = self
            .modules
            .iter()
            .find(|module| module.range.contains(&pc))
            .and_then(|module| module.object.rule(pc.wrapping_sub(module.base_avma)));
        match rule {
            None => self.then.step(pc, registers, read_stack),
            Some(GoFrameRule::Root) => Some(RuntimeStep::Root),
            Some(GoFrameRule::StackPointerBelowEntry(below)) => {
                go_caller(below, registers, read_stack)
            }
        }
    }
}

/// The caller of a Go frame whose stack pointer is `below` bytes under the
/// one it was entered with: the return address lies there. Go saves the
/// caller's frame pointer just under it and points its own there, once its
/// prologue has run; before that (and in frameless functions) the frame
/// pointer is still the caller's.
fn go_caller(
    below: u32,
    registers: FrameRegisters,
    read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
) -> Option<RuntimeStep> {
    let return_slot = registers.sp.checked_add(u64::from(below))?;
    let pc = read_stack(return_slot).ok()?;
    let caller_sp = return_slot.checked_add(8)?;
    let saved_bp_slot = return_slot.checked_sub(8)?;
    let bp = if below >= 16 && registers.bp == saved_bp_slot {
        read_stack(saved_bp_slot).ok()?
    } else {
        registers.bp
    };
    Some(RuntimeStep::Caller {
        pc,
        registers: FrameRegisters { sp: caller_sp, bp },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copied stack at 0x7000, eight-byte slots.
    fn stack(slots: &[(u64, u64)]) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
        move |address| {
            slots
                .iter()
                .find(|&&(at, _)| at == address)
                .map(|&(_, value)| value)
                .ok_or(())
        }
    }

    #[test]
    fn a_frameless_leaf_returns_to_the_slot_at_its_stack_pointer_and_keeps_the_frame_pointer() {
        let mut read = stack(&[(0x7000, 0x401234)]);
        let step = go_caller(
            0,
            FrameRegisters {
                sp: 0x7000,
                bp: 0x7100,
            },
            &mut read,
        );
        assert_eq!(
            step,
            Some(RuntimeStep::Caller {
                pc: 0x401234,
                registers: FrameRegisters {
                    sp: 0x7008,
                    bp: 0x7100
                }
            })
        );
    }

    #[test]
    fn a_framed_function_restores_the_saved_frame_pointer_once_its_prologue_ran() {
        // 24 bytes of frame: return address at sp+24, saved bp at sp+16.
        let mut read = stack(&[(0x7018, 0x401234), (0x7010, 0x7100)]);
        let after_prologue = go_caller(
            24,
            FrameRegisters {
                sp: 0x7000,
                bp: 0x7010,
            },
            &mut read,
        );
        assert_eq!(
            after_prologue,
            Some(RuntimeStep::Caller {
                pc: 0x401234,
                registers: FrameRegisters {
                    sp: 0x7020,
                    bp: 0x7100
                }
            })
        );
        // Mid-prologue: the frame is allocated, bp not yet moved.
        let mid_prologue = go_caller(
            24,
            FrameRegisters {
                sp: 0x7000,
                bp: 0x7200,
            },
            &mut read,
        );
        assert_eq!(
            mid_prologue,
            Some(RuntimeStep::Caller {
                pc: 0x401234,
                registers: FrameRegisters {
                    sp: 0x7020,
                    bp: 0x7200
                }
            })
        );
        // Past the copied stack: no step.
        assert_eq!(
            go_caller(0x1000, FrameRegisters { sp: 0x7000, bp: 0 }, &mut read),
            None
        );
    }
}
