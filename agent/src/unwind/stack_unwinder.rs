//! [`StackUnwinder`]: the unwind sections of every mapped object, cached
//! in a byte budget and shared by the processes that map it, and each
//! process's module list for the current window (see the parent module).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};

use super::go_frames::{GoFrames, GoModule, GoObject};
use super::{NoRuntime, RuntimeUnwinder, UnwindOutcome, UnwoundStack, walk_stack_with_runtime};
use crate::abi::StackSnapshot;
use crate::proc_maps::{MapEntry, MappingKind};
use crate::process_info::{FileIdentity, MappedFile, ProcessSnapshot};
use crate::unwind_info::{self, SectionBytes, UnwindInfoError, UnwindInfoLimits, UnwindSections};

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
