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

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Error as FramehopError, ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

use crate::abi::{MAX_STACK_DEPTH, StackSnapshot};
use crate::proc_maps::{MapEntry, MappingKind};
use crate::process_info::{FileIdentity, MappedFile, ProcessSnapshot};
use crate::unwind_info::{self, SectionBytes, UnwindInfoError, UnwindInfoLimits, UnwindSections};

mod go_frames;
use go_frames::{GoFrames, GoModule, GoObject};

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

/// Settings of the unwinder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackUnwinderConfig {
    /// Per-object caps.
    pub limits: UnwindInfoLimits,
    /// Bytes of unwind sections cached across all objects.
    pub cache_bytes: u64,
    /// Objects remembered (loaded or refused) at most.
    pub max_objects: usize,
}

impl Default for StackUnwinderConfig {
    fn default() -> Self {
        StackUnwinderConfig {
            limits: UnwindInfoLimits::default(),
            cache_bytes: kiln_agent_settings::DEFAULT_UNWIND_CACHE_BYTES,
            max_objects: 4096,
        }
    }
}

/// What the unwinder did since it was created (cumulative).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Samples per outcome.
    pub outcomes: HashMap<&'static str, u64>,
    /// Objects whose unwind info was read, by result (`loaded` or an
    /// [`UnwindInfoError::reason`]).
    pub objects: HashMap<&'static str, u64>,
    /// Objects evicted from the cache to stay in its byte budget.
    pub evictions: u64,
}

/// Identity of an object: its file (never its build id or path, see
/// [`FileIdentity`]), or the vDSO.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ObjectKey {
    File(FileIdentity),
    Vdso,
}

#[derive(Debug)]
struct CachedObject {
    sections: Option<Arc<UnwindSections>>,
    /// A Go binary's functions and the rules read so far.
    go: Option<Arc<GoObject>>,
    bytes: u64,
    last_used: u64,
    /// The window a process was last read with it.
    last_window: u64,
    /// Refused for want of room in its window: read again in the next.
    over_budget: bool,
}

/// Windows an object may go unused before it is dropped: long enough
/// that a compiler's libraries stay through a build (each compiler
/// process reads them again), short enough that the objects of processes
/// that ran once leave within half a minute of the window they ran in.
const IDLE_WINDOWS: u64 = 3;

/// One process's modules, built for the current window.
struct ProcessModules {
    unwinder: UnwinderX86_64<SectionBytes>,
    cache: CacheX86_64,
    /// Address ranges with CFI.
    covered: Vec<Range<u64>>,
    /// Executable mappings the snapshot knew of, sorted.
    mapped: Vec<Range<u64>>,
    /// Mappings of Go binaries walked by Go's own rules.
    go: Vec<GoModule>,
    /// Mappings whose objects no walk has needed yet, sorted by start.
    unread: Vec<UnreadMapping>,
}

/// A mapping whose object is read when a walk first needs it.
#[derive(Debug, Clone)]
struct UnreadMapping {
    entry: MapEntry,
    file: Option<Arc<MappedFile>>,
    key: ObjectKey,
}

/// Unwinds stack snapshots of many processes; see the module docs.
pub struct StackUnwinder {
    config: StackUnwinderConfig,
    objects: HashMap<ObjectKey, CachedObject>,
    cached_bytes: u64,
    clock: u64,
    window: u64,
    processes: HashMap<(u32, u64), ProcessModules>,
    stats: UnwindStats,
}

impl std::fmt::Debug for StackUnwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackUnwinder")
            .field("config", &self.config)
            .field("objects", &self.objects.len())
            .field("cached_bytes", &self.cached_bytes)
            .field("processes", &self.processes.len())
            .finish_non_exhaustive()
    }
}

impl StackUnwinder {
    /// An empty unwinder.
    pub fn new(config: StackUnwinderConfig) -> StackUnwinder {
        StackUnwinder {
            config,
            objects: HashMap::new(),
            cached_bytes: 0,
            clock: 0,
            window: 0,
            processes: HashMap::new(),
            // Every outcome is reported from the start, at zero, so rates
            // and alerts on it need no special case for "absent".
            stats: UnwindStats {
                outcomes: UnwindOutcome::ALL
                    .iter()
                    .map(|outcome| (outcome.reason(), 0))
                    .collect(),
                ..UnwindStats::default()
            },
        }
    }

