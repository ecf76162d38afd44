//! The thread that owns the open segment: every write, fsync and segment
//! creation of the log runs here, never on an async worker, where one slow
//! disk would stall every request sharing that worker.
//!
//! Appends arrive over a channel. Whatever queued while the last fsync ran
//! is written and then shares the next one (group commit); each append is
//! answered only once its frame is on stable storage.
//!
//! A failed write or fsync is not the end of the log. The records not yet
//! synced are answered with the error, never acknowledged, and the bytes
//! written for them are cut off again, so a later replay neither stores
//! what their clients were told failed nor meets a torn frame. The segment
//! is then left for good: after a failed fsync the kernel may have dropped
//! pages it still reports clean, so nothing more is trusted to it. The next
//! write, and a retry every [`REOPEN_EVERY`] while none comes (a store
//! that is not ready gets no traffic), starts a fresh segment; once one
//! is created the log takes writes again. While even that fails (a full
//! disk, a dead volume), [`WalFailure::reopen_error`] says so, and the
//! store reports itself not live, so an orchestrator restarts it.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use super::record::SEGMENT_MAGIC;
use super::{create_segment, segment_path, wal_io};
use crate::error::StorageError;

/// How often a failed log tries a fresh segment while no write comes.
pub const REOPEN_EVERY: Duration = Duration::from_secs(1);
/// Most commands taken into one group commit, so the first of a long queue
/// is not kept waiting for the last.
const MAX_BATCH: usize = 4096;

/// Why the log refuses writes now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalFailure {
    /// The write or fsync that failed.
    pub message: String,
    /// Why the latest attempt to go on in a fresh segment failed too;
    /// `None` before the first attempt.
    pub reopen_error: Option<String>,
}

/// What the log's handle and its writer thread share.
#[derive(Debug, Default)]
pub(super) struct Status {
    /// The segment the next append goes to.
    current: AtomicU64,
    /// Set while the log refuses writes.
    failure: Mutex<Option<WalFailure>>,
    /// Writes and fsyncs that failed since open.
    failures: AtomicU64,
    /// Fresh segments started after a failure since open.
    reopens: AtomicU64,
}

impl Status {
    pub(super) fn new(current: u64) -> Self {
        Self {
            current: AtomicU64::new(current),
            ..Self::default()
        }
    }

    fn failure_lock(&self) -> MutexGuard<'_, Option<WalFailure>> {
        // Only whole values are stored under this lock.
        self.failure.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn failure(&self) -> Option<WalFailure> {
        self.failure_lock().clone()
    }

    pub(super) fn current(&self) -> u64 {
        self.current.load(Ordering::SeqCst)
    }

    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    pub(super) fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }
}

/// What the handle asks of the writer.
pub(super) enum Command {
    /// Write `frame` and answer with its segment once it is synced.
    Append {
        frame: Vec<u8>,
        done: oneshot::Sender<Result<u64, StorageError>>,
    },
    /// Sync what was written, start a new segment, and answer with the
    /// segment the next append goes to. Asked from blocking code.
    Rotate {
        done: SyncSender<Result<u64, StorageError>>,
    },
}

/// The writer thread's state.
pub(super) struct Writer {
    dir: PathBuf,
    max_segment_bytes: u64,
    status: Arc<Status>,
    /// The open segment; `None` while the log refuses writes.
    file: Option<File>,
    /// The id of the open (or last failed) segment.
    segment: u64,
    /// The id the next segment created takes.
    next: u64,
    /// Bytes written to the open segment.
    len: u64,
    /// Bytes of the open segment known to be on stable storage.
    synced_len: u64,
    /// Appends written and not yet synced, with their segment.
    pending: Vec<(oneshot::Sender<Result<u64, StorageError>>, u64)>,
}

impl Writer {
    /// A writer appending to `file`, segment `segment`, just created.
    pub(super) fn new(
        dir: PathBuf,
        max_segment_bytes: u64,
        status: Arc<Status>,
        file: File,
        segment: u64,
    ) -> Self {
        let magic = SEGMENT_MAGIC.len() as u64;
        Self {
            dir,
            max_segment_bytes,
            status,
            file: Some(file),
            segment,
            next: segment + 1,
            len: magic,
            synced_len: magic,
            pending: Vec::new(),
        }
    }

