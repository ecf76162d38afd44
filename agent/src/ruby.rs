//! Ruby methods in CPU profiles: Debian's Ruby 3.1 (CRuby), without changes
//! to the program.
//!
//! At sample time the BPF program finds the sampled thread's execution
//! context through libruby's `ruby_current_ec` thread-local ([`vm::find`]
//! says how, from the library's dynamic symbols alone) and walks its
//! control frames, recording each frame's iseq and pc, or a C frame's method
//! entry. Userspace reads each iseq once ([`iseq`]), turns the pc into a line,
//! and puts the Ruby frames into the native stack at the `rb_vm_exec` frames
//! that run them, as CPython's are ([`crate::python::frames::interleave`]).
//! C frames (`Integer#times`) keep their native frames; the Ruby frames
//! above and below them are kept.
//!
//! A Ruby frame id has the Python tag's bit (so native symbolization leaves
//! it alone) and [`RUBY_FRAME_TAG`], so the collector asks this unwinder for
//! its name.

pub mod iseq;
pub mod offsets;
pub mod vm;

use std::collections::HashMap;
use std::sync::Arc;

use crate::abi::{self, PY_FRAME_ENTRY, PyStatus, RB_FRAME_CFUNC, StackSnapshot};
use crate::frame_table::{FrameName, FrameTable, FrameTag};
use crate::metrics::AgentMetrics;
use crate::process_info::{ProcessSnapshot, ProcessTable};
use crate::python::frames::{self, PYTHON_FRAME_TAG};
use crate::python::memory::ProcessMemory;
use crate::python::read_budget::WindowReads;
use crate::runtime_processes::{LookupError, RuntimeProcesses};
use crate::sample_source::SampleSource;

use iseq::IseqInfo;
use vm::{RubyVm, RubyVmError};

impl LookupError for RubyVmError {
    fn is_absent(&self) -> bool {
        *self == RubyVmError::NotRuby
    }
    fn reason(&self) -> &'static str {
        RubyVmError::reason(self)
    }
}

/// Bytes of iseqs read per process and window at most: a real program's
/// are read once, in far less; forged ones (each claiming the largest
/// tables accepted, a new one in every frame) cannot cost more.
const READ_BYTES_PER_WINDOW: u64 = 16 << 20;

/// Set, with the Python tag, on entries that name Ruby frames.
pub const RUBY_FRAME_TAG: u64 = 1 << 62;

/// Ruby's ids: the Python bit and Ruby's own.
#[derive(Debug)]
pub struct RubyTag;

impl FrameTag for RubyTag {
    const TAG: u64 = PYTHON_FRAME_TAG | RUBY_FRAME_TAG;
    const MASK: u64 = PYTHON_FRAME_TAG | RUBY_FRAME_TAG;
    const OVER_CAPACITY: &'static str = "[ruby frames over the window's limit]";
}

/// Bounds of the Ruby unwinder's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RubyUnwinderConfig {
    /// Bytes of iseqs (labels, paths, line tables) cached.
    pub iseq_cache_bytes: usize,
    /// Distinct Ruby frames per window.
    pub frames_per_window: usize,
}

impl Default for RubyUnwinderConfig {
    fn default() -> Self {
        RubyUnwinderConfig {
            iseq_cache_bytes: 8 << 20,
            frames_per_window: 65_536,
        }
    }
}

/// Counts for `/metrics` and tests, cumulative.
#[derive(Debug, Default, Clone)]
pub struct RubyStats {
    /// Processes looked at, by result (`supported`, or why not).
    pub processes: HashMap<&'static str, u64>,
    /// Samples of Ruby processes, by what was read.
    pub stacks: HashMap<&'static str, u64>,
    /// Iseqs read, by result.
    pub iseq_reads: HashMap<&'static str, u64>,
}

