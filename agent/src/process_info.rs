//! What the agent knows about a sampled process, read from `/proc` while it
//! lives and kept (bounded) after it exits, so short-lived processes can
//! still be symbolized at drain time.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::bounded_cache::BoundedCache;
use crate::proc_maps::{self, MapEntry, MappingKind};

/// An ELF file a process maps, held open so it can be read after the
/// process (or its mount namespace) is gone.
#[derive(Debug)]
pub struct MappedFile {
    /// GNU build id as lowercase hex, empty when the file has none.
    pub build_id: String,
    /// The path the process sees.
    pub path: String,
    /// What every node-wide cache keys this file by.
    pub identity: FileIdentity,
    /// The open file; read with `pread` only (see `elf_symbols`).
    pub file: File,
    /// Counts this file against the table's open-file budget while it lives.
    _open: OpenFileToken,
}

/// One open file counted in a [`ProcessTable`]'s budget: snapshots of
/// exited processes hold their files too, so the cache's own bound alone
/// would not bound descriptors.
#[derive(Debug)]
struct OpenFileToken(Arc<AtomicUsize>);

impl OpenFileToken {
    fn new(count: &Arc<AtomicUsize>) -> OpenFileToken {
        count.fetch_add(1, Ordering::Relaxed);
        OpenFileToken(Arc::clone(count))
    }
}

impl Drop for OpenFileToken {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A file as the kernel knows it, the key of every node-wide symbol and
/// unwind cache.
///
/// Neither a path nor a build id will do. Paths repeat across containers:
/// many operators' binaries are all `/manager`, and Go binaries seldom carry
/// a GNU build id to tell them apart. A build id is only what the file says
/// of itself: a pod can copy libc's into its own binary and, were build ids
/// keys, rename other pods' libc frames. The open file's device and inode
/// cannot be chosen by a pod; its size and change times tell a rewritten or
/// reused inode apart. Containers started from one image still share their
/// image's files (overlayfs maps the lower layer's own inode), so one copy
/// of libc is read once however many pods run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
    pub size: u64,
    /// Last modification, ns since the epoch.
    pub modified_ns: i64,
    /// Last status change (which no process can set back), ns since the epoch.
    pub changed_ns: i64,
}

impl FileIdentity {
    /// The identity of an open file, from its metadata.
    pub fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        let ns =
            |seconds: i64, nanos: i64| seconds.saturating_mul(1_000_000_000).saturating_add(nanos);
        FileIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.size(),
            modified_ns: ns(metadata.mtime(), metadata.mtime_nsec()),
            changed_ns: ns(metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

/// A process's executable mappings and names at one point in time.
#[derive(Debug)]
pub struct ProcessSnapshot {
    /// Process id.
    pub pid: u32,
    /// Process start, ns since boot (as the kernel recorded it).
    pub start_boottime_ns: u64,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// Executable mappings sorted by start.
    pub maps: Vec<MapEntry>,
    /// For each entry of `maps`, its open file when it is a readable file.
    pub files: Vec<Option<Arc<MappedFile>>>,
}

/// Why a process could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcessReadError {
    /// The process exited (or its PID now belongs to another process).
    #[error("process {pid} is gone")]
    Gone {
        /// Process id.
        pid: u32,
    },
    /// A `/proc` file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// `/proc/PID/maps` was malformed.
    #[error("cannot parse maps of process {pid}")]
    Maps {
        /// Process id.
        pid: u32,
        /// The parse error.
        #[source]
        source: proc_maps::MapsParseError,
    },
}

impl ProcessReadError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ProcessReadError::Gone { .. } => "process_gone",
            ProcessReadError::Io { .. } => "proc_io",
            ProcessReadError::Maps { .. } => "maps_malformed",
        }
    }
}

