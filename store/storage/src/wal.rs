//! The write-ahead log: every ingest request is framed, appended to the
//! current segment and fsynced before it is acknowledged. Concurrent writers
//! share one fsync (group commit): whoever finds no sync running becomes the
//! leader and syncs everything written so far; the others wait for it.

pub mod record;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::error::StorageError;
pub use record::{RecordError, WalRecord};
use record::{SEGMENT_MAGIC, TailProblem, decode_payload, encode_frame, parse_segment};

const SEGMENT_SUFFIX: &str = ".wal";

/// What replay found in the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Segments read.
    pub segments: usize,
    /// Records handed to the caller.
    pub records: u64,
    /// Records whose CRC matched but whose payload could not be parsed.
    pub unreadable_records: u64,
    /// Bytes cut off torn or corrupt segment tails.
    pub truncated_bytes: u64,
    /// Segments that had a torn or corrupt tail.
    pub damaged_segments: usize,
    /// Records the store set aside because they could not be parsed or
    /// applied (filled in by the store's recovery, not by the log itself).
    pub quarantined_records: u64,
}

/// One record found by replay, as the caller receives it.
#[derive(Debug)]
pub struct Replayed<'a> {
    /// The segment holding it.
    pub segment: u64,
    /// Its position in the segment, from 0.
    pub ordinal: u64,
    /// The frame payload exactly as logged, so it can be set aside intact.
    pub payload: &'a [u8],
    /// The parsed record, or why its CRC-valid payload does not parse.
    pub record: Result<WalRecord, RecordError>,
}

struct WalState {
    file: Arc<File>,
    segment: u64,
    segment_len: u64,
    /// Records written to the OS so far (a sequence number).
    written: u64,
    /// Records known to be on stable storage.
    synced: u64,
    /// A leader is running an fsync.
    syncing: bool,
    /// Set when an fsync failed: the page cache state is unknown afterwards,
    /// so no later write may be acknowledged.
    poisoned: Option<String>,
}

/// An open write-ahead log directory.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    max_segment_bytes: u64,
    state: Mutex<WalState>,
    synced_tx: watch::Sender<u64>,
}

impl std::fmt::Debug for WalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalState")
            .field("segment", &self.segment)
            .field("written", &self.written)
            .field("synced", &self.synced)
            .finish_non_exhaustive()
    }
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}{SEGMENT_SUFFIX}"))
}

fn wal_io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Wal { op, path, source }
}

