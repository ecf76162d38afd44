//! Python functions in CPU profiles: CPython 3.9 and later, without changes
//! to the program or its image.
//!
//! At sample time the BPF program reads the sampled thread's frame chain
//! (code object and bytecode position per frame) from the interpreter's own
//! thread state, using the offsets that userspace stored for that process
//! ([`interpreter::find`]): the agent's own table ([`offsets`]) for 3.9 to
//! 3.12, and from 3.13 on the table CPython itself keeps at the start of
//! `_PyRuntime` ([`debug_offsets`]), so a new release whose table keeps its
//! fields' places needs no new agent. Userspace then
//! reads each code object once ([`code`]), turns positions into lines
//! ([`line_table`]) and puts the Python frames into the native stack at the
//! eval-loop frames that run them ([`frames::interleave`]).

pub mod code;
pub mod debug_offsets;
pub mod eval_parts;
pub mod frames;
pub mod interpreter;
pub mod line_table;
pub mod memory;
pub mod offsets;
pub mod read_budget;

use std::collections::HashMap;
use std::sync::Arc;

use crate::abi::{self, PY_FRAME_ENTRY, PY_FRAME_SHIM, PyStatus, StackSnapshot};
use crate::process_info::ProcessSnapshot;
use crate::runtime_processes::{LookupError, RuntimeProcesses};

use code::{CodeCache, CodeInfo};
use frames::{PythonFrameName, PythonFrameTable, UNKNOWN_FUNCTION};
use interpreter::{Interpreter, InterpreterError};

impl LookupError for InterpreterError {
    fn is_absent(&self) -> bool {
        *self == InterpreterError::NotPython
    }
    fn reason(&self) -> &'static str {
        InterpreterError::reason(self)
    }
}
use memory::ProcessMemory;
use read_budget::WindowReads;

/// Bytes of code objects read per process and window at most: a real
/// program's are read once, in far less; forged ones cannot cost more.
const READ_BYTES_PER_WINDOW: u64 = 16 << 20;

/// Bounds of the Python unwinder's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonUnwinderConfig {
    /// Bytes of code objects (names, files, line tables) cached.
    pub code_cache_bytes: usize,
    /// Distinct Python frames per window.
    pub frames_per_window: usize,
}

impl Default for PythonUnwinderConfig {
    fn default() -> Self {
        PythonUnwinderConfig {
            code_cache_bytes: 8 << 20,
            frames_per_window: 65_536,
        }
    }
}

/// Counts for `/metrics`, cumulative.
#[derive(Debug, Default, Clone)]
pub struct PythonStats {
    /// Processes looked at, by result (`supported`, or why not).
    pub processes: HashMap<&'static str, u64>,
    /// Samples of Python processes, by what was read.
    pub stacks: HashMap<&'static str, u64>,
    /// Code objects read, by result.
    pub code_reads: HashMap<&'static str, u64>,
}

/// Python processes and the frames of the current window.
#[derive(Debug)]
pub struct PythonUnwinder {
    interpreters: RuntimeProcesses<Interpreter>,
    codes: CodeCache,
    /// Objects that failed this window, and bytes read per process.
    reads: WindowReads,
    frames: PythonFrameTable,
    stats: PythonStats,
}

impl PythonUnwinder {
    /// An unwinder with the given bounds.
    pub fn new(config: PythonUnwinderConfig) -> PythonUnwinder {
        PythonUnwinder {
            interpreters: RuntimeProcesses::new("python"),
            codes: CodeCache::new(config.code_cache_bytes),
            reads: WindowReads::new(READ_BYTES_PER_WINDOW),
            frames: PythonFrameTable::new(config.frames_per_window),
            stats: PythonStats::default(),
        }
    }

    /// Looks for CPython in a newly seen process. Returns the BPF map entry
    /// when it runs a supported version; `None` otherwise (counted by reason,
    /// and logged once per process when it maps CPython but cannot be read).
    pub fn register(&mut self, process: &ProcessSnapshot) -> Option<abi::PythonProcess> {
        let found = self.interpreters.record(
            process,
            interpreter::find(process),
            &mut self.stats.processes,
        )?;
        tracing::debug!(pid = process.pid, version = found.offsets.minor, object = %found.object_path, "CPython process");
        Some(found.offsets.kernel_entry(found.runtime))
    }

    /// Whether `pid` is registered (under any start time).
    pub fn is_registered(&self, pid: u32) -> bool {
        self.interpreters.is_registered(pid)
    }

