//! JavaScript functions in CPU profiles of V8 processes (Node), without
//! flags in the program.
//!
//! V8's JavaScript frames keep frame pointers, so the walk already finds
//! them; what they lack is names. V8's build exports its object and frame
//! layout as `v8dbg_*` constants ([`symbols`], checked in [`layout`]). For
//! each walked frame whose code may be V8's (JIT code, or the builtins in
//! the V8 object: the interpreter's and baseline code's trampolines), the
//! `JSFunction` is read from the copied stack at the frame pointer
//! ([`frames::function_slots`]); while the process still lives (the
//! collector unwinds within ~100 ms of the sample), its
//! `SharedFunctionInfo`'s name, script and line are read from the heap
//! ([`heap`]), every object checked by its map first, and cached per
//! (process, SharedFunctionInfo) for the window. The frame goes into the
//! stack as a tagged id ([`frames`]), named when profiles are built.
//!
//! Functions that Maglev or TurboFan inlined into a JIT frame's code have
//! no frame of their own: the frame's pc finds its code object ([`code`]),
//! whose source position table and deoptimization data name them
//! ([`inlining`]); they go leafward of the frame, innermost first. Without
//! the constants this needs (before V8 12), a sample names the optimized
//! function alone.
//!
//! Not yet read: the line being run (the line given is the function's
//! first).

pub mod code;
pub mod frames;
pub mod heap;
pub mod inlining;
pub mod layout;
pub mod symbols;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use crate::abi::StackSnapshot;
use crate::metrics::AgentMetrics;
use crate::proc_maps::MappingKind;
use crate::process_info::ProcessTable;
use crate::process_info::{FileIdentity, MappedFile, ProcessSnapshot};
use crate::python::memory::ProcessMemory;
use crate::symbolize::Frame;
use crate::unwind::UnwoundStack;

use code::{OptimizedCode, Scanner};
use frames::{CodeKind, JsFrameName, JsFrameTable};
use heap::{Heap, Memory};
use layout::{CodeLayout, V8Layout};

/// Bytes of script source read per process and window to count lines
/// (each function's once per window; a hostile process's forged positions
/// cost this much).
const SOURCE_BYTES_PER_PROCESS_WINDOW: usize = 16 << 20;
/// Bytes of JIT code scanned per process and window for code objects'
/// headers (a hostile process's forged code costs this much).
const CODE_SCAN_BYTES_PER_PROCESS_WINDOW: u64 = 8 << 20;
/// Code objects, and pcs in none, remembered per process and window.
const CODES_PER_PROCESS_WINDOW: usize = 4096;

/// Bounds of the V8 unwinder's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct V8UnwinderConfig {
    /// Distinct JavaScript frames per window.
    pub frames_per_window: usize,
    /// Functions whose names are remembered per window (all processes).
    pub functions_per_window: usize,
    /// V8 objects whose layout is remembered (by file identity).
    pub layouts: usize,
}

impl Default for V8UnwinderConfig {
    fn default() -> Self {
        V8UnwinderConfig {
            frames_per_window: 65_536,
            functions_per_window: 65_536,
            layouts: 64,
        }
    }
}

/// Counts for `/metrics`, cumulative.
#[derive(Debug, Default, Clone)]
pub struct V8Stats {
    /// V8 processes looked at, by result (`supported`, or why not).
    pub processes: HashMap<&'static str, u64>,
    /// JavaScript frames found in stacks, by result (`named`, or why not).
    pub frames: HashMap<&'static str, u64>,
}

/// A V8 process the agent can name frames of.
#[derive(Debug)]
struct V8Process {
    layout: V8Layout,
    /// Executable mappings of the V8 object (its builtins).
    builtins: Vec<Range<u64>>,
    /// Executable mappings of other files and the kernel's (never V8 code).
    native: Vec<Range<u64>>,
}

impl V8Process {
    fn kind(&self, pc: u64) -> CodeKind {
        if self.builtins.iter().any(|r| r.contains(&pc)) {
            CodeKind::Builtin
        } else if self.native.iter().any(|r| r.contains(&pc)) {
            CodeKind::Native
        } else {
            CodeKind::Jit
        }
    }
}

