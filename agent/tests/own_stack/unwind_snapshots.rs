//! The `.eh_frame` unwinder on real stacks, without root: this test process
//! captures its own registers and stack the way the BPF program does, and
//! the unwinder must walk back through the callers. Hostile unwind info
//! (random and mutated `.eh_frame`) must never panic, loop or overrun.

use framehop::x86_64::{CacheX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use kiln_agent::abi::{PyStatus, SampleKind, StackSnapshot};
use kiln_agent::process_info::{ProcessTable, parse_stat_start_ticks};
use kiln_agent::unwind::{StackUnwinder, StackUnwinderConfig, UnwindOutcome, walk_stack};
use kiln_agent::unwind_info::{
    SectionBytes, UnwindInfoLimits, read_unwind_sections, search_table_is_sound,
};
use proptest::prelude::*;

use crate::capture::{CapturedStack as Captured, capture_own_stack as capture};

#[inline(never)]
fn middle_frame(depth: u32) -> (Captured, u64) {
    let captured = if depth == 0 {
        capture()
    } else {
        middle_frame(depth - 1).0
    };
    (captured, std::hint::black_box(depth as u64))
}

#[inline(never)]
fn outer_frame() -> Captured {
    let (captured, _) = middle_frame(std::hint::black_box(3));
    std::hint::black_box(&captured);
    captured
}

fn own_start_ns(table_ticks: u64) -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
    let ticks = parse_stat_start_ticks(&stat).expect("start time");
    ticks * (1_000_000_000 / table_ticks)
}

fn snapshot_of(captured: &Captured, pid: u32, start: u64) -> StackSnapshot<'_> {
    StackSnapshot {
        pid,
        tid: 0,
        cgroup_id: 0,
        start_boottime_ns: start,
        ip: captured.ip,
        sp: captured.sp,
        bp: captured.bp,
        comm: [0; 16],
        kind: SampleKind::Cpu,
        off_cpu_ns: 0,
        kernel: Vec::new(),
        py_status: PyStatus::None,
        py_frames: Vec::new(),
        stack: &captured.stack,
    }
}

/// Whether some frame is a return address inside `function` (its code is
/// within a few KiB of its entry point in this unoptimized-or-not build).
fn has_frame_in(frames: &[u64], function: usize) -> bool {
    let start = function as u64;
    frames
        .iter()
        .skip(1)
        .any(|&f| f > start && f < start + 4096)
}

#[test]
fn own_stack_unwinds_through_every_caller_with_eh_frame() {
    let captured = outer_frame();
    let pid = std::process::id();
    let mut table = ProcessTable::new(16, 64);
    let start = own_start_ns(100);
    let process = table.refresh(pid, start).expect("own process is readable");
    let mut unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    unwinder.load_process(&process);
    let stack = unwinder.unwind(&snapshot_of(&captured, pid, start));
    assert!(
        stack.frames.len() >= 5,
        "capture, 4 x middle_frame, outer_frame at least: {:x?}",
        stack.frames
    );
    assert!(
        has_frame_in(
            &stack.frames,
            middle_frame as fn(u32) -> (Captured, u64) as usize
        ),
        "middle_frame is a caller: {:x?}",
        stack.frames
    );
    assert!(
        has_frame_in(&stack.frames, outer_frame as fn() -> Captured as usize),
        "outer_frame is a caller: {:x?}",
        stack.frames
    );
    assert_ne!(stack.outcome, UnwindOutcome::NoUnwindInfo);
    assert!(
        unwinder.stats().objects.get("loaded").copied().unwrap_or(0) >= 2,
        "the test binary and libc were loaded: {:?}",
        unwinder.stats()
    );
    assert!(unwinder.cached_bytes() > 0);
}

/// Issue 48: objects of processes that ran once (a build's build scripts)
/// leave the cache a few windows later; those read again stay.
#[test]
fn objects_unused_for_a_few_windows_leave_the_cache() {
    let pid = std::process::id();
    let mut table = ProcessTable::new(16, 64);
    let start = own_start_ns(100);
    let process = table.refresh(pid, start).expect("own process");
    let snapshot = outer_frame();
    let snapshot = snapshot_of(&snapshot, pid, start);
    let mut unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    for _ in 0..6 {
        unwinder.load_process(&process);
        unwinder.unwind(&snapshot);
        unwinder.end_window();
    }
    let held = unwinder.cached_bytes();
    assert!(held > 0);
    let loaded = unwinder.stats().objects.get("loaded").copied().unwrap_or(0);
    for _ in 0..2 {
        unwinder.end_window();
    }
    assert_eq!(unwinder.cached_bytes(), held, "kept for a while");
    unwinder.end_window();
    assert_eq!(unwinder.cached_bytes(), 0, "dropped once idle");
    unwinder.load_process(&process);
    unwinder.unwind(&snapshot);
    assert_eq!(
        unwinder.stats().objects.get("loaded").copied().unwrap_or(0),
        2 * loaded,
        "read again"
    );
}