    /// Forgets processes for which `alive` is false; returns their pids, to
    /// be removed from the BPF map.
    pub fn retain_alive(&mut self, alive: impl FnMut(u32, u64) -> bool) -> Vec<u32> {
        let gone = self.interpreters.retain_alive(alive);
        for &(pid, start) in &gone {
            self.codes.forget_process(pid, start);
        }
        gone.into_iter().map(|(pid, _)| pid).collect()
    }

    /// The user stack of `snapshot` with its Python frames put in: `native`
    /// unchanged when the process is not a registered Python process.
    pub fn merge(&mut self, snapshot: &StackSnapshot<'_>, native: Vec<u64>) -> Vec<u64> {
        let key = (snapshot.pid, snapshot.start_boottime_ns);
        let Some(interpreter) = self.interpreters.get(key) else {
            return native;
        };
        let status = match snapshot.py_status {
            PyStatus::None => "not_registered_in_bpf",
            PyStatus::NoThread => "no_thread_state",
            PyStatus::Complete => "complete",
            PyStatus::Truncated => "truncated",
        };
        *self.stats.stacks.entry(status).or_default() += 1;
        if snapshot.py_frames.is_empty() {
            return native;
        }
        let memory = ProcessMemory::new(snapshot.pid);
        let mut tagged = Vec::with_capacity(snapshot.py_frames.len());
        let mut ends = Vec::with_capacity(snapshot.py_frames.len());
        for frame in &snapshot.py_frames {
            if frame.flags & PY_FRAME_SHIM != 0 {
                // The frame before a shim was the first of its eval call.
                if let Some(last) = ends.last_mut() {
                    *last = true;
                }
                continue;
            }
            // The BPF program clears 3.14's tag bits already; clearing them
            // again keeps a stale or older BPF object from splitting one
            // code object into several cache keys.
            let code_address = frame.code & !u64::from(interpreter.offsets.frames.code_tag_mask);
            let name = match self.code(&interpreter, &memory, key, code_address) {
                Some(code) => PythonFrameName {
                    function: Arc::clone(&code.name),
                    file: Arc::clone(&code.file),
                    line: code.line_at(&interpreter.offsets, code_address, frame.position),
                },
                None => PythonFrameName {
                    function: Arc::from(UNKNOWN_FUNCTION),
                    file: Arc::from(""),
                    line: 0,
                },
            };
            tagged.push(self.frames.intern(name));
            ends.push(frame.flags & PY_FRAME_ENTRY != 0);
        }
        frames::interleave(&native, &tagged, &ends, &interpreter.eval_frames)
    }

    fn code(
        &mut self,
        interpreter: &Interpreter,
        memory: &ProcessMemory,
        key: (u32, u64),
        address: u64,
    ) -> Option<Arc<CodeInfo>> {
        let cache_key = (key.0, key.1, address);
        if let Some(info) = self.codes.get(cache_key) {
            return Some(info);
        }
        let read = self.reads.read(key, address, || {
            code::read_code(memory, &interpreter.offsets, interpreter.code_type, address)
        });
        let read = match read {
            Ok(read) => read,
            Err(skipped) => {
                *self.stats.code_reads.entry(skipped.reason()).or_default() += 1;
                return None;
            }
        };
        match read {
            Ok(info) => {
                *self.stats.code_reads.entry("ok").or_default() += 1;
                let info = Arc::new(info);
                self.codes.insert(cache_key, Arc::clone(&info));
                Some(info)
            }
            Err(error) => {
                let reason = match error {
                    code::CodeReadError::Memory(_) => "unreadable",
                    code::CodeReadError::NotCode { .. } => "not_code",
                };
                *self.stats.code_reads.entry(reason).or_default() += 1;
                None
            }
        }
    }

    /// The Python frame a tagged stack entry names.
    pub fn frame(&self, entry: u64) -> Option<&PythonFrameName> {
        self.frames.get(entry)
    }

    /// Ends a window: its frame ids are no longer referenced.
    pub fn end_window(&mut self) {
        self.frames.clear();
        self.reads.end_window();
    }

    /// Cumulative counts.
    pub fn stats(&self) -> &PythonStats {
        &self.stats
    }

    /// Bytes of cached code objects.
    pub fn cached_bytes(&self) -> u64 {
        self.codes.held_bytes() as u64
    }
}