/// Segment ids present in `dir`, ascending. Files that are not segments are ignored.
pub fn list_segments(dir: &Path) -> Result<Vec<u64>, StorageError> {
    let mut ids = Vec::new();
    for entry in fs::read_dir(dir).map_err(wal_io("list", dir))? {
        let entry = entry.map_err(wal_io("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = name
            .strip_suffix(SEGMENT_SUFFIX)
            .and_then(|stem| stem.parse::<u64>().ok())
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(wal_io("fsync directory", dir))
}

fn create_segment(dir: &Path, id: u64) -> Result<File, StorageError> {
    let path = segment_path(dir, id);
    let mut file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)
        .map_err(wal_io("create segment", &path))?;
    file.write_all(SEGMENT_MAGIC)
        .map_err(wal_io("write segment header", &path))?;
    file.sync_data().map_err(wal_io("fsync", &path))?;
    // The new directory entry must survive a power cut too.
    sync_dir(dir)?;
    Ok(file)
}

/// Reads the records of segments already opened (and so repaired) by
/// [`Wal::open`] again, without changing any file: recovery replays once
/// more after a record panicked mid-apply, into a fresh head.
///
/// Blocking: call from a blocking context.
pub fn reread(
    dir: &Path,
    segments: &[u64],
    mut on_record: impl FnMut(Replayed<'_>),
) -> Result<(), StorageError> {
    for &id in segments {
        let path = segment_path(dir, id);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            // Removed by `Wal::open` (bad magic): it held nothing.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(wal_io("read segment", &path)(err)),
        };
        for (ordinal, payload) in parse_segment(&bytes).payloads.iter().enumerate() {
            on_record(Replayed {
                segment: id,
                ordinal: ordinal as u64,
                payload,
                record: decode_payload(payload),
            });
        }
    }
    Ok(())
}

impl Wal {
    /// Opens (creating if needed) the log in `dir`, hands every frame whose
    /// CRC holds to `on_record` (parsed or not, with its payload), truncates
    /// torn or corrupt tails, and starts a fresh segment for new appends.
    ///
    /// Blocking: call from a blocking context.
    pub fn open(
        dir: &Path,
        max_segment_bytes: u64,
        mut on_record: impl FnMut(Replayed<'_>),
    ) -> Result<(Wal, ReplayReport), StorageError> {
        fs::create_dir_all(dir).map_err(wal_io("create directory", dir))?;
        let segments = list_segments(dir)?;
        let mut report = ReplayReport::default();
        for &id in &segments {
            let path = segment_path(dir, id);
            let bytes = fs::read(&path).map_err(wal_io("read segment", &path))?;
            let parsed = parse_segment(&bytes);
            report.segments += 1;
            for (ordinal, payload) in parsed.payloads.iter().enumerate() {
                let record = decode_payload(payload);
                match &record {
                    Ok(_) => report.records += 1,
                    Err(err) => {
                        report.unreadable_records += 1;
                        tracing::warn!(segment = id, error = %err, "unreadable WAL record");
                    }
                }
                on_record(Replayed {
                    segment: id,
                    ordinal: ordinal as u64,
                    payload,
                    record,
                });
            }
            if let Some(problem) = parsed.problem {
                let cut = bytes.len() - parsed.valid_len;
                report.truncated_bytes += cut as u64;
                report.damaged_segments += 1;
                let is_last = Some(&id) == segments.last();
                tracing::warn!(
                    segment = id,
                    ?problem,
                    truncated_bytes = cut,
                    last_segment = is_last,
                    "WAL segment has a damaged tail; truncating it (a torn tail is expected after a crash)"
                );
                if problem == TailProblem::BadMagic {
                    // Not ours or never got its header: keep nothing of it.
                    fs::remove_file(&path).map_err(wal_io("remove segment", &path))?;
                } else {
                    let file = OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(wal_io("open segment", &path))?;
                    file.set_len(parsed.valid_len as u64)
                        .map_err(wal_io("truncate segment", &path))?;
                    file.sync_all().map_err(wal_io("fsync", &path))?;
                }
            }
        }
        let next = segments.last().map_or(1, |last| last + 1);
        let file = create_segment(dir, next)?;
        let (synced_tx, _) = watch::channel(0);
        let wal = Wal {
            dir: dir.to_path_buf(),
            max_segment_bytes,
            state: Mutex::new(WalState {
                file: Arc::new(file),
                segment: next,
                segment_len: SEGMENT_MAGIC.len() as u64,
                written: 0,
                synced: 0,
                syncing: false,
                poisoned: None,
            }),
            synced_tx,
        };
        Ok((wal, report))
    }

    fn lock(&self) -> MutexGuard<'_, WalState> {
        // A panic while holding this lock leaves only counters behind, which
        // stay consistent; keep serving rather than cascading the panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why the log refuses writes, once a write or fsync failed: the
    /// failure's message. `None` while it works.
    pub fn poisoned(&self) -> Option<String> {
        self.lock().poisoned.clone()
    }

    /// The segment new appends go to.
    pub fn current_segment(&self) -> u64 {
        self.lock().segment
    }

    /// Closes the current segment (fsynced) and starts a new one. Returns the
    /// new segment's id: every record appended before this call lives in a
    /// lower-numbered segment.
    ///
    /// Blocking (one fsync and a file creation).
    pub fn rotate(&self) -> Result<u64, StorageError> {
        let mut state = self.lock();
        self.rotate_locked(&mut state)?;
        Ok(state.segment)
    }

    fn rotate_locked(&self, state: &mut WalState) -> Result<(), StorageError> {
        if let Some(message) = &state.poisoned {
            return Err(StorageError::WalPoisoned {
                message: message.clone(),
            });
        }
        let old = segment_path(&self.dir, state.segment);
        if let Err(err) = state.file.sync_data() {
            state.poisoned = Some(err.to_string());
            return Err(wal_io("fsync", &old)(err));
        }
        // Everything written so far is durable now.
        state.synced = state.written;
        self.synced_tx.send_replace(state.synced);
        let next = state.segment + 1;
        state.file = Arc::new(create_segment(&self.dir, next)?);
        state.segment = next;
        state.segment_len = SEGMENT_MAGIC.len() as u64;
        Ok(())
    }

    /// Appends one record and returns once it is on stable storage, with the
    /// id of the segment that holds it.
    pub async fn append(&self, record: &WalRecord) -> Result<u64, StorageError> {
        let frame = encode_frame(record);
        let (seq, segment) = {
            let mut state = self.lock();
            if let Some(message) = &state.poisoned {
                return Err(StorageError::WalPoisoned {
                    message: message.clone(),
                });
            }
            if state.segment_len + frame.len() as u64 > self.max_segment_bytes
                && state.segment_len > SEGMENT_MAGIC.len() as u64
            {
                self.rotate_locked(&mut state)?;
            }
            let path = segment_path(&self.dir, state.segment);
            // A short write leaves a torn frame that replay truncates; the
            // log cannot promise anything about later frames, so poison it.
            if let Err(err) = (&*state.file).write_all(&frame) {
                state.poisoned = Some(err.to_string());
                return Err(wal_io("append", &path)(err));
            }
            state.segment_len += frame.len() as u64;
            state.written += 1;
            (state.written, state.segment)
        };
        self.wait_synced(seq).await?;
        Ok(segment)
    }

    async fn wait_synced(&self, seq: u64) -> Result<(), StorageError> {
        loop {
            let (mut rx, lead) = {
                let mut state = self.lock();
                if let Some(message) = &state.poisoned {
                    return Err(StorageError::WalPoisoned {
                        message: message.clone(),
                    });
                }
                if state.synced >= seq {
                    return Ok(());
                }
                if state.syncing {
                    // Subscribing under the lock means the leader's result
                    // cannot be published before we start watching.
                    (Some(self.synced_tx.subscribe()), None)
                } else {
                    state.syncing = true;
                    (
                        None,
                        Some((state.written, Arc::clone(&state.file), state.segment)),
                    )
                }
            };
            if let Some((target, file, segment)) = lead {
                let result = tokio::task::spawn_blocking(move || file.sync_data()).await;
                let mut state = self.lock();
                state.syncing = false;
                match result {
                    Ok(Ok(())) => {
                        state.synced = state.synced.max(target);
                        self.synced_tx.send_replace(state.synced);
                    }
                    Ok(Err(err)) => {
                        state.poisoned = Some(err.to_string());
                        self.synced_tx.send_replace(state.synced);
                        return Err(wal_io("fsync", &segment_path(&self.dir, segment))(err));
                    }
                    Err(join) => {
                        state.poisoned = Some(join.to_string());
                        self.synced_tx.send_replace(state.synced);
                        return Err(StorageError::task("wal fsync", join));
                    }
                }
            } else if let Some(rx) = rx.as_mut() {
                // The sender lives as long as `self`, so this only errors if
                // the log is being dropped, in which case we re-check state.
                let _ = rx.changed().await;
                // What is published is synced: a waiter it covers returns
                // without the lock, which every waiter of one fsync would
                // otherwise take at once, and which appends need (7 % of
                // the store's context switches at 32 HTTP clients on 16
                // cores). A failed fsync publishes no progress, so its
                // waiters take the lock and find the log poisoned.
                if *rx.borrow_and_update() >= seq {
                    return Ok(());
                }
            }
        }
    }

    /// Deletes every segment with an id below `segment` (their records are
    /// safely in uploaded blocks). Blocking.
    pub fn remove_segments_before(&self, segment: u64) -> Result<usize, StorageError> {
        self.remove_segments(|id| id < segment)
    }

    /// Deletes every segment (except the one being appended to) for which
    /// `remove` returns true. Blocking.
    pub fn remove_segments(&self, remove: impl Fn(u64) -> bool) -> Result<usize, StorageError> {
        let current = self.current_segment();
        let mut removed = 0;
        for id in list_segments(&self.dir)? {
            if id >= current || !remove(id) {
                continue;
            }
            let path = segment_path(&self.dir, id);
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(wal_io("remove segment", &path)(err)),
            }
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    /// Number of segment files and their total size in bytes. Blocking.
    pub fn disk_usage(&self) -> Result<(usize, u64), StorageError> {
        let mut bytes = 0;
        let ids = list_segments(&self.dir)?;
        for &id in &ids {
            let path = segment_path(&self.dir, id);
            if let Ok(meta) = fs::metadata(&path) {
                bytes += meta.len();
            }
        }
        Ok((ids.len(), bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_engine::model::{Label, LabelSet};

    fn record(n: usize) -> WalRecord {
        WalRecord {
            labels: LabelSet::new(vec![
                Label::new("__name__", "process_cpu"),
                Label::new("seq", n.to_string()),
            ]),
            time_ms: n as i64,
            duration_nanos: 0,
            pprof: vec![7; 50],
            idempotency_key: None,
        }
    }

    fn replay(dir: &Path) -> (Wal, ReplayReport, Vec<(u64, WalRecord)>) {
        let mut seen = Vec::new();
        let (wal, report) = Wal::open(dir, 1 << 20, |r| {
            if let Ok(record) = r.record {
                seen.push((r.segment, record));
            }
        })
        .expect("open wal");
        (wal, report, seen)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_are_all_replayed_in_a_later_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (wal, _, _) = replay(dir.path());
        let wal = Arc::new(wal);
        let mut tasks = Vec::new();
        for n in 0..64 {
            let wal = Arc::clone(&wal);
            tasks.push(tokio::spawn(async move { wal.append(&record(n)).await }));
        }
        for task in tasks {
            task.await.expect("join").expect("append");
        }
        drop(wal);
        let (_, report, seen) = replay(dir.path());
        assert_eq!(report.records, 64);
        let mut times: Vec<i64> = seen.iter().map(|(_, r)| r.time_ms).collect();
        times.sort_unstable();
        assert_eq!(times, (0..64).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_torn_tail_is_truncated_and_earlier_records_survive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (wal, _, _) = replay(dir.path());
        for n in 0..3 {
            wal.append(&record(n)).await.expect("append");
        }
        let segment = wal.current_segment();
        drop(wal);
        // Simulate a crash mid-write: half a frame at the end.
        let path = segment_path(dir.path(), segment);
        let half = &encode_frame(&record(99))[..20];
        let mut file = OpenOptions::new().append(true).open(&path).expect("open");
        file.write_all(half).expect("write");
        drop(file);
        let (wal, report, seen) = replay(dir.path());
        assert_eq!(report.records, 3);
        assert_eq!(report.truncated_bytes, 20);
        assert_eq!(report.damaged_segments, 1);
        assert_eq!(seen.len(), 3);
        // The truncated segment now parses cleanly, and new appends work.
        wal.append(&record(4)).await.expect("append after recovery");
        drop(wal);
        let (_, report, _) = replay(dir.path());
        assert_eq!(report.records, 4);
        assert_eq!(report.damaged_segments, 0);
    }

    #[tokio::test]
    async fn rotation_and_removal_drop_only_older_segments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (wal, _, _) = replay(dir.path());
        wal.append(&record(1)).await.expect("append");
        let next = wal.rotate().expect("rotate");
        wal.append(&record(2)).await.expect("append");
        assert_eq!(wal.remove_segments_before(next).expect("remove"), 1);
        drop(wal);
        let (_, report, seen) = replay(dir.path());
        assert_eq!(report.records, 1);
        assert_eq!(seen[0].1.time_ms, 2);
        assert_eq!(seen[0].0, next);
    }

    #[tokio::test]
    async fn segments_rotate_by_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (wal, _) = Wal::open(dir.path(), 200, |_| {}).expect("open");
        let first = wal.current_segment();
        for n in 0..10 {
            wal.append(&record(n)).await.expect("append");
        }
        assert!(wal.current_segment() > first + 2);
        drop(wal);
        let (_, report, _) = replay(dir.path());
        assert_eq!(report.records, 10);
    }
}
