//! Go frames walked by Go's own stack-pointer rules (`.gopclntab`), for
//! binaries without CFI: a frameless leaf's caller is where its stack
//! pointer says, not where a frame-pointer walk looks (pure).

use std::ops::Range;
use std::sync::Arc;

use super::{FrameRegisters, RuntimeStep, RuntimeUnwinder};
use crate::go_pclntab::GoFrameRule;
use crate::unwind_info::UnwindSections;

/// One executable mapping of a Go binary whose rules were read.
#[derive(Debug, Clone)]
pub(super) struct GoModule {
    /// The mapping's addresses.
    pub range: Range<u64>,
    /// Where the binary's address 0 sits in the process.
    pub base_avma: u64,
    /// The binary's sections, `go_frames` set.
    pub sections: Arc<UnwindSections>,
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
            .and_then(|module| {
                let table = module.sections.go_frames.as_ref()?;
                table.rule(pc.wrapping_sub(module.base_avma))
            });
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
