//! Reads another process's memory with `process_vm_readv` (the agent holds
//! CAP_SYS_PTRACE or is root). Every read is bounded by its buffer, and
//! counted ([`read_totals`]): what the runtimes' readers cost, and how
//! many of their reads a process's memory refused, for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Reads of runtime memory that succeeded, failed, and bytes copied.
static READS_OK: AtomicU64 = AtomicU64::new(0);
static READS_FAILED: AtomicU64 = AtomicU64::new(0);
static READ_BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Bytes this thread has copied: what one reader's call cost.
    static THREAD_BYTES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Bytes the calling thread has copied from other processes so far.
pub fn thread_read_bytes() -> u64 {
    THREAD_BYTES.with(std::cell::Cell::get)
}

/// Cumulative reads of other processes' memory: (succeeded, failed,
/// bytes copied), across every runtime reader in the agent.
pub fn read_totals() -> (u64, u64, u64) {
    (
        READS_OK.load(Ordering::Relaxed),
        READS_FAILED.load(Ordering::Relaxed),
        READ_BYTES.load(Ordering::Relaxed),
    )
}

/// A read of process memory that failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("reading {len} bytes at {address:#x} of pid {pid} failed (errno {errno})")]
pub struct MemoryReadError {
    /// The process.
    pub pid: u32,
    /// Where.
    pub address: u64,
    /// How much.
    pub len: usize,
    /// The errno, 0 for a short read.
    pub errno: i32,
}

/// One process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pid: u32,
}

impl ProcessMemory {
    /// The memory of `pid` (in the agent's PID namespace).
    pub fn new(pid: u32) -> ProcessMemory {
        ProcessMemory { pid }
    }

    /// Fills `buffer` from `address`; a short read is an error.
    pub fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryReadError> {
        let len = buffer.len();
        let error = |errno| MemoryReadError {
            pid: self.pid,
            address,
            len,
            errno,
        };
        if buffer.is_empty() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(self.pid).map_err(|_| error(libc::ESRCH))?;
        let local = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        };
        let remote = libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: buffer.len(),
        };
        // SAFETY: `local` describes `buffer`, which is valid for writes of
        // its length for the whole call; the remote iovec is only read by
        // the kernel, which checks it against the target's address space.
        let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if read as usize == buffer.len() {
            READS_OK.fetch_add(1, Ordering::Relaxed);
            READ_BYTES.fetch_add(buffer.len() as u64, Ordering::Relaxed);
            THREAD_BYTES.with(|bytes| bytes.set(bytes.get().saturating_add(buffer.len() as u64)));
        } else {
            READS_FAILED.fetch_add(1, Ordering::Relaxed);
        }
        if read < 0 {
            return Err(error(
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            ));
        }
        if read as usize != buffer.len() {
            return Err(error(0));
        }
        Ok(())
    }

    /// Reads `len` bytes.
    pub fn read_vec(&self, address: u64, len: usize) -> Result<Vec<u8>, MemoryReadError> {
        let mut bytes = vec![0; len];
        self.read(address, &mut bytes)?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_refuses_unmapped_addresses() {
        let value: [u8; 8] = *b"kiln-mem";
        let memory = ProcessMemory::new(std::process::id());
        let mut out = [0u8; 8];
        memory
            .read(value.as_ptr() as u64, &mut out)
            .expect("own memory is readable");
        assert_eq!(&out, b"kiln-mem");
        let error = memory.read(8, &mut out).expect_err("page zero is unmapped");
        assert_eq!(error.address, 8);
    }
}