    /// Serves commands until every handle is gone.
    pub(super) fn run(mut self, commands: Receiver<Command>) {
        loop {
            let first = if self.file.is_some() {
                match commands.recv() {
                    Ok(command) => command,
                    Err(_) => break,
                }
            } else {
                match commands.recv_timeout(REOPEN_EVERY) {
                    Ok(command) => command,
                    Err(RecvTimeoutError::Timeout) => {
                        self.reopen();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            self.handle(first);
            for _ in 1..MAX_BATCH {
                match commands.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(_) => break,
                }
            }
            self.sync();
        }
        self.sync();
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Append { frame, done } => {
                if let Err(err) = self.write(&frame) {
                    let _ = done.send(Err(err));
                    return;
                }
                self.pending.push((done, self.segment));
            }
            Command::Rotate { done } => {
                self.rotate();
                let _ = done.send(Ok(self.status.current()));
            }
        }
    }

    /// Writes one frame to the open segment, starting one first if the log
    /// failed or the segment is full. Every write while the log fails tries
    /// a fresh segment: a try is a file created and removed, and a store
    /// whose log fails is not ready, so few writes come.
    fn write(&mut self, frame: &[u8]) -> Result<(), StorageError> {
        self.reopen();
        let magic = SEGMENT_MAGIC.len() as u64;
        if self.file.is_some()
            && self.len + frame.len() as u64 > self.max_segment_bytes
            && self.len > magic
        {
            self.rotate();
        }
        let Some(file) = self.file.as_mut() else {
            return Err(self.refusal());
        };
        match file.write_all(frame) {
            Ok(()) => {
                self.len += frame.len() as u64;
                Ok(())
            }
            Err(err) => {
                let err = wal_io("append", &segment_path(&self.dir, self.segment))(err);
                self.fail(&err);
                Err(err)
            }
        }
    }

    /// The error a write gets while the log refuses writes.
    fn refusal(&self) -> StorageError {
        let failure = self.status.failure();
        StorageError::WalFailed {
            message: failure.map_or_else(
                || "the write-ahead log has no open segment".to_owned(),
                |f| match f.reopen_error {
                    Some(reopen) => {
                        format!("{}; a fresh segment failed too: {reopen}", f.message)
                    }
                    None => f.message,
                },
            ),
        }
    }

    /// Syncs what was written and answers the appends it covers.
    fn sync(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let Some(file) = self.file.as_ref() else {
            // `fail` answered them already; nothing is left to sync.
            return;
        };
        match file.sync_data() {
            Ok(()) => {
                self.synced_len = self.len;
                for (done, segment) in self.pending.drain(..) {
                    let _ = done.send(Ok(segment));
                }
            }
            Err(err) => {
                let err = wal_io("fsync", &segment_path(&self.dir, self.segment))(err);
                self.fail(&err);
            }
        }
    }

    /// Leaves the open segment after `error`: answers the appends not yet
    /// synced with it, cuts their bytes off again, and refuses writes until
    /// a fresh segment is started.
    fn fail(&mut self, error: &StorageError) {
        let message = error.to_string();
        tracing::error!(segment = self.segment, error = %message, "write-ahead log write failed; refusing writes until a fresh segment can be started");
        for (done, _) in self.pending.drain(..) {
            let _ = done.send(Err(StorageError::WalFailed {
                message: message.clone(),
            }));
        }
        if let Some(file) = self.file.take()
            && self.len > self.synced_len
        {
            // Best effort: if this fails too, replay finds a damaged tail
            // and sets the whole segment aside, good records kept.
            if let Err(err) = file
                .set_len(self.synced_len)
                .and_then(|()| file.sync_data())
            {
                tracing::warn!(segment = self.segment, error = %err, "could not cut the unacknowledged records off a failed WAL segment");
            }
        }
        self.status.failures.fetch_add(1, Ordering::Relaxed);
        *self.status.failure_lock() = Some(WalFailure {
            message,
            reopen_error: None,
        });
        self.status.current.store(self.next, Ordering::SeqCst);
    }

    /// Syncs the open segment and starts the next; while the log refuses
    /// writes, tries a fresh segment. Either way every record acknowledged
    /// so far lies below the segment the next append goes to.
    fn rotate(&mut self) {
        self.sync();
        if self.file.take().is_some() {
            self.open_next(None);
        } else {
            self.reopen();
        }
    }

    /// Tries a fresh segment while the log refuses writes.
    fn reopen(&mut self) {
        if self.file.is_none() {
            let failure = self.status.failure();
            self.open_next(failure);
        }
    }

    /// Creates segment `next`. `failure` is why the log refuses writes now,
    /// if it does.
    fn open_next(&mut self, failure: Option<WalFailure>) {
        let id = self.next;
        match create_segment(&self.dir, id) {
            Ok(file) => {
                let magic = SEGMENT_MAGIC.len() as u64;
                self.file = Some(file);
                self.segment = id;
                self.next = id + 1;
                self.len = magic;
                self.synced_len = magic;
                self.status.current.store(id, Ordering::SeqCst);
                if let Some(failure) = self.status.failure_lock().take() {
                    self.status.reopens.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(segment = id, after = %failure.message, "write-ahead log takes writes again, in a fresh segment");
                }
            }
            Err(err) => {
                let path = segment_path(&self.dir, id);
                // A file created before its header failed to land would
                // stop the next try (it creates the file exclusively); if
                // it cannot be removed, the next try takes the next id.
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(gone) if gone.kind() == std::io::ErrorKind::NotFound => {}
                    Err(_) => self.next = id + 1,
                }
                let reopen_error = err.to_string();
                if failure.as_ref().and_then(|f| f.reopen_error.as_ref()) != Some(&reopen_error) {
                    tracing::error!(segment = id, error = %reopen_error, "could not start a fresh write-ahead log segment");
                }
                if failure.is_none() {
                    self.status.failures.fetch_add(1, Ordering::Relaxed);
                }
                *self.status.failure_lock() = Some(WalFailure {
                    message: failure.map_or_else(|| reopen_error.clone(), |f| f.message),
                    reopen_error: Some(reopen_error),
                });
                self.status.current.store(self.next, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests;
