//! The write-ahead log: every ingest request is framed, appended to the
//! current segment and fsynced before it is acknowledged. One thread owns
//! the open segment (`writer`): concurrent appends queue for it and share
//! one fsync (group commit), and no async worker ever waits on the disk.
//! A failed write or fsync refuses writes only until a fresh segment can
//! be started (see `writer`); a damaged segment found at open is set aside
//! whole (see `damaged`).

mod damaged;
pub mod record;
mod writer;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

use tokio::sync::oneshot;

use crate::error::StorageError;
pub use damaged::quarantine_dir;
pub use record::{RecordError, WalRecord};
use record::{SEGMENT_MAGIC, decode_payload, encode_frame, parse_segment};
use writer::{Command, Status, Writer};
pub use writer::{REOPEN_EVERY, WalFailure};

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
    /// Bytes at and after the damage in damaged segments: not replayed,
    /// kept in the quarantined original.
    pub skipped_bytes: u64,
    /// Segments that had a torn or corrupt tail or no header.
    pub damaged_segments: usize,
    /// Damaged segments moved to [`quarantine_dir`] (all of them, unless
    /// moving one failed and open failed with it).
    pub quarantined_segments: usize,
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

/// One record framed for the log (length, CRC32, payload), ready to append.
#[derive(Debug)]
pub struct WalFrame(Vec<u8>);

impl WalFrame {
    /// Frames `record`: a copy of its pprof and a CRC over it, CPU work
    /// done by the caller, not by the log's one writer thread.
    pub fn encode(record: &WalRecord) -> Self {
        Self(encode_frame(record))
    }
}

/// An open write-ahead log directory. Dropping it stops its writer thread
/// once the appends queued before are answered.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    status: Arc<Status>,
    commands: Option<mpsc::Sender<Command>>,
    writer: Option<std::thread::JoinHandle<()>>,
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
            // Moved aside by `Wal::open` (no header): it held nothing.
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
    /// CRC holds to `on_record` (parsed or not, with its payload), sets
    /// damaged segments aside (their good frames stay, see `damaged`), and
    /// starts a fresh segment for new appends, with its writer thread.
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
                let skipped = bytes.len() - parsed.valid_len;
                report.skipped_bytes += skipped as u64;
                report.damaged_segments += 1;
                let aside = damaged::set_aside(dir, id, &bytes, parsed.valid_len, problem)?;
                report.quarantined_segments += 1;
                tracing::warn!(
                    segment = id,
                    ?problem,
                    skipped_bytes = skipped,
                    last_segment = Some(&id) == segments.last(),
                    kept_at = %aside.display(),
                    "WAL segment is damaged (a torn tail is expected after a crash); replayed the records before the damage and moved the original aside"
                );
            }
        }
        let next = segments.last().map_or(1, |last| last + 1);
        let file = create_segment(dir, next)?;
        let status = Arc::new(Status::new(next));
        let writer = Writer::new(
            dir.to_path_buf(),
            max_segment_bytes,
            Arc::clone(&status),
            file,
            next,
        );
        let (commands, receiver) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kiln-wal".to_owned())
            .spawn(move || writer.run(receiver))
            .map_err(wal_io("start the writer thread", dir))?;
        let wal = Wal {
            dir: dir.to_path_buf(),
            status,
            commands: Some(commands),
            writer: Some(thread),
        };
        Ok((wal, report))
    }

    fn send(&self, command: Command) -> Result<(), StorageError> {
        self.commands
            .as_ref()
            .and_then(|commands| commands.send(command).ok())
            .ok_or_else(writer_gone)
    }

    /// Why the log refuses writes now, after a write or fsync failed and a
    /// fresh segment could not be started yet. `None` while it works.
    pub fn failure(&self) -> Option<WalFailure> {
        self.status.failure()
    }

    /// Writes and fsyncs that failed since open.
    pub fn failed_writes(&self) -> u64 {
        self.status.failures()
    }

    /// Times the log went on in a fresh segment after a failure since open.
    pub fn reopens(&self) -> u64 {
        self.status.reopens()
    }

    /// The segment new appends go to.
    pub fn current_segment(&self) -> u64 {
        self.status.current()
    }

    /// Closes the current segment (fsynced) and starts a new one. Returns
    /// the segment new appends go to: every record appended before this
    /// call lives in a lower-numbered segment. While the log refuses
    /// writes, it tries a fresh segment, and answers the id that one will
    /// take even when it cannot be created yet (no append lands below it).
    ///
    /// Blocking: waits for the writer thread.
    pub fn rotate(&self) -> Result<u64, StorageError> {
        let (done, reply) = mpsc::sync_channel(1);
        self.send(Command::Rotate { done })?;
        reply.recv().map_err(|_| writer_gone())?
    }

    /// Appends one record and returns once it is on stable storage, with the
    /// id of the segment that holds it.
    pub async fn append(&self, record: &WalRecord) -> Result<u64, StorageError> {
        let frame = encode_frame(record);
        let (done, reply) = oneshot::channel();
        self.send(Command::Append { frame, done })?;
        reply.await.map_err(|_| writer_gone())?
    }

    /// [`Wal::append`] from blocking code, of a frame encoded beforehand
    /// ([`WalFrame::encode`]): an ingest encodes its record while it holds a
    /// turn, and waits here for the fsync holding none, on its blocking-pool
    /// thread, so no async worker waits for the log.
    ///
    /// Blocking: never call it on an async worker.
    pub fn append_frame_blocking(&self, frame: WalFrame) -> Result<u64, StorageError> {
        let (done, reply) = oneshot::channel();
        self.send(Command::Append {
            frame: frame.0,
            done,
        })?;
        reply.blocking_recv().map_err(|_| writer_gone())?
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

impl Drop for Wal {
    fn drop(&mut self) {
        // Closing the channel stops the writer once it has answered what
        // was queued; waiting for it means no write of this log outlives
        // the handle (a reopen of the same directory comes right after).
        self.commands.take();
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            tracing::error!("the write-ahead log's writer thread panicked");
        }
    }
}

