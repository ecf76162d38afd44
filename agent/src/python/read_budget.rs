//! Per-window bounds on what an interpreter reader (CPython's code objects,
//! Ruby's iseqs) reads from one process. A process can forge the objects
//! its frames point at: a different one in every frame of every sample, or
//! one whose sizes claim the largest tables the reader accepts, or one that
//! fails to read. So, within one window, an object that failed is not read
//! again, and each process copies at most a fixed number of bytes; past
//! that its frames stay unnamed until the next window. A real interpreter
//! reads each object once and stays far below the budget.

use std::collections::{HashMap, HashSet};

use super::memory::thread_read_bytes;

/// Failed objects remembered per window at most (24 bytes each).
const MAX_FAILED: usize = 1 << 16;

/// Why an object was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// It failed to read earlier in this window.
    FailedThisWindow,
    /// Its process has copied its budget of bytes in this window.
    OverBudget,
}

impl Skipped {
    /// A fixed name for metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Skipped::FailedThisWindow => "failed_this_window",
            Skipped::OverBudget => "over_window_budget",
        }
    }
}

/// One window's failed objects and bytes copied, per process.
#[derive(Debug)]
pub struct WindowReads {
    failed: HashSet<(u32, u64, u64)>,
    copied: HashMap<(u32, u64), u64>,
    bytes_per_process: u64,
}

impl WindowReads {
    /// Each process may copy `bytes_per_process` bytes a window.
    pub fn new(bytes_per_process: u64) -> WindowReads {
        WindowReads {
            failed: HashSet::new(),
            copied: HashMap::new(),
            bytes_per_process,
        }
    }

    /// Reads the object at `address` of process `key` with `read`, unless
    /// it failed already this window or the process's budget is spent; the
    /// bytes `read` copies are counted against the process.
    pub fn read<T, E>(
        &mut self,
        key: (u32, u64),
        address: u64,
        read: impl FnOnce() -> Result<T, E>,
    ) -> Result<Result<T, E>, Skipped> {
        let object = (key.0, key.1, address);
        if self.failed.contains(&object) {
            return Err(Skipped::FailedThisWindow);
        }
        let copied = self.copied.entry(key).or_default();
        if *copied >= self.bytes_per_process {
            return Err(Skipped::OverBudget);
        }
        let before = thread_read_bytes();
        let result = read();
        *copied = copied.saturating_add(thread_read_bytes().saturating_sub(before));
        if result.is_err() {
            if self.failed.len() >= MAX_FAILED {
                self.failed.clear();
            }
            self.failed.insert(object);
        }
        Ok(result)
    }

    /// Ends the window: failed objects may be read again (memory changes),
    /// and every budget is whole again.
    pub fn end_window(&mut self) {
        self.failed.clear();
        self.copied.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::memory::ProcessMemory;

    #[test]
    fn a_failed_object_is_read_once_a_window() {
        let mut reads = WindowReads::new(1 << 20);
        let mut tries = 0;
        let mut fail = || {
            tries += 1;
            Err::<(), ()>(())
        };
        assert_eq!(reads.read((1, 2), 0x1000, &mut fail), Ok(Err(())));
        assert_eq!(
            reads.read((1, 2), 0x1000, &mut fail),
            Err(Skipped::FailedThisWindow)
        );
        // Another object, and another process, are read.
        assert_eq!(reads.read((1, 2), 0x2000, &mut fail), Ok(Err(())));
        assert_eq!(reads.read((3, 2), 0x1000, &mut fail), Ok(Err(())));
        reads.end_window();
        assert_eq!(reads.read((1, 2), 0x1000, &mut fail), Ok(Err(())));
        assert_eq!(tries, 4);
    }

    #[test]
    fn a_process_past_its_budget_is_not_read_until_the_next_window() {
        let memory = ProcessMemory::new(std::process::id());
        let source = vec![7u8; 4096];
        let copy = || memory.read_vec(source.as_ptr() as u64, source.len());
        let mut reads = WindowReads::new(8192);
        assert!(reads.read((1, 2), 0x1000, copy).is_ok());
        assert!(reads.read((1, 2), 0x2000, copy).is_ok());
        assert_eq!(
            reads.read((1, 2), 0x3000, copy).map(|_| ()),
            Err(Skipped::OverBudget)
        );
        assert!(reads.read((5, 2), 0x3000, copy).is_ok(), "its own budget");
        reads.end_window();
        assert!(reads.read((1, 2), 0x3000, copy).is_ok());
    }
}