/// V8 processes and the JavaScript frames of the current window.
#[derive(Debug)]
pub struct V8Unwinder {
    config: V8UnwinderConfig,
    processes: HashMap<(u32, u64), Arc<V8Process>>,
    /// Each looked-at process's last result, so it is counted once.
    outcomes: HashMap<(u32, u64), &'static str>,
    layouts: HashMap<FileIdentity, Result<V8Layout, &'static str>>,
    names: HashMap<(u32, u64, u64), JsFrameName>,
    maps: HashMap<(u32, u64), HashMap<u64, u16>>,
    /// Bytes of script source each process may still have read this window.
    source_budgets: HashMap<(u32, u64), usize>,
    /// Each process's code objects found this window.
    codes: HashMap<(u32, u64), ProcessCode>,
    frames: JsFrameTable,
    stats: V8Stats,
}

impl V8Unwinder {
    /// An unwinder with the given bounds.
    pub fn new(config: V8UnwinderConfig) -> V8Unwinder {
        V8Unwinder {
            config,
            processes: HashMap::new(),
            outcomes: HashMap::new(),
            layouts: HashMap::new(),
            names: HashMap::new(),
            maps: HashMap::new(),
            source_budgets: HashMap::new(),
            codes: HashMap::new(),
            frames: JsFrameTable::new(config.frames_per_window),
            stats: V8Stats::default(),
        }
    }

    /// Looks for V8 in a newly seen process: an executable mapping of
    /// `node` or `libnode.so` whose postmortem constants give a layout.
    /// Refusals are counted by reason and logged once per process.
    pub fn register(&mut self, process: &ProcessSnapshot) {
        let key = (process.pid, process.start_boottime_ns);
        self.processes.remove(&key);
        // `node` linked to a shared `libnode.so` (Debian's) maps both; the
        // library holds V8 and its constants.
        let mut candidates: Vec<Arc<MappedFile>> = Vec::new();
        for (entry, file) in process.maps.iter().zip(&process.files) {
            if let (MappingKind::File { path, .. }, Some(file)) = (&entry.kind, file)
                && entry.executable
                && symbols::is_v8_object_name(path)
                && !candidates.iter().any(|c| c.identity == file.identity)
            {
                candidates.push(Arc::clone(file));
            }
        }
        candidates.sort_by_key(|file| !file.path.contains("libnode"));
        let mut found = None;
        let mut refusal = None;
        for object in candidates {
            match self.layout_of(process.pid, &object) {
                Ok(layout) => {
                    found = Some((object, layout));
                    break;
                }
                Err(reason) => refusal = refusal.or(Some(reason)),
            }
        }
        let Some((object, layout)) = found else {
            if let Some(reason) = refusal {
                self.count_process(key, reason);
            }
            return;
        };
        let mut builtins = Vec::new();
        let mut native = Vec::new();
        for (entry, file) in process.maps.iter().zip(&process.files) {
            if !entry.executable {
                continue;
            }
            match &entry.kind {
                MappingKind::Anonymous => {}
                MappingKind::File { .. }
                    if file.as_ref().is_some_and(|f| f.identity == object.identity) =>
                {
                    builtins.push(entry.start..entry.end);
                }
                _ => native.push(entry.start..entry.end),
            }
        }
        self.count_process(key, "supported");
        tracing::debug!(pid = process.pid, object = %object.path, "V8 process");
        self.processes.insert(
            key,
            Arc::new(V8Process {
                layout,
                builtins,
                native,
            }),
        );
    }

    /// Counts a process's result once (it is looked at again whenever its
    /// mappings are read).
    fn count_process(&mut self, key: (u32, u64), result: &'static str) {
        if self.outcomes.insert(key, result) != Some(result) {
            *self.stats.processes.entry(result).or_default() += 1;
        }
    }

