//! What the workload bench measures of its own process: resident peak
//! (VmHWM, restartable per stage), the heap its allocations hold and its
//! peak (a counting global allocator), glibc's heap in use, and CPU time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

use kiln_storage::Store;
/// A `/proc/self/status` field in KiB (`VmHWM`, `VmRSS`), 0 when unreadable.
pub(crate) fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

pub(crate) fn vm_hwm_kib() -> u64 {
    status_kib("VmHWM")
}

/// Resets VmHWM to the current RSS (Linux `clear_refs` value 5), so the
/// next reading is the peak of the stage that follows.
pub(crate) fn reset_hwm() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    HEAP_PEAK.store(HEAP_LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Counts the heap the bench's allocations hold and its peak since the
/// last [`reset_hwm`], over the system allocator: a stage's heap peak next
/// to its resident peak tells heap over a budget from memory the allocator
/// kept after frees.
///
/// NB: each thread batches its changes and adds them to the shared count
/// once they pass [`BATCH_BYTES`]. One shared atomic touched by every
/// `malloc` and `free` made two cores trade its cache line on every
/// allocation, which cost the bench CPU the store itself does not spend.
/// The count is therefore behind by less than `BATCH_BYTES` per live
/// thread, plus as much per thread that exited with a batch unsent: a few
/// hundred KiB against the MiB the trace reports.
struct CountingAllocator;

/// A thread's unsent change past which it is added to the shared count.
const BATCH_BYTES: isize = 16 << 10;

static HEAP_LIVE: AtomicIsize = AtomicIsize::new(0);
static HEAP_PEAK: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    // A const-initialised `Cell` of a plain integer: no allocation and no
    // destructor, so the allocator may touch it on any thread at any time.
    static UNSENT: Cell<isize> = const { Cell::new(0) };
}

fn heap_changed(delta: isize) {
    let sent = UNSENT.try_with(|unsent| {
        let pending = unsent.get() + delta;
        if pending.abs() < BATCH_BYTES {
            unsent.set(pending);
            None
        } else {
            unsent.set(0);
            Some(pending)
        }
    });
    // A thread being torn down has no slot left: send the change at once.
    let Some(pending) = sent.unwrap_or(Some(delta)) else {
        return;
    };
    let live = HEAP_LIVE.fetch_add(pending, Ordering::Relaxed) + pending;
    // A plain load first: the read-modify-write only when this is a new peak.
    if live > HEAP_PEAK.load(Ordering::Relaxed) {
        HEAP_PEAK.fetch_max(live, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counters
// only observe sizes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            heap_changed(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            heap_changed(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) };
        heap_changed(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            heap_changed(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The heap peak since the last [`reset_hwm`], in bytes.
pub(crate) fn heap_peak_bytes() -> u64 {
    HEAP_PEAK.load(Ordering::Relaxed).max(0) as u64
}

/// Bytes the allocator has handed out and not had back (glibc
/// `mallinfo2`: arena + mmapped chunks in use). RSS above this is memory
/// the allocator retains after frees.
pub(crate) fn heap_in_use_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads allocator statistics; it has no
    // preconditions and returns a plain struct by value.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

/// One line of the memory trace: RSS now, peak since the last reset, and
/// what the store accounts for (decoded-block cache, head).
pub(crate) fn mem_trace(stage: &str, store: &Store) {
    let stats = store.stats();
    println!(
        "  mem [{stage}]: RSS {:.0} MiB, stage peak {:.0} MiB, heap in use {:.0} MiB, stage heap peak {:.0} MiB | cache {:.0} MiB in {} blocks, head {:.0} MiB",
        status_kib("VmRSS") as f64 / 1024.0,
        vm_hwm_kib() as f64 / 1024.0,
        heap_in_use_bytes() as f64 / 1048576.0,
        heap_peak_bytes() as f64 / 1048576.0,
        stats.cache_bytes as f64 / 1048576.0,
        stats.cache_blocks,
        stats.head_bytes as f64 / 1048576.0,
    );
}

/// User + system CPU seconds of this process, from /proc/self/stat
/// (fields 14 and 15, in clock ticks of 1/100 s on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may contain spaces; fields resume after ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After ')': state is index 0, so utime (field 14) is index 11, stime index 12.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU time of this whole process in seconds, at nanosecond resolution.
/// On a loaded machine wall time mostly measures waiting for a core; the
/// process's own CPU time measures the work done.
pub(crate) fn process_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call, and CLOCK_PROCESS_CPUTIME_ID is supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return cpu_seconds();
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
