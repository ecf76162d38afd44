//! Java methods in CPU profiles: HotSpot JVMs started without flags.
//!
//! HotSpot exports tables describing its own structures for debuggers
//! ([`vmstructs`]); from them ([`layout`]) the agent finds the code cache
//! and, for a pc in it, the code blob that holds it ([`code_cache`]).
//! Compiled methods keep no frame pointer, so the stack walk leaves them by
//! their blob's frame size; interpreted frames by the frame pointer
//! ([`unwinder`]). Each Java frame is then named ([`naming`]) from the
//! method the frame holds (interpreted) or the blob's method and those
//! inlined into it at that pc ([`inline`]; compiled), read from HotSpot's
//! metadata ([`names`]), and goes into the stack as a tagged id
//! ([`frames`]), named at drain time like a Python frame. Nothing is asked
//! of the program: no flag, no agent.

pub mod code_cache;
pub mod frames;
pub mod inline;
pub mod layout;
pub mod names;
pub mod naming;
pub mod process;
pub mod unwinder;
pub mod vmstructs;

#[cfg(test)]
mod test_memory;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::abi::StackSnapshot;
use crate::process_info::ProcessSnapshot;
use crate::unwind::{StackUnwinder, UnwoundStack};

use frames::JavaFrameName;
use process::JvmError;
use unwinder::JvmProcess;

/// Bounds of the HotSpot unwinder's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotspotConfig {
    /// JVM processes held at most.
    pub max_processes: usize,
    /// Distinct Java frames per window.
    pub frames_per_window: usize,
    /// Method names cached per window, across processes.
    pub max_cached_methods: usize,
}

impl Default for HotspotConfig {
    fn default() -> Self {
        HotspotConfig {
            max_processes: 1024,
            frames_per_window: 65_536,
            max_cached_methods: 65_536,
        }
    }
}

/// A JVM still starting (its tables not filled in) is read again after
/// this long, at most this many times.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
const MAX_RETRIES: u32 = 120;

/// Counts for `/metrics`, cumulative.
#[derive(Debug, Default, Clone)]
pub struct HotspotStats {
    /// JVM processes looked at, by result (`supported`, or why not).
    pub processes: HashMap<&'static str, u64>,
    /// Frames in the code cache, by how they were named.
    pub frames: HashMap<&'static str, u64>,
}

/// JVM processes and the Java frames of the current window.
#[derive(Debug)]
pub struct HotspotUnwinder {
    config: HotspotConfig,
    processes: HashMap<(u32, u64), JvmProcess>,
    /// JVMs not readable yet: when last tried, and how often.
    pending: HashMap<(u32, u64), (Instant, u32)>,
    /// JVMs refused for good (forged or unknown tables): not read again.
    refused: HashSet<(u32, u64)>,
    window: naming::WindowNames,
    stats: HotspotStats,
}

impl HotspotUnwinder {
    /// An unwinder with the given bounds.
    pub fn new(config: HotspotConfig) -> HotspotUnwinder {
        HotspotUnwinder {
            config,
            processes: HashMap::new(),
            pending: HashMap::new(),
            refused: HashSet::new(),
            window: naming::WindowNames::new(config.frames_per_window),
            stats: HotspotStats::default(),
        }
    }

    /// Looks for HotSpot in a process read from `/proc` (new, or re-read).
    pub fn observe(&mut self, process: &ProcessSnapshot) {
        let key = (process.pid, process.start_boottime_ns);
        if self.processes.contains_key(&key)
            || self.refused.contains(&key)
            || !process::maps_libjvm(process)
        {
            return;
        }
        let result = if self.processes.len() >= self.config.max_processes {
            Err("too_many_processes")
        } else {
            process::find(process).map_err(|error| {
                if let JvmError::Tables {
                    source: vmstructs::VmStructsError::NotInitialized { .. },
                    ..
                } = error
                {
                    let (at, tries) = self.pending.entry(key).or_insert((Instant::now(), 0));
                    *at = Instant::now();
                    *tries += 1;
                } else {
                    self.pending.remove(&key);
                    if self.refused.len() >= self.config.max_processes {
                        self.refused.clear();
                    }
                    self.refused.insert(key);
                    tracing::info!(pid = process.pid, %error, "JVM profiled without Java frames");
                }
                error.reason()
            })
        };
        match result {
            Ok(found) => {
                tracing::debug!(pid = process.pid, object = %found.path, heaps = found.heaps.len(), "HotSpot JVM");
                *self.stats.processes.entry("supported").or_default() += 1;
                self.pending.remove(&key);
                self.processes
                    .insert(key, JvmProcess::new(found, process.pid));
            }
            Err(reason) => *self.stats.processes.entry(reason).or_default() += 1,
        }
    }

    /// Whether a JVM that was still starting should be read again now.
    pub fn retry_due(&self, pid: u32, start_boottime_ns: u64) -> bool {
        self.pending
            .get(&(pid, start_boottime_ns))
            .is_some_and(|(at, tries)| *tries < MAX_RETRIES && at.elapsed() >= RETRY_INTERVAL)
    }

    /// Unwinds `snapshot` with its JVM's frames (when it is a JVM's) and
    /// puts Java frames in place of their code-cache addresses: a compiled
    /// frame becomes its inlined methods, innermost first, then its own.
    pub fn unwind(
        &mut self,
        unwinder: &mut StackUnwinder,
        snapshot: &StackSnapshot<'_>,
    ) -> UnwoundStack {
        let key = (snapshot.pid, snapshot.start_boottime_ns);
        let Some(jvm) = self.processes.get(&key) else {
            return unwinder.unwind(snapshot);
        };
        let stack = unwinder.unwind_with_runtime(snapshot, jvm);
        let read_stack = |address: u64| -> Option<u64> {
            let offset = usize::try_from(address.checked_sub(snapshot.sp)?).ok()?;
            let bytes = snapshot.stack.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        };
        let mut namer = naming::Namer {
            jvm,
            key,
            window: &mut self.window,
            counts: &mut self.stats.frames,
            max_cached_methods: self.config.max_cached_methods,
        };
        let mut frames = Vec::with_capacity(stack.frames.len() + 8);
        let mut registers = Vec::with_capacity(stack.frames.len() + 8);
        for (depth, (&entry, &at)) in stack.frames.iter().zip(&stack.registers).enumerate() {
            let named = namer.name(depth, entry, at, &read_stack);
            if named.is_empty() {
                frames.push(entry);
                registers.push(at);
            } else {
                // Inlined frames share their compiled frame's registers.
                registers.extend(std::iter::repeat_n(at, named.len()));
                frames.extend(named);
            }
        }
        UnwoundStack {
            frames,
            registers,
            outcome: stack.outcome,
        }
    }

    /// The Java frame a tagged stack entry names.
    pub fn frame(&self, entry: u64) -> Option<&JavaFrameName> {
        self.window.frames.get(entry)
    }

    /// Ends a window: its frame ids, blobs and method names are dropped
    /// (code and methods may be freed and their memory reused).
    pub fn end_window(&mut self) {
        self.window.clear();
        for jvm in self.processes.values() {
            jvm.end_window();
        }
    }

    /// Forgets processes for which `alive` is false.
    pub fn retain_alive(&mut self, mut alive: impl FnMut(u32, u64) -> bool) {
        self.processes.retain(|(pid, start), _| alive(*pid, *start));
        self.pending.retain(|(pid, start), _| alive(*pid, *start));
        self.refused.retain(|(pid, start)| alive(*pid, *start));
    }

    /// Cumulative counts.
    pub fn stats(&self) -> &HotspotStats {
        &self.stats
    }
}
