//! The processes that an interpreter unwinder (CPython, Ruby) reads, keyed
//! by (pid, start time) so that a recycled pid is never read with another
//! process's layout.

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::Arc;

use crate::process_info::ProcessSnapshot;

/// Why a runtime was not found in a process.
pub trait LookupError: Display {
    /// Whether the process simply does not run this runtime: counted, never
    /// logged, since most processes of a node are not.
    fn is_absent(&self) -> bool;
    /// The metric label of this outcome.
    fn reason(&self) -> &'static str;
}

/// One runtime's registered processes.
#[derive(Debug)]
pub struct RuntimeProcesses<V> {
    runtime: &'static str,
    by_process: HashMap<(u32, u64), Arc<V>>,
}

impl<V> RuntimeProcesses<V> {
    /// No process yet, for the runtime named `runtime` in logs.
    pub fn new(runtime: &'static str) -> RuntimeProcesses<V> {
        RuntimeProcesses {
            runtime,
            by_process: HashMap::new(),
        }
    }

    /// Records what looking for the runtime in `process` found: registers
    /// it when found (replacing an earlier registration, as after an
    /// `exec`), forgets it otherwise. Logs once per process that maps the
    /// runtime but cannot be read, and counts the outcome in `outcomes`
    /// (`supported`, or why not; absence is not counted).
    pub fn record<E: LookupError>(
        &mut self,
        process: &ProcessSnapshot,
        found: Result<V, E>,
        outcomes: &mut HashMap<&'static str, u64>,
    ) -> Option<Arc<V>> {
        let key = (process.pid, process.start_boottime_ns);
        match found {
            Ok(found) => {
                *outcomes.entry("supported").or_default() += 1;
                let found = Arc::new(found);
                self.by_process.insert(key, Arc::clone(&found));
                Some(found)
            }
            Err(error) => {
                if !error.is_absent() {
                    *outcomes.entry(error.reason()).or_default() += 1;
                    tracing::info!(pid = process.pid, runtime = self.runtime, %error,
                        "process profiled without its runtime's frames");
                }
                self.by_process.remove(&key);
                None
            }
        }
    }

    /// The registered process `(pid, start time)`.
    pub fn get(&self, key: (u32, u64)) -> Option<Arc<V>> {
        self.by_process.get(&key).cloned()
    }

    /// Whether `pid` is registered (under any start time).
    pub fn is_registered(&self, pid: u32) -> bool {
        self.by_process.keys().any(|(p, _)| *p == pid)
    }

    /// Forgets processes for which `alive` is false; returns their keys.
    pub fn retain_alive(&mut self, mut alive: impl FnMut(u32, u64) -> bool) -> Vec<(u32, u64)> {
        let gone: Vec<(u32, u64)> = self
            .by_process
            .keys()
            .filter(|(pid, start)| !alive(*pid, *start))
            .copied()
            .collect();
        for key in &gone {
            self.by_process.remove(key);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    enum Lookup {
        Absent,
        Unreadable,
    }

    impl Display for Lookup {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }

    impl LookupError for Lookup {
        fn is_absent(&self) -> bool {
            matches!(self, Lookup::Absent)
        }
        fn reason(&self) -> &'static str {
            match self {
                Lookup::Absent => "absent",
                Lookup::Unreadable => "unreadable",
            }
        }
    }

    fn process(pid: u32, start: u64) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            start_boottime_ns: start,
            comm: String::new(),
            maps: Vec::new(),
            files: Vec::new(),
        }
    }

    #[test]
    fn processes_are_registered_by_pid_and_start_and_forgotten_when_gone() {
        let mut processes = RuntimeProcesses::<u8>::new("test");
        let mut outcomes = HashMap::new();
        let found = processes.record(&process(1, 10), Ok::<u8, Lookup>(7), &mut outcomes);
        assert!(found.is_some());
        let absent = processes.record(&process(2, 20), Err(Lookup::Absent), &mut outcomes);
        assert!(absent.is_none());
        let unreadable = processes.record(&process(3, 30), Err(Lookup::Unreadable), &mut outcomes);
        assert!(unreadable.is_none());
        assert!(processes.is_registered(1) && !processes.is_registered(2));
        assert_eq!(processes.get((1, 10)).as_deref(), Some(&7));
        assert_eq!(processes.get((1, 11)), None, "a recycled pid");
        assert_eq!(outcomes.get("supported"), Some(&1));
        assert_eq!(outcomes.get("unreadable"), Some(&1));
        assert_eq!(outcomes.get("absent"), None, "absence is not counted");
        // The process execs something else: its registration goes.
        processes.record(&process(1, 10), Err::<u8, _>(Lookup::Absent), &mut outcomes);
        assert!(!processes.is_registered(1));
        processes.record(&process(4, 40), Ok::<u8, Lookup>(1), &mut outcomes);
        assert_eq!(processes.retain_alive(|pid, _| pid != 4), vec![(4, 40)]);
        assert!(!processes.is_registered(4));
    }
}