    /// The layout of a V8 object, read once per file.
    fn layout_of(&mut self, pid: u32, object: &MappedFile) -> Result<V8Layout, &'static str> {
        if let Some(known) = self.layouts.get(&object.identity) {
            return *known;
        }
        let read = symbols::read_constants(&object.file, &object.path)
            .map_err(|error| {
                tracing::debug!(pid, %error, "no V8 constants");
                error.reason()
            })
            .and_then(|constants| {
                V8Layout::from_constants(&constants).map_err(|error| {
                    tracing::info!(pid, path = %object.path, %error, "V8 process profiled without JavaScript names");
                    error.reason()
                })
            });
        if self.layouts.len() >= self.config.layouts {
            self.layouts.clear();
        }
        self.layouts.insert(object.identity, read);
        read
    }

    /// Forgets processes for which `alive` is false.
    pub fn retain_alive(&mut self, mut alive: impl FnMut(u32, u64) -> bool) {
        self.outcomes.retain(|&(pid, start), _| alive(pid, start));
        let outcomes = &self.outcomes;
        self.processes.retain(|key, _| outcomes.contains_key(key));
    }

    /// The user stack of `snapshot` walked as `stack`, with its
    /// JavaScript frames named: `stack.frames` unchanged when the process
    /// is not a registered V8 process.
    pub fn merge(&mut self, snapshot: &StackSnapshot<'_>, stack: &UnwoundStack) -> Vec<u64> {
        let key = (snapshot.pid, snapshot.start_boottime_ns);
        let Some(process) = self.processes.get(&key).cloned() else {
            return stack.frames.clone();
        };
        let sp = snapshot.sp;
        let read_stack = |address: u64| -> Option<u64> {
            let offset = usize::try_from(address.checked_sub(sp)?).ok()?;
            let bytes = snapshot.stack.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        };
        let layout = &process.layout;
        let slots = frames::function_slots(
            layout,
            &stack.frames,
            &stack.registers,
            |pc| process.kind(pc),
            read_stack,
        );
        if slots.is_empty() {
            return stack.frames.clone();
        }
        let memory = ProcessMemory::new(snapshot.pid);
        if self.maps.len() >= self.config.functions_per_window {
            self.maps.clear();
        }
        let maps = self.maps.entry(key).or_default();
        let budget = self
            .source_budgets
            .get(&key)
            .copied()
            .unwrap_or(SOURCE_BYTES_PER_PROCESS_WINDOW);
        let mut heap = Heap::new(layout, &memory, maps).with_source_budget(budget);
        if self.codes.len() >= self.config.functions_per_window {
            self.codes.clear();
        }
        let codes = self.codes.entry(key).or_insert_with(ProcessCode::new);
        let capacity = self.config.functions_per_window;
        let mut named = Vec::with_capacity(slots.len());
        for (index, function) in slots {
            let Some(shared) = heap.shared_of_function(function) else {
                *self.stats.frames.entry("not_a_function").or_default() += 1;
                continue;
            };
            let pc = stack.frames[index];
            let kind = process.kind(pc);
            // Functions inlined into optimized code run in its frame: they
            // go leafward of it, innermost first. Every entry but the leaf
            // is a return address.
            let inlined = match (&layout.code, kind) {
                (Some(code), CodeKind::Jit) => {
                    codes.inlined(&mut heap, code, pc, index > 0, shared)
                }
                _ => Vec::new(),
            };
            for inner in inlined {
                let name = name_of(&mut self.names, capacity, &mut heap, key, inner);
                *self.stats.frames.entry("inlined").or_default() += 1;
                named.push((index, kind, self.frames.intern(name)));
            }
            let name = name_of(&mut self.names, capacity, &mut heap, key, shared);
            *self.stats.frames.entry("named").or_default() += 1;
            named.push((index, kind, self.frames.intern(name)));
        }
        if self.source_budgets.len() < self.config.functions_per_window {
            self.source_budgets.insert(key, heap.source_budget_left());
        }
        inlining::weave(&stack.frames, &named)
    }

    /// The JavaScript frame a tagged stack entry names.
    pub fn frame(&self, entry: u64) -> Option<&JsFrameName> {
        self.frames.get(entry)
    }

    /// Ends a window: its frame ids, names and map types are dropped (a
    /// collection may move or free any object).
    pub fn end_window(&mut self) {
        self.frames.clear();
        self.names.clear();
        self.maps.clear();
        self.source_budgets.clear();
        self.codes.clear();
    }

    /// Cumulative counts.
    pub fn stats(&self) -> &V8Stats {
        &self.stats
    }
}

