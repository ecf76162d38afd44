//! Handing freed heap memory back to the operating system.
//!
//! Measured with the workload benchmark
//! (docs/benchmarks/log/2026-11-22-store-workload.md):
//! after ingest and compaction the store's live heap was ~20 MiB while RSS
//! grew past 2.9 GiB. glibc's allocator keeps freed memory in per-thread
//! arenas (ingest, flush and compaction run on many blocking-pool threads)
//! and, once a large buffer has been freed, raises its mmap threshold so
//! later large buffers (decoded blocks, encoded blocks, merge state) come
//! from those arenas too. That memory is free but never returned, so RSS
//! only grows. `malloc_trim` returns the free pages of every arena.

/// Caps what glibc keeps between trims, once per process (the settings are
/// process-wide). Measured with kiln-store under a memory limit
/// (`store/tests/memory_limit.rs`): with a 24 MiB head, RSS still climbed
/// to 300 MiB between flushes, and halved with these settings.
/// - Two arenas instead of eight per core: ingest, flush and compaction run
///   on many blocking-pool threads, and each arena keeps its own free pages.
/// - A fixed 256 KiB mmap threshold: without it, freeing one large buffer
///   raises the threshold (up to 32 MiB), and later large buffers (decoded
///   requests, encoded blocks, merge state) stay in the arenas after they
///   are freed instead of going back to the OS at once.
pub(super) fn bound_allocator_retention() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(tune);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune() {
    // SAFETY: mallopt only changes allocator parameters; glibc takes its own
    // lock, and these values are within the documented ranges.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune() {}

/// Returns free allocator memory to the OS after a memory-heavy step
/// (a flush or a compaction). Runs on the blocking pool: trimming walks
/// every arena and can take milliseconds when much memory is free.
pub(super) async fn release_free_memory() {
    // A failed join only means the trim did not run; nothing depends on it.
    let _ = tokio::task::spawn_blocking(trim).await;
}

/// [`release_free_memory`] on the calling thread, for code already on the
/// blocking pool (a query that evicted decoded blocks from the cache).
pub(super) fn release_free_memory_now() {
    trim();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only releases memory the allocator holds as free;
    // it takes the arena locks itself and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators (musl, macOS) return memory on their own schedule.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