fn writer_gone() -> StorageError {
    StorageError::WalFailed {
        message: "the write-ahead log's writer thread stopped".to_owned(),
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

    /// The files in the quarantine of `dir`'s log with the extension `ext`.
    fn quarantined(dir: &Path, ext: &str) -> Vec<PathBuf> {
        let aside = quarantine_dir(dir);
        let mut files: Vec<PathBuf> = match fs::read_dir(&aside) {
            Ok(entries) => entries
                .map(|e| e.expect("entry").path())
                .filter(|p| p.extension().is_some_and(|e| e == ext))
                .collect(),
            Err(_) => Vec::new(),
        };
        files.sort();
        files
    }

    #[tokio::test]
    async fn a_torn_tail_is_set_aside_whole_and_earlier_records_survive() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("wal");
        let (wal, _, _) = replay(&dir);
        for n in 0..3 {
            wal.append(&record(n)).await.expect("append");
        }
        let segment = wal.current_segment();
        drop(wal);
        // Simulate a crash mid-write: half a frame at the end.
        let path = segment_path(&dir, segment);
        let half = &encode_frame(&record(99))[..20];
        let mut file = OpenOptions::new().append(true).open(&path).expect("open");
        file.write_all(half).expect("write");
        drop(file);
        let damaged = fs::read(&path).expect("read");
        let (wal, report, seen) = replay(&dir);
        assert_eq!(report.records, 3);
        assert_eq!(report.skipped_bytes, 20);
        assert_eq!(report.damaged_segments, 1);
        assert_eq!(report.quarantined_segments, 1);
        assert_eq!(seen.len(), 3);
        // The original, torn tail included, is kept byte for byte; the log
        // holds the records before the tear.
        let kept = quarantined(&dir, "wal");
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(fs::read(&kept[0]).expect("read kept"), damaged);
        assert_eq!(quarantined(&dir, "reason").len(), 1);
        assert_eq!(
            fs::read(&path).expect("read repaired").len(),
            damaged.len() - 20
        );
        // New appends work, and the next open finds nothing damaged.
        wal.append(&record(4)).await.expect("append after recovery");
        drop(wal);
        let (_, report, _) = replay(&dir);
        assert_eq!(report.records, 4);
        assert_eq!(report.damaged_segments, 0);
        assert_eq!(quarantined(&dir, "wal").len(), 1);
    }

    #[tokio::test]
    async fn a_corrupt_frame_mid_segment_keeps_the_records_before_it_and_the_bytes_after() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("wal");
        let (wal, _, _) = replay(&dir);
        for n in 0..3 {
            wal.append(&record(n)).await.expect("append");
        }
        let segment = wal.current_segment();
        drop(wal);
        // A flipped bit in the second frame's payload: its CRC fails, and
        // the third frame after it cannot be trusted to start where the
        // second's length says.
        let path = segment_path(&dir, segment);
        let mut bytes = fs::read(&path).expect("read");
        let second = SEGMENT_MAGIC.len() + encode_frame(&record(0)).len();
        bytes[second + record::FRAME_HEADER_BYTES + 3] ^= 0x40;
        fs::write(&path, &bytes).expect("write");
        let (_, report, seen) = replay(&dir);
        assert_eq!(report.records, 1);
        assert_eq!(report.quarantined_segments, 1);
        assert_eq!(seen.iter().map(|(_, r)| r.time_ms).collect::<Vec<_>>(), [0]);
        let kept = quarantined(&dir, "wal");
        assert_eq!(fs::read(&kept[0]).expect("read kept"), bytes);
        assert_eq!(fs::read(&path).expect("read repaired").len(), second);
    }

    #[tokio::test]
    async fn a_segment_without_a_header_is_moved_aside_not_deleted() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("wal");
        fs::create_dir_all(&dir).expect("dir");
        let foreign = b"not a kiln segment at all".to_vec();
        fs::write(segment_path(&dir, 5), &foreign).expect("write");
        let (wal, report, seen) = replay(&dir);
        assert!(seen.is_empty());
        assert_eq!(report.quarantined_segments, 1);
        assert!(!segment_path(&dir, 5).exists());
        let kept = quarantined(&dir, "wal");
        assert_eq!(fs::read(&kept[0]).expect("read kept"), foreign);
        assert_eq!(wal.current_segment(), 6);
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
