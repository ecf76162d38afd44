//! One JVM's frames for the stack walk ([`RuntimeUnwinder`]) and their
//! names: compiled methods and stubs with a frame size are left by adding
//! it to the stack pointer (they keep no frame pointer); interpreted
//! frames and frameless stubs by the frame pointer, the interpreter's
//! caller with the stack pointer it had before the interpreter extended
//! the stack (HotSpot's `sender_sp` slot).

use std::cell::RefCell;
use std::collections::HashMap;

use crate::python::memory::ProcessMemory;
use crate::unwind::{FrameRegisters, RuntimeStep, RuntimeUnwinder};

use super::code_cache::{self, BlobKind, CodeBlob};
use super::process::FoundJvm;

/// Code blobs remembered per process and window, by pc.
const MAX_CACHED_BLOBS: usize = 16_384;
/// How far above the frame pointer an interpreter's saved caller stack
/// pointer may lie (its caller's outgoing arguments).
const MAX_SENDER_EXTENSION: u64 = 1 << 20;

/// A JVM process the agent reads.
#[derive(Debug)]
pub struct JvmProcess {
    pub found: FoundJvm,
    pub memory: ProcessMemory,
    /// Blobs by pc (`None`: no blob there), for this window: code is freed
    /// and reused, so nothing is kept across windows.
    blobs: RefCell<HashMap<u64, Option<CodeBlob>>>,
}

impl JvmProcess {
    pub fn new(found: FoundJvm, pid: u32) -> JvmProcess {
        JvmProcess {
            found,
            memory: ProcessMemory::new(pid),
            blobs: RefCell::new(HashMap::new()),
        }
    }

    /// Whether `pc` lies in the code cache.
    pub fn in_code_cache(&self, pc: u64) -> bool {
        self.found.code_cache.contains(&pc)
    }

    /// The code blob that holds `pc`.
    pub fn blob(&self, pc: u64) -> Option<CodeBlob> {
        if !self.in_code_cache(pc) {
            return None;
        }
        if let Some(blob) = self.blobs.borrow().get(&pc) {
            return blob.clone();
        }
        let blob = code_cache::find_blob(&self.memory, &self.found.layout, &self.found.heaps, pc);
        let mut blobs = self.blobs.borrow_mut();
        if blobs.len() >= MAX_CACHED_BLOBS {
            blobs.clear();
        }
        blobs.insert(pc, blob.clone());
        blob
    }

    /// Forgets the window's blobs.
    pub fn end_window(&self) {
        self.blobs.borrow_mut().clear();
    }
}

impl RuntimeUnwinder for JvmProcess {
    fn step(
        &self,
        pc: u64,
        registers: FrameRegisters,
        read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<RuntimeStep> {
        let blob = self.blob(pc)?;
        let FrameRegisters { sp, bp } = registers;
        let (caller_pc, caller) = match blob.kind {
            BlobKind::Interpreter => {
                let return_address = read_stack(bp.checked_add(8)?).ok()?;
                let caller_bp = read_stack(bp).ok()?;
                let raw_sp = bp.checked_add(16)?;
                let slot = bp.wrapping_add_signed(self.found.layout.interpreter_sender_sp_slot * 8);
                let caller_sp = read_stack(slot)
                    .ok()
                    .filter(|&s| s >= raw_sp && s - raw_sp <= MAX_SENDER_EXTENSION)
                    .unwrap_or(raw_sp);
                (
                    return_address,
                    FrameRegisters {
                        sp: caller_sp,
                        bp: caller_bp,
                    },
                )
            }
            _ if blob.frame_bytes >= 16 => {
                if blob.frame_complete.is_some_and(|complete| pc < complete) {
                    // In the prologue: only the return address is pushed.
                    let return_address = read_stack(sp).ok()?;
                    (
                        return_address,
                        FrameRegisters {
                            sp: sp.checked_add(8)?,
                            bp,
                        },
                    )
                } else {
                    let sender_sp = sp.checked_add(blob.frame_bytes)?;
                    let return_address = read_stack(sender_sp - 8).ok()?;
                    let caller_bp = read_stack(sender_sp - 16).ok()?;
                    (
                        return_address,
                        FrameRegisters {
                            sp: sender_sp,
                            bp: caller_bp,
                        },
                    )
                }
            }
            // Stubs without a frame size set up a frame pointer (the call
            // stub) or none: the frame-pointer rule is the CFI unwinder's
            // fallback already.
            _ => return None,
        };
        if caller_pc == 0 {
            return Some(RuntimeStep::Root);
        }
        Some(RuntimeStep::Caller {
            pc: caller_pc,
            registers: caller,
        })
    }
}