/// The name of the function whose `SharedFunctionInfo` is at `shared`
/// (untagged, checked), from `names` (the window's, at most `capacity`)
/// or read.
fn name_of<M: Memory>(
    names: &mut HashMap<(u32, u64, u64), JsFrameName>,
    capacity: usize,
    heap: &mut Heap<'_, M>,
    key: (u32, u64),
    shared: u64,
) -> JsFrameName {
    let name_key = (key.0, key.1, shared);
    if let Some(name) = names.get(&name_key) {
        return name.clone();
    }
    let info = heap.describe(shared);
    let name = JsFrameName {
        function: Arc::from(if info.name.is_empty() {
            "(anonymous)"
        } else {
            info.name.as_str()
        }),
        file: Arc::from(info.file.as_str()),
        line: info.line,
    };
    if names.len() >= capacity {
        names.clear();
    }
    names.insert(name_key, name.clone());
    name
}

/// One process's code objects of the current window, by first instruction,
/// and the pcs found in none.
#[derive(Debug)]
struct ProcessCode {
    scanner: Scanner,
    found: BTreeMap<u64, Arc<OptimizedCode>>,
    missing: HashSet<u64>,
}

impl ProcessCode {
    fn new() -> ProcessCode {
        ProcessCode {
            scanner: Scanner {
                map: None,
                budget: CODE_SCAN_BYTES_PER_PROCESS_WINDOW,
            },
            found: BTreeMap::new(),
            missing: HashSet::new(),
        }
    }

    /// The functions inlined where the frame of the function `shared` runs
    /// `pc`, innermost first (see [`OptimizedCode::inlined_at`]); none when
    /// the code there is not that function's.
    fn inlined<M: Memory>(
        &mut self,
        heap: &mut Heap<'_, M>,
        layout: &CodeLayout,
        pc: u64,
        return_address: bool,
        shared: u64,
    ) -> Vec<u64> {
        let known = self
            .found
            .range(..=pc)
            .next_back()
            .filter(|(_, code)| pc < code.end)
            .map(|(_, code)| Arc::clone(code));
        let code = match known {
            Some(code) => code,
            None if self.missing.contains(&pc) => return Vec::new(),
            None => match code::code_at(heap, layout, &mut self.scanner, pc) {
                Some(code) => {
                    if self.found.len() >= CODES_PER_PROCESS_WINDOW {
                        self.found.clear();
                    }
                    let code = Arc::new(code);
                    self.found.insert(code.start, Arc::clone(&code));
                    code
                }
                None => {
                    if self.missing.len() >= CODES_PER_PROCESS_WINDOW {
                        self.missing.clear();
                    }
                    self.missing.insert(pc);
                    return Vec::new();
                }
            },
        };
        if code.shared.is_some_and(|owner| owner != shared) {
            return Vec::new();
        }
        code.inlined_at(pc, return_address)
    }
}

/// `others` (the frames of the entries of `stack` that are not JavaScript
/// frames, in order) with the JavaScript frames of `stack` put back where
/// they were.
pub fn weave_frames(v8: Option<&V8Unwinder>, stack: &[u64], others: Vec<Frame>) -> Vec<Frame> {
    let Some(v8) = v8.filter(|_| stack.iter().any(|&e| frames::is_js_frame(e))) else {
        return others;
    };
    let mut others = others.into_iter();
    stack
        .iter()
        .filter_map(|&entry| {
            if !frames::is_js_frame(entry) {
                return others.next();
            }
            let name = v8.frame(entry)?;
            Some(Frame {
                address: 0,
                mapping: None,
                function: Some(Arc::clone(&name.function)),
                file: Some(Arc::clone(&name.file)).filter(|f| !f.is_empty()),
                line: name.line,
            })
        })
        .collect()
}

/// Ends the window for the V8 unwinder (once its profiles are built):
/// publishes its counts, drops the window's names and forgets processes
/// that exited.
pub fn end_window(v8: &mut Option<V8Unwinder>, processes: &ProcessTable, metrics: &AgentMetrics) {
    let Some(v8) = v8.as_mut() else {
        return;
    };
    metrics.set_v8_totals(v8.stats());
    v8.end_window();
    v8.retain_alive(|pid, start| processes.is_alive(pid, start));
}