/// The objects a window's processes map are held by their modules whatever
/// the cache evicts, so the budget bounds them too: past it an object is
/// refused for the window (its headers read, never its sections) and read
/// in the next window that has room.
#[test]
fn objects_past_the_budget_wait_for_a_window_with_room() {
    let pid = std::process::id();
    let mut table = ProcessTable::new(16, 64);
    let start = own_start_ns(100);
    let process = table.refresh(pid, start).expect("own process");
    let snapshot = outer_frame();
    let snapshot = snapshot_of(&snapshot, pid, start);
    let mut whole = StackUnwinder::new(StackUnwinderConfig::default());
    whole.load_process(&process);
    whole.unwind(&snapshot);
    let all = whole.cached_bytes();
    let loaded = whole.stats().objects.get("loaded").copied().unwrap_or(0);
    assert!(loaded >= 2, "the test binary and libc: {:?}", whole.stats());

    // A budget that holds all but the smallest object.
    let mut tight = StackUnwinder::new(StackUnwinderConfig {
        cache_bytes: all - 1,
        ..StackUnwinderConfig::default()
    });
    tight.load_process(&process);
    tight.unwind(&snapshot);
    assert!(tight.cached_bytes() < all, "within the budget");
    let refused = tight
        .stats()
        .objects
        .get("over_budget")
        .copied()
        .unwrap_or(0);
    assert!(refused >= 1, "{:?}", tight.stats());
    // Read again in the same window: still refused, not read again.
    tight.load_process(&process);
    tight.unwind(&snapshot);
    assert_eq!(
        tight.stats().objects.get("over_budget").copied(),
        Some(refused),
        "a refusal holds for its window"
    );
    tight.end_window();
    tight.load_process(&process);
    tight.unwind(&snapshot);
    assert!(
        tight
            .stats()
            .objects
            .get("over_budget")
            .copied()
            .unwrap_or(0)
            > refused,
        "tried again in the next window"
    );
    assert!(tight.cached_bytes() < all);
}

#[test]
fn without_unwind_info_the_walk_falls_back_to_frame_pointers() {
    let captured = outer_frame();
    let mut unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    // No process loaded: every frame is walked by frame pointer.
    let stack = unwinder.unwind(&snapshot_of(&captured, 1, 1));
    assert!(!stack.frames.is_empty());
    assert_eq!(stack.frames[0], captured.ip);
    assert!(matches!(
        stack.outcome,
        UnwindOutcome::FramePointerFallback | UnwindOutcome::NoUnwindInfo
    ));
}

#[test]
fn a_cut_stack_is_reported_as_truncated() {
    let mut captured = outer_frame();
    let pid = std::process::id();
    let mut table = ProcessTable::new(16, 64);
    let start = own_start_ns(100);
    let process = table.refresh(pid, start).expect("own process");
    let mut unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    unwinder.load_process(&process);
    let full = unwinder.unwind(&snapshot_of(&captured, pid, start));
    captured.stack.truncate(64);
    let cut = unwinder.unwind(&snapshot_of(&captured, pid, start));
    assert!(cut.frames.len() < full.frames.len());
    assert_eq!(cut.outcome, UnwindOutcome::Truncated);
}

#[test]
fn kernel_threads_have_no_user_stack() {
    let mut unwinder = StackUnwinder::new(StackUnwinderConfig::default());
    let empty = [0u8; 0];
    let snapshot = StackSnapshot {
        pid: 2,
        tid: 2,
        cgroup_id: 1,
        start_boottime_ns: 0,
        ip: 0,
        sp: 0,
        bp: 0,
        comm: [0; 16],
        kind: SampleKind::Cpu,
        off_cpu_ns: 0,
        kernel: vec![0xffff_ffff_8100_0000],
        py_status: PyStatus::None,
        py_frames: Vec::new(),
        stack: &empty,
    };
    let stack = unwinder.unwind(&snapshot);
    assert_eq!(stack.outcome, UnwindOutcome::NoUserStack);
    assert!(stack.frames.is_empty());
}

