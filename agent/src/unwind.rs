//! Userspace unwinding of stack snapshots: the kernel copied a sampled
//! thread's registers and the top of its user stack; this walks it with each
//! mapped object's `.eh_frame` (framehop's DWARF CFI unwinder), and with
//! frame pointers for code that has no unwind info (JIT code, objects over
//! the cap or with broken CFI).
//!
//! Unwind sections are cached per object (its file identity), in
//! a byte budget, and shared by every process that maps the object; an
//! object no process was read with for a few windows is dropped (a build's
//! build scripts and proc macros run once). A
//! process's module list is built once per window from its snapshot, so
//! `dlopen`ed libraries are seen, and dropped at the window's end, so no
//! evicted section outlives the window.

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Error as FramehopError, FrameAddress, Unwinder};

use crate::abi::MAX_STACK_DEPTH;
use crate::unwind_info::SectionBytes;

mod go_frames;
mod stack_unwinder;

pub use stack_unwinder::{StackUnwinder, StackUnwinderConfig, UnwindStats};

/// How one sample's user stack came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnwindOutcome {
    /// Reached the stack's root (CFI marks the end, or the frame chain ends).
    Complete,
    /// Every frame had unwind info but the copied stack ran out, or the
    /// depth cap was hit, before the root.
    Truncated,
    /// At least one frame was walked by frame pointer because its code had
    /// no usable unwind info (JIT code, objects refused or without CFI).
    FramePointerFallback,
    /// No frame could be read past the first (no module covers the
    /// instruction pointer and the frame pointer chain is unusable).
    NoUnwindInfo,
    /// The thread had no user context (a kernel thread).
    NoUserStack,
    /// The unwinder failed on this stack's unwind info (kept: the leaf).
    UnwinderFault,
}

impl UnwindOutcome {
    /// Every outcome, for metrics.
    pub const ALL: [UnwindOutcome; 6] = [
        UnwindOutcome::Complete,
        UnwindOutcome::Truncated,
        UnwindOutcome::FramePointerFallback,
        UnwindOutcome::NoUnwindInfo,
        UnwindOutcome::NoUserStack,
        UnwindOutcome::UnwinderFault,
    ];

    /// A fixed name for metrics.
    pub fn reason(self) -> &'static str {
        match self {
            UnwindOutcome::Complete => "complete",
            UnwindOutcome::Truncated => "truncated",
            UnwindOutcome::FramePointerFallback => "fallback_frame_pointer",
            UnwindOutcome::NoUnwindInfo => "no_unwind_info",
            UnwindOutcome::NoUserStack => "no_user_stack",
            UnwindOutcome::UnwinderFault => "unwinder_fault",
        }
    }
}

/// A walked user stack: instruction pointer first, then return addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwoundStack {
    /// Addresses, leaf first.
    pub frames: Vec<u64>,
    /// The stack and frame pointer registers at each frame of `frames`
    /// (the sampled ones at the leaf, the unwound ones above): where a
    /// runtime finds what it keeps in its frames (a JavaScript function, a
    /// JVM method). Empty only where `frames` is.
    pub registers: Vec<FrameRegisters>,
    /// How the walk ended.
    pub outcome: UnwindOutcome,
}

/// The stack and frame pointer registers at one frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameRegisters {
    pub sp: u64,
    pub bp: u64,
}

/// A frame that a language runtime's unwinder (a JIT's) walked instead of
/// the CFI unwinder: where its caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeStep {
    /// The caller's return address and registers.
    Caller { pc: u64, registers: FrameRegisters },
    /// The runtime knows this frame is its stack's root.
    Root,
}

