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
mod tests;