/// A module over [0x1000, 0x100000) with the given bytes as its unwind info.
fn hostile_unwinder(
    eh_frame: Vec<u8>,
    eh_frame_svma: u64,
    eh_frame_hdr: Option<Vec<u8>>,
    eh_frame_hdr_svma: u64,
) -> UnwinderX86_64<SectionBytes> {
    let mut unwinder = UnwinderX86_64::new();
    let eh_range = eh_frame_svma..eh_frame_svma + eh_frame.len() as u64;
    // As unwind_info does for real objects: only a sound search table.
    let eh_frame_hdr =
        eh_frame_hdr.filter(|hdr| search_table_is_sound(hdr, eh_frame_hdr_svma, eh_range.clone()));
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(0x1000..0x100000),
        eh_frame_svma: Some(eh_range),
        eh_frame: Some(SectionBytes::from(eh_frame)),
        eh_frame_hdr_svma: eh_frame_hdr
            .as_ref()
            .map(|h| eh_frame_hdr_svma..eh_frame_hdr_svma + h.len() as u64),
        eh_frame_hdr: eh_frame_hdr.map(SectionBytes::from),
        ..ExplicitModuleSectionInfo::default()
    };
    unwinder.add_module(Module::new("hostile".to_owned(), 0x1000..0x100000, 0, info));
    unwinder
}

/// The test binary's `.eh_frame` and `.eh_frame_hdr` with their addresses.
type OwnUnwindInfo = (Vec<u8>, u64, Vec<u8>, u64);

fn own_eh_frame() -> OwnUnwindInfo {
    static OWN: std::sync::OnceLock<OwnUnwindInfo> = std::sync::OnceLock::new();
    OWN.get_or_init(read_own_eh_frame).clone()
}

fn read_own_eh_frame() -> OwnUnwindInfo {
    let bytes = std::fs::read("/proc/self/exe").expect("own executable");
    let sections = read_unwind_sections(bytes.as_slice(), &UnwindInfoLimits::default())
        .expect("own unwind info");
    let (eh_range, eh_frame) = sections.eh_frame.expect(".eh_frame");
    let (hdr_range, hdr) = sections.eh_frame_hdr.expect(".eh_frame_hdr");
    (
        eh_frame.to_vec(),
        eh_range.start,
        hdr.to_vec(),
        hdr_range.start,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Arbitrary bytes as .eh_frame and .eh_frame_hdr, arbitrary registers
    /// and stack: the walk ends, within the depth cap, without panicking.
    #[test]
    fn random_unwind_info_never_panics_or_overruns(
        eh_frame in proptest::collection::vec(any::<u8>(), 0..512),
        hdr in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..128)),
        ip in 0x1000u64..0x100000,
        stack in proptest::collection::vec(any::<u8>(), 0..2048),
        bp_offset in 0u64..4096,
    ) {
        let unwinder = hostile_unwinder(eh_frame, 0x200000, hdr, 0x300000);
        let sp = 0x7fff_0000_0000u64;
        let walked = walk_stack(&unwinder, &mut CacheX86_64::new(), (ip, sp, sp + bp_offset), &stack, |pc| (0x1000..0x100000).contains(&pc));
        prop_assert!(!walked.frames.is_empty());
        prop_assert!(walked.frames.len() <= kiln_agent::abi::MAX_STACK_DEPTH);
    }

    /// A real .eh_frame with bytes flipped: the same guarantees.
    #[test]
    fn mutated_real_unwind_info_never_panics_or_overruns(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        ip in 0x1000u64..0x100000,
        stack in proptest::collection::vec(any::<u8>(), 0..4096),
    ) {
        let (mut eh_frame, eh_svma, mut hdr, hdr_svma) = own_eh_frame();
        for (index, byte) in &flips {
            let i = index.index(eh_frame.len() + hdr.len());
            if i < eh_frame.len() { eh_frame[i] ^= byte } else { hdr[i - eh_frame.len()] ^= byte }
        }
        let unwinder = hostile_unwinder(eh_frame, eh_svma, Some(hdr), hdr_svma);
        let sp = 0x7fff_0000_0000u64;
        let walked = walk_stack(&unwinder, &mut CacheX86_64::new(), (ip, sp, sp + 16), &stack, |_| true);
        prop_assert!(walked.frames.len() <= kiln_agent::abi::MAX_STACK_DEPTH);
    }

    /// Arbitrary bytes as an ELF file: a clean error or bounded sections.
    #[test]
    fn random_elf_bytes_give_errors_not_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        magic in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if magic && bytes.len() >= 6 {
            bytes[..6].copy_from_slice(b"\x7fELF\x02\x01");
        }
        let limits = UnwindInfoLimits::default();
        if let Ok(sections) = read_unwind_sections(bytes.as_slice(), &limits) {
            prop_assert!(sections.held_bytes() <= bytes.len() as u64 + 256 * 32);
        }
    }
}