/// Ruby processes and the frames of the current window.
#[derive(Debug)]
pub struct RubyUnwinder {
    vms: RuntimeProcesses<RubyVm>,
    /// Two generations: a full young one becomes the old one, so the
    /// budget holds and recently used iseqs survive.
    young: HashMap<(u32, u64, u64), Arc<IseqInfo>>,
    old: HashMap<(u32, u64, u64), Arc<IseqInfo>>,
    young_bytes: usize,
    half_budget: usize,
    /// Objects that failed this window, and bytes read per process.
    reads: WindowReads,
    frames: FrameTable<RubyTag>,
    stats: RubyStats,
}

impl RubyUnwinder {
    /// An unwinder with the given bounds.
    pub fn new(config: RubyUnwinderConfig) -> RubyUnwinder {
        RubyUnwinder {
            vms: RuntimeProcesses::new("ruby"),
            young: HashMap::new(),
            old: HashMap::new(),
            young_bytes: 0,
            half_budget: (config.iseq_cache_bytes / 2).max(1),
            reads: WindowReads::new(READ_BYTES_PER_WINDOW),
            frames: FrameTable::new(config.frames_per_window),
            stats: RubyStats::default(),
        }
    }

    /// Looks for Ruby in a newly seen process. Returns the BPF map entry
    /// when it runs a supported version; `None` otherwise (counted by reason,
    /// and logged when it maps Ruby but cannot be read).
    pub fn register(&mut self, process: &ProcessSnapshot) -> Option<abi::RubyProcess> {
        let found = self
            .vms
            .record(process, vm::find(process), &mut self.stats.processes)?;
        tracing::debug!(pid = process.pid, version = %found.version, object = %found.object_path, "Ruby process");
        Some(found.entry)
    }

    /// Whether `pid` is registered (under any start time).
    pub fn is_registered(&self, pid: u32) -> bool {
        self.vms.is_registered(pid)
    }

    /// Forgets processes for which `alive` is false; returns their pids, to
    /// be removed from the BPF map.
    pub fn retain_alive(&mut self, alive: impl FnMut(u32, u64) -> bool) -> Vec<u32> {
        let gone = self.vms.retain_alive(alive);
        let live = |k: &(u32, u64, u64)| !gone.contains(&(k.0, k.1));
        self.young.retain(|k, _| live(k));
        self.old.retain(|k, _| live(k));
        gone.into_iter().map(|(pid, _)| pid).collect()
    }

    /// The user stack of `snapshot` with its Ruby frames put in: `native`
    /// unchanged when the process is not a registered Ruby process.
    pub fn merge(&mut self, snapshot: &StackSnapshot<'_>, native: Vec<u64>) -> Vec<u64> {
        let key = (snapshot.pid, snapshot.start_boottime_ns);
        let Some(vm) = self.vms.get(key) else {
            return native;
        };
        let status = match snapshot.py_status {
            PyStatus::None => "not_registered_in_bpf",
            PyStatus::NoThread => "no_execution_context",
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
            let entry = frame.flags & PY_FRAME_ENTRY != 0;
            // C frames keep their native frames; only where a vm_exec call
            // began matters, and it moves to the Ruby frame before.
            let named = (frame.flags & RB_FRAME_CFUNC == 0)
                .then(|| self.iseq(&vm, &memory, key, frame.code))
                .flatten();
            let Some(info) = named else {
                if entry && let Some(last) = ends.last_mut() {
                    *last = true;
                }
                continue;
            };
            let name = FrameName {
                function: Arc::clone(&info.label),
                file: Arc::clone(&info.path),
                line: info.line_at(frame.position),
            };
            tagged.push(self.frames.intern(name));
            ends.push(entry);
        }
        frames::interleave(&native, &tagged, &ends, &vm.exec_frames)
    }