    /// Whether the process's modules for this window are built.
    pub fn knows_process(&self, pid: u32, start_boottime_ns: u64) -> bool {
        self.processes.contains_key(&(pid, start_boottime_ns))
    }

    /// Whether `ip` lies in a mapping the process's modules were built
    /// from; `false` suggests a mapping added since (dlopen, JIT).
    pub fn covers_mapping(&self, pid: u32, start_boottime_ns: u64, ip: u64) -> bool {
        self.processes
            .get(&(pid, start_boottime_ns))
            .is_some_and(|p| contains(&p.mapped, ip))
    }

    /// Builds (or rebuilds) the modules of a process from its snapshot.
    pub fn load_process(&mut self, process: &ProcessSnapshot) {
        let mut mapped = Vec::new();
        let mut unread = Vec::new();
        for (entry, file) in process.maps.iter().zip(&process.files) {
            mapped.push(entry.start..entry.end);
            let key = match (&entry.kind, file) {
                (MappingKind::File { .. }, Some(file)) => object_key(file),
                (MappingKind::Special(name), _) if name == "[vdso]" => ObjectKey::Vdso,
                _ => continue,
            };
            unread.push(UnreadMapping {
                entry: entry.clone(),
                file: file.clone(),
                key,
            });
        }
        self.processes.insert(
            (process.pid, process.start_boottime_ns),
            ProcessModules {
                unwinder: UnwinderX86_64::new(),
                cache: CacheX86_64::new(),
                covered: Vec::new(),
                mapped,
                go: Vec::new(),
                unread,
            },
        );
    }