/// Start time of a process in clock ticks since boot, from `/proc/PID/stat`
/// (field 22), or `None` when it is not readable.
pub fn parse_stat_start_ticks(stat: &str) -> Option<u64> {
    // comm (field 2) is parenthesised and may contain spaces and ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Field 3 is the first after comm, so field 22 is the 20th.
    after_comm.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// Converts a kernel `start_boottime` in ns to `/proc` clock ticks, the way
/// the kernel's `nsec_to_clock_t` does.
pub fn boottime_ns_to_ticks(ns: u64, ticks_per_second: u64) -> u64 {
    ns / (1_000_000_000 / ticks_per_second.max(1))
}

/// Reads processes from `/proc` and keeps their snapshots and open files in
/// bounded caches.
#[derive(Debug)]
pub struct ProcessTable {
    proc_root: PathBuf,
    ticks_per_second: u64,
    snapshots: BoundedCache<(u32, u64), Arc<ProcessSnapshot>>,
    files: BoundedCache<FileIdentity, Arc<MappedFile>>,
    /// Open files dropped from `files` since the last check.
    files_evicted: u64,
    /// Mapped files open now, wherever they are held.
    open_files: Arc<AtomicUsize>,
    /// Most mapped files open at once.
    max_open_files: usize,
    /// Files not opened because the budget was spent, since the last take.
    refused_files: u64,
}

impl ProcessTable {
    /// A table reading `/proc`, keeping at most `max_processes` snapshots and
    /// `max_files` open files.
    pub fn new(max_processes: usize, max_files: usize) -> ProcessTable {
        // SAFETY: sysconf only reads a configuration value.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        ProcessTable {
            proc_root: PathBuf::from("/proc"),
            ticks_per_second: u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100),
            snapshots: BoundedCache::new(max_processes),
            files: BoundedCache::new(max_files),
            files_evicted: 0,
            open_files: Arc::new(AtomicUsize::new(0)),
            max_open_files: max_files,
            refused_files: 0,
        }
    }

    /// Reads (or re-reads) the process and caches its snapshot. Called when
    /// the kernel announces a new process and again at drain time, so maps
    /// changed by `dlopen` are seen while the process lives.
    pub fn refresh(
        &mut self,
        pid: u32,
        start_boottime_ns: u64,
    ) -> Result<Arc<ProcessSnapshot>, ProcessReadError> {
        let snapshot = self.read_process(pid, start_boottime_ns)?;
        // A process that exited but is not reaped yet (a zombie) keeps its
        // /proc entry with no mappings left: the snapshot taken while it
        // lived is the one that names its last window's frames.
        if snapshot.maps.is_empty()
            && let Some(cached) = self.snapshots.get(&(pid, start_boottime_ns))
            && !cached.maps.is_empty()
        {
            return Ok(Arc::clone(cached));
        }
        let snapshot = Arc::new(snapshot);
        self.snapshots
            .insert((pid, start_boottime_ns), Arc::clone(&snapshot));
        Ok(snapshot)
    }

    /// The freshest snapshot: re-read when alive, the cached one when the
    /// process is gone, `None` when it was never seen alive.
    pub fn snapshot(&mut self, pid: u32, start_boottime_ns: u64) -> Option<Arc<ProcessSnapshot>> {
        match self.refresh(pid, start_boottime_ns) {
            Ok(snapshot) => Some(snapshot),
            Err(_) => self.snapshots.get(&(pid, start_boottime_ns)).cloned(),
        }
    }

    /// Whether the process (this pid with this start time) still runs.
    pub fn is_alive(&self, pid: u32, start_boottime_ns: u64) -> bool {
        let expected = boottime_ns_to_ticks(start_boottime_ns, self.ticks_per_second);
        std::fs::read_to_string(self.proc_path(pid, "stat"))
            .is_ok_and(|stat| parse_stat_start_ticks(&stat) == Some(expected))
    }

    /// Mapped files open now (cached, or held by snapshots).
    pub fn open_files(&self) -> usize {
        self.open_files.load(Ordering::Relaxed)
    }

    /// Files left closed since the last call because `max_files` were open.
    pub fn take_refused_files(&mut self) -> u64 {
        std::mem::take(&mut self.refused_files)
    }

    /// Returns and resets the number of open files evicted since the last call.
    pub fn take_file_evictions(&mut self) -> u64 {
        let now = self.files.evictions();
        let new = now - self.files_evicted;
        self.files_evicted = now;
        new
    }

    /// Number of cached process snapshots.
    pub fn cached_processes(&self) -> usize {
        self.snapshots.len()
    }

    fn proc_path(&self, pid: u32, file: &str) -> PathBuf {
        self.proc_root.join(pid.to_string()).join(file)
    }

    fn read_text(&self, path: &Path, pid: u32) -> Result<String, ProcessReadError> {
        std::fs::read_to_string(path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound
                || source.raw_os_error() == Some(libc::ESRCH)
            {
                ProcessReadError::Gone { pid }
            } else {
                ProcessReadError::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })
    }

    fn read_process(
        &mut self,
        pid: u32,
        start_boottime_ns: u64,
    ) -> Result<ProcessSnapshot, ProcessReadError> {
        let stat = self.read_text(&self.proc_path(pid, "stat"), pid)?;
        let expected = boottime_ns_to_ticks(start_boottime_ns, self.ticks_per_second);
        if parse_stat_start_ticks(&stat) != Some(expected) {
            // The PID was reused: this is not the process that was sampled.
            return Err(ProcessReadError::Gone { pid });
        }
        let maps_text = self.read_text(&self.proc_path(pid, "maps"), pid)?;
        let maps = proc_maps::parse_executable_maps(&maps_text)
            .map_err(|source| ProcessReadError::Maps { pid, source })?;
        let comm = self
            .read_text(&self.proc_path(pid, "comm"), pid)
            .map(|c| c.trim_end().to_owned())
            .unwrap_or_default();
        let mut opened: HashMap<String, Option<Arc<MappedFile>>> = HashMap::new();
        let files = maps
            .iter()
            .map(|entry| match &entry.kind {
                MappingKind::File { path, .. } => opened
                    .entry(path.clone())
                    .or_insert_with(|| self.open_mapped_file(pid, entry, path))
                    .clone(),
                MappingKind::Special(_) | MappingKind::Anonymous => None,
            })
            .collect();
        Ok(ProcessSnapshot {
            pid,
            start_boottime_ns,
            comm,
            maps,
            files,
        })
    }

    /// Opens the file behind a mapping: through `map_files` (works for
    /// deleted files), else through the process's root (its mount namespace).
    fn open_mapped_file(
        &mut self,
        pid: u32,
        entry: &MapEntry,
        path: &str,
    ) -> Option<Arc<MappedFile>> {
        use std::os::unix::fs::OpenOptionsExt;
        // map_files is the mapped file itself. O_NONBLOCK: a FIFO planted at
        // a path must not block the open.
        let map_file = self.proc_path(pid, &format!("map_files/{:x}-{:x}", entry.start, entry.end));
        // A file already open is found by its identity without opening it again.
        if let Ok(metadata) = std::fs::metadata(&map_file)
            && let Some(known) = self.files.get(&FileIdentity::of(&metadata))
        {
            return Some(Arc::clone(known));
        }
        // Open files are bounded whatever holds them, so no process can
        // exhaust the agent's descriptors: a process mapping 60,000 files
        // gets its first files opened, the rest none.
        if self.open_files.load(Ordering::Relaxed) >= self.max_open_files {
            self.refused_files += 1;
            return None;
        }
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&map_file)
        {
            Ok(file) => file,
            Err(_) => {
                // Without map_files (no CAP_CHECKPOINT_RESTORE before 5.9):
                // the path beneath the process's own root, which symlinks
                // cannot leave, and only if it is the (device, inode) the
                // maps line names (the process may have swapped the file
                // since); see `is_mapped_file` for overlayfs and btrfs.
                let root = self.proc_path(pid, "root");
                let file = crate::safe_open::open_beneath(
                    &root.to_string_lossy(),
                    path.trim_start_matches('/'),
                )
                .ok()?;
                let MappingKind::File { device, inode, .. } = &entry.kind else {
                    return None;
                };
                if !crate::safe_open::is_mapped_file(&file, *device, *inode).ok()? {
                    return None;
                }
                file
            }
        };
        let metadata = file.metadata().ok()?;
        if !metadata.is_file() {
            return None;
        }
        let identity = FileIdentity::of(&metadata);
        if let Some(known) = self.files.get(&identity) {
            return Some(Arc::clone(known));
        }
        let mut mapped = MappedFile {
            build_id: String::new(),
            path: path.to_owned(),
            identity,
            file,
            _open: OpenFileToken::new(&self.open_files),
        };
        // Read with pread, never mapped: the process can truncate the file.
        if let Some(build_id) = crate::elf_symbols::build_id(&mapped.file) {
            mapped.build_id = build_id.iter().map(|b| format!("{b:02x}")).collect();
        }
        let mapped = Arc::new(mapped);
        self.files.insert(identity, Arc::clone(&mapped));
        Some(mapped)
    }
}

#[cfg(test)]
mod tests;