    fn iseq(
        &mut self,
        vm: &RubyVm,
        memory: &ProcessMemory,
        key: (u32, u64),
        address: u64,
    ) -> Option<Arc<IseqInfo>> {
        if address == 0 {
            return None;
        }
        let cache_key = (key.0, key.1, address);
        if let Some(info) = self.young.get(&cache_key) {
            return Some(Arc::clone(info));
        }
        let info = match self.old.remove(&cache_key) {
            Some(info) => info,
            None => match self.reads.read(key, address, || {
                iseq::read_iseq(memory, &vm.offsets, address)
            }) {
                Err(skipped) => {
                    *self.stats.iseq_reads.entry(skipped.reason()).or_default() += 1;
                    return None;
                }
                Ok(Ok(info)) => {
                    *self.stats.iseq_reads.entry("ok").or_default() += 1;
                    Arc::new(info)
                }
                Ok(Err(error)) => {
                    let reason = match error {
                        iseq::IseqReadError::Memory(_) => "unreadable",
                        iseq::IseqReadError::NotIseq { .. } => "not_iseq",
                    };
                    *self.stats.iseq_reads.entry(reason).or_default() += 1;
                    return None;
                }
            },
        };
        let bytes = info.held_bytes();
        if self.young_bytes + bytes > self.half_budget {
            self.old = std::mem::take(&mut self.young);
            self.young_bytes = 0;
        }
        self.young_bytes += bytes;
        self.young.insert(cache_key, Arc::clone(&info));
        Some(info)
    }

    /// The Ruby frame a tagged stack entry names; `None` for other entries.
    pub fn frame(&self, entry: u64) -> Option<&FrameName> {
        self.frames.get(entry)
    }

    /// Ends a window: its frame ids are no longer referenced.
    pub fn end_window(&mut self) {
        self.frames.clear();
        self.reads.end_window();
    }

    /// Cumulative counts.
    pub fn stats(&self) -> &RubyStats {
        &self.stats
    }

    /// Bytes of cached iseqs (the young generation).
    pub fn cached_bytes(&self) -> u64 {
        self.young_bytes as u64
    }
}

/// Registers `process` with `ruby` (when Ruby frames are on) and tells the
/// sampler: the collector's one call per new process.
pub fn register(
    ruby: &mut Option<RubyUnwinder>,
    process: &ProcessSnapshot,
    sampler: &mut impl SampleSource,
) {
    let Some(ruby) = ruby.as_mut() else {
        return;
    };
    let was_registered = ruby.is_registered(process.pid);
    let result = match ruby.register(process) {
        Some(entry) => sampler.set_ruby_process(process.pid, &entry),
        None if was_registered => sampler.remove_ruby_process(process.pid),
        None => Ok(()),
    };
    if let Err(error) = result {
        tracing::warn!(pid = process.pid, %error, "updating the Ruby process map failed");
    }
}

/// Ends the window for `ruby`: publishes its counts, drops the window's frame names and forgets
/// processes that exited, in the unwinder and the sampler.
pub fn end_window(
    ruby: &mut Option<RubyUnwinder>,
    processes: &ProcessTable,
    sampler: &mut impl SampleSource,
    metrics: &AgentMetrics,
) {
    let Some(ruby) = ruby.as_mut() else {
        return;
    };
    metrics.set_ruby_totals(ruby.stats());
    ruby.end_window();
    for pid in ruby.retain_alive(|pid, start| processes.is_alive(pid, start)) {
        if let Err(error) = sampler.remove_ruby_process(pid) {
            tracing::warn!(pid, %error, "removing an exited Ruby process failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruby_ids_are_told_from_python_ids() {
        let mut unwinder = RubyUnwinder::new(RubyUnwinderConfig::default());
        let id = unwinder.frames.intern(FrameName {
            function: Arc::from("hot"),
            file: Arc::from("/app/hot.rb"),
            line: 3,
        });
        assert!(
            frames::is_python_frame(id),
            "kept out of native symbolization"
        );
        assert_eq!(unwinder.frame(id).map(|n| &*n.function), Some("hot"));
        assert_eq!(unwinder.frame(id & !RUBY_FRAME_TAG), None, "a Python id");
        assert_eq!(unwinder.frame(0x4000), None, "an address");
        unwinder.end_window();
        assert_eq!(unwinder.frame(id), None);
    }
}