    /// Reads the objects of the process's mappings that `snapshot` may
    /// walk through: the one holding its instruction pointer and those
    /// holding a value on its copied stack (every return address is one).
    /// A process maps dozens of libraries and a walk touches a few; the
    /// others are never read.
    fn read_walked_objects(&mut self, snapshot: &StackSnapshot<'_>) {
        let key = (snapshot.pid, snapshot.start_boottime_ns);
        let Some(process) = self.processes.get_mut(&key) else {
            return;
        };
        if process.unread.is_empty() {
            return;
        }
        let mut wanted = vec![false; process.unread.len()];
        let mut mark = |value: u64| {
            let after = process
                .unread
                .partition_point(|mapping| mapping.entry.start <= value);
            if let Some(index) = after.checked_sub(1)
                && value < process.unread[index].entry.end
            {
                wanted[index] = true;
            }
        };
        mark(snapshot.ip);
        for word in snapshot.stack.chunks_exact(8) {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word);
            mark(u64::from_le_bytes(bytes));
        }
        if !wanted.contains(&true) {
            return;
        }
        let mut to_read = Vec::new();
        let mut index = 0;
        process.unread.retain(|mapping| {
            let read = wanted[index];
            index += 1;
            if read {
                to_read.push(mapping.clone());
            }
            !read
        });
        let mut modules = Vec::new();
        for mapping in to_read {
            let Some((sections, go_object)) = self.sections(mapping.key, mapping.file.as_ref())
            else {
                continue;
            };
            modules.push((mapping.entry, sections, go_object));
        }
        let Some(process) = self.processes.get_mut(&key) else {
            return;
        };
        for (entry, sections, go_object) in modules {
            if let Some(object) = go_object
                && let Some(base_avma) = sections.base_avma(entry.start, entry.file_offset)
            {
                process.go.push(GoModule {
                    range: entry.start..entry.end,
                    base_avma,
                    object,
                });
            }
            if sections.has_cfi()
                && let Some(module) = build_module(&entry, &sections)
            {
                process.covered.push(entry.start..entry.end);
                process.unwinder.add_module(module);
            }
        }
    }

    /// Unwinds one snapshot with the modules of its process (frame pointers
    /// only when the process was never read).
    pub fn unwind(&mut self, snapshot: &StackSnapshot<'_>) -> UnwoundStack {
        self.unwind_with_runtime(snapshot, &NoRuntime)
    }

    /// [`StackUnwinder::unwind`], with the process's runtime asked first
    /// about every frame (see [`RuntimeUnwinder`]).
    pub fn unwind_with_runtime(
        &mut self,
        snapshot: &StackSnapshot<'_>,
        runtime: &dyn RuntimeUnwinder,
    ) -> UnwoundStack {
        self.read_walked_objects(snapshot);
        let registers = (snapshot.ip, snapshot.sp, snapshot.bp);
        let stack = match self
            .processes
            .get_mut(&(snapshot.pid, snapshot.start_boottime_ns))
        {
            Some(process) => {
                let covered = &process.covered;
                let go = GoFrames {
                    modules: &process.go,
                    then: runtime,
                };
                walk_stack_with_runtime(
                    &process.unwinder,
                    &mut process.cache,
                    registers,
                    snapshot.stack,
                    |pc| contains(covered, pc),
                    &go,
                )
            }
            None => walk_stack_with_runtime(
                &UnwinderX86_64::new(),
                &mut CacheX86_64::new(),
                registers,
                snapshot.stack,
                |_| false,
                runtime,
            ),
        };
        *self
            .stats
            .outcomes
            .entry(stack.outcome.reason())
            .or_default() += 1;
        stack
    }

    /// Drops every process's modules, and the objects unused for
    /// [`IDLE_WINDOWS`] windows: called at the end of each window.
    pub fn end_window(&mut self) {
        self.processes.clear();
        let keep_since = self.window.saturating_sub(IDLE_WINDOWS - 1);
        let cached_bytes = &mut self.cached_bytes;
        self.objects.retain(|_, object| {
            let keep = object.last_window >= keep_since && !object.over_budget;
            if !keep {
                *cached_bytes -= object.bytes;
            }
            keep
        });
        self.window += 1;
    }

    /// Cumulative statistics.
    pub fn stats(&self) -> &UnwindStats {
        &self.stats
    }

    /// Bytes of unwind sections cached now.
    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    fn sections(
        &mut self,
        key: ObjectKey,
        file: Option<&Arc<MappedFile>>,
    ) -> Option<(Arc<UnwindSections>, Option<Arc<GoObject>>)> {
        self.clock += 1;
        if let Some(cached) = self.objects.get_mut(&key) {
            cached.last_used = self.clock;
            cached.last_window = self.window;
            return Some((cached.sections.clone()?, cached.go.clone()));
        }
        // The objects this window's processes map stay in memory whatever
        // the cache evicts (their modules hold them), so the budget bounds
        // them too: an object that does not fit beside them waits for the
        // next window (frame pointers until then), at the cost of reading
        // its headers, not its sections.
        let in_use: u64 = self
            .objects
            .values()
            .filter(|object| object.last_window == self.window)
            .map(|object| object.bytes)
            .sum();
        let room = self.config.cache_bytes.saturating_sub(in_use);
        let mut limits = self.config.limits;
        limits.max_bytes_per_object = limits.max_bytes_per_object.min(room);
        let result = match (&key, file) {
            (ObjectKey::Vdso, _) => read_own_vdso(&limits),
            (_, Some(file)) => unwind_info::read_from_file(&file.file, &limits),
            (_, None) => return None,
        };
        let mut over_budget = false;
        let sections = match result {
            // What it holds beyond its sections (segments, a Go index) must
            // fit too.
            Ok(sections) if sections.held_bytes() > room => {
                *self.stats.objects.entry("over_budget").or_default() += 1;
                over_budget = true;
                None
            }
            Ok(sections) => {
                *self.stats.objects.entry("loaded").or_default() += 1;
                Some(Arc::new(sections))
            }
            Err(UnwindInfoError::TooLarge { bytes, .. })
                if bytes <= self.config.limits.max_bytes_per_object =>
            {
                *self.stats.objects.entry("over_budget").or_default() += 1;
                over_budget = true;
                None
            }
            Err(error) => {
                *self.stats.objects.entry(error.reason()).or_default() += 1;
                if matches!(error, UnwindInfoError::TooLarge { .. }) {
                    tracing::info!(
                        object = file.map_or("[vdso]", |f| f.path.as_str()),
                        %error,
                        "unwinding this object by frame pointer"
                    );
                } else {
                    tracing::debug!(
                        object = file.map_or("[vdso]", |f| f.path.as_str()),
                        %error,
                        "no usable unwind info"
                    );
                }
                None
            }
        };
        let go = match (&sections, file) {
            (Some(sections), Some(file)) => {
                GoObject::new(sections.clone(), file.clone()).map(Arc::new)
            }
            _ => None,
        };
        let bytes = sections.as_ref().map_or(0, |s| s.held_bytes());
        self.make_room(bytes);
        self.cached_bytes += bytes;
        self.objects.insert(
            key,
            CachedObject {
                sections: sections.clone(),
                go: go.clone(),
                bytes,
                last_used: self.clock,
                last_window: self.window,
                over_budget,
            },
        );
        Some((sections?, go))
    }

    /// Evicts least recently used objects until `incoming` more bytes (and
    /// one more object) fit the budgets; objects this window's processes
    /// map are not evicted, as their modules hold them anyway.
    fn make_room(&mut self, incoming: u64) {
        while self.cached_bytes + incoming > self.config.cache_bytes
            || self.objects.len() >= self.config.max_objects
        {
            let window = self.window;
            let Some(oldest) = self
                .objects
                .iter()
                .filter(|(_, object)| object.last_window < window)
                .min_by_key(|(_, object)| object.last_used)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            if let Some(object) = self.objects.remove(&oldest) {
                self.cached_bytes -= object.bytes;
                self.stats.evictions += 1;
            }
        }
    }
}