/// Unwinds the frames of one process's runtime code that has no CFI and
/// may keep no frame pointer (a JIT's compiled methods). Asked first for
/// every frame; `None` leaves the frame to the CFI unwinder (and its
/// frame-pointer fallback).
pub trait RuntimeUnwinder {
    /// The caller of the frame at `pc` (already moved back into the call
    /// for return addresses) with `registers`, reading the copied stack
    /// with `read_stack`; `None` when `pc` is not the runtime's.
    fn step(
        &self,
        pc: u64,
        registers: FrameRegisters,
        read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<RuntimeStep>;
}

/// No runtime: every frame is the CFI unwinder's.
#[derive(Debug)]
pub struct NoRuntime;

impl RuntimeUnwinder for NoRuntime {
    fn step(
        &self,
        _: u64,
        _: FrameRegisters,
        _: &mut dyn FnMut(u64) -> Result<u64, ()>,
    ) -> Option<RuntimeStep> {
        None
    }
}

/// Walks one stack through `unwinder`, reading memory from `stack` (the
/// bytes at `sp`), with `covered(pc)` telling whether a pc has CFI.
/// Pure: no IO, bounded by [`MAX_STACK_DEPTH`] frames.
pub fn walk_stack(
    unwinder: &UnwinderX86_64<SectionBytes>,
    cache: &mut CacheX86_64,
    registers: (u64, u64, u64),
    stack: &[u8],
    covered: impl Fn(u64) -> bool,
) -> UnwoundStack {
    walk_stack_with_runtime(unwinder, cache, registers, stack, covered, &NoRuntime)
}

/// [`walk_stack`], with `runtime` asked first about every frame.
pub fn walk_stack_with_runtime(
    unwinder: &UnwinderX86_64<SectionBytes>,
    cache: &mut CacheX86_64,
    registers: (u64, u64, u64),
    stack: &[u8],
    covered: impl Fn(u64) -> bool,
    runtime: &dyn RuntimeUnwinder,
) -> UnwoundStack {
    let (ip, sp, bp) = registers;
    if ip == 0 {
        return UnwoundStack {
            frames: Vec::new(),
            registers: Vec::new(),
            outcome: UnwindOutcome::NoUserStack,
        };
    }
    let stack_end = sp.saturating_add(stack.len() as u64);
    let mut read_stack = |address: u64| -> Result<u64, ()> {
        let offset = address.checked_sub(sp).ok_or(())?;
        let offset = usize::try_from(offset).map_err(|_| ())?;
        let bytes = stack
            .get(offset..offset.checked_add(8).ok_or(())?)
            .ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    };
    // The unwinder parses CFI that a hostile container controls. The ELF
    // and search-table checks in `unwind_info` and the property tests cover
    // what is known; a panic in the parsers beyond that costs this one stack
    // (and the process's rule cache), never the collector thread.
    let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut frames = Vec::with_capacity(32);
        let mut frame_registers = Vec::with_capacity(32);
        let mut used_fallback = false;
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut address = FrameAddress::InstructionPointer(ip);
        let end = loop {
            if frames.len() >= MAX_STACK_DEPTH {
                break Err(None);
            }
            let at = FrameRegisters {
                sp: regs.sp(),
                bp: regs.bp(),
            };
            frames.push(address.address());
            frame_registers.push(at);
            let lookup = address.address_for_lookup();
            let next = match runtime.step(lookup, at, &mut read_stack) {
                Some(RuntimeStep::Caller { pc, registers }) => {
                    regs.set_sp(registers.sp);
                    regs.set_bp(registers.bp);
                    Ok(Some(pc))
                }
                Some(RuntimeStep::Root) => Ok(None),
                None => {
                    // The caller of this frame is found with this frame's
                    // rule; code without CFI gets the frame-pointer rule.
                    if !covered(lookup) {
                        used_fallback = true;
                    }
                    unwinder.unwind_frame(address, &mut regs, &mut *cache, &mut read_stack)
                }
            };
            match next {
                Ok(Some(return_address)) => match FrameAddress::from_return_address(return_address)
                {
                    Some(caller) => address = caller,
                    None => break Err(Some(FramehopError::ReturnAddressIsNull)),
                },
                Ok(None) => break Ok(()),
                Err(error) => break Err(Some(error)),
            }
        };
        (frames, frame_registers, used_fallback, end)
    }));
    let Ok((frames, registers, used_fallback, end)) = walked else {
        *cache = CacheX86_64::new();
        return UnwoundStack {
            frames: vec![ip],
            registers: vec![FrameRegisters { sp, bp }],
            outcome: UnwindOutcome::UnwinderFault,
        };
    };
    // The last frame's rule was never used if the walk ended on it cleanly.
    let outcome = match end {
        Ok(()) if used_fallback && frames.len() > 1 => UnwindOutcome::FramePointerFallback,
        Ok(()) => UnwindOutcome::Complete,
        Err(None) => UnwindOutcome::Truncated,
        Err(Some(FramehopError::CouldNotReadStack(address)))
            if address >= stack_end && !used_fallback =>
        {
            UnwindOutcome::Truncated
        }
        Err(Some(_)) if frames.len() <= 1 => UnwindOutcome::NoUnwindInfo,
        Err(Some(_)) if used_fallback => UnwindOutcome::FramePointerFallback,
        // CFI walks end in an error on stacks whose root is not annotated
        // (some runtimes' thread entry points); the frames found are right.
        Err(Some(_)) => UnwindOutcome::Complete,
    };
    UnwoundStack {
        frames,
        registers,
        outcome,
    }
}