fn contains(ranges: &[Range<u64>], address: u64) -> bool {
    ranges.iter().any(|range| range.contains(&address))
}

fn object_key(file: &MappedFile) -> ObjectKey {
    ObjectKey::File(file.identity)
}

/// A framehop module for one executable mapping of an object.
fn build_module(entry: &MapEntry, sections: &UnwindSections) -> Option<Module<SectionBytes>> {
    let base_avma = sections.base_avma(entry.start, entry.file_offset)?;
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: sections.text_svma.clone(),
        got_svma: sections.got_svma.clone(),
        eh_frame_svma: sections.eh_frame.as_ref().map(|(range, _)| range.clone()),
        eh_frame: sections.eh_frame.as_ref().map(|(_, bytes)| bytes.clone()),
        eh_frame_hdr_svma: sections
            .eh_frame_hdr
            .as_ref()
            .map(|(range, _)| range.clone()),
        eh_frame_hdr: sections
            .eh_frame_hdr
            .as_ref()
            .map(|(_, bytes)| bytes.clone()),
        debug_frame: sections.debug_frame.clone(),
        ..ExplicitModuleSectionInfo::default()
    };
    Some(Module::new(
        entry.display_name().to_owned(),
        entry.start..entry.end,
        base_avma,
        info,
    ))
}

/// The vDSO is the same object in every process of this kernel; the agent
/// reads its own copy.
fn read_own_vdso(limits: &UnwindInfoLimits) -> Result<UnwindSections, UnwindInfoError> {
    // SAFETY: getauxval only reads the process's auxiliary vector.
    let start = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if start == 0 {
        return Err(UnwindInfoError::NoUnwindInfo);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| UnwindInfoError::NotElf)?;
    let entry = crate::proc_maps::parse_executable_maps(&maps)
        .map_err(|_| UnwindInfoError::NotElf)?
        .into_iter()
        .find(|e| e.contains(start))
        .ok_or(UnwindInfoError::NotElf)?;
    let len =
        usize::try_from(entry.end.saturating_sub(start)).map_err(|_| UnwindInfoError::NotElf)?;
    // SAFETY: [start, entry.end) is the vDSO's executable mapping in this
    // process, readable and never unmapped while the process lives.
    let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
    unwind_info::read_unwind_sections(bytes, limits)
}
