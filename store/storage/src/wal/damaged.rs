//! Segments that replay finds damaged (a torn or corrupt frame, or no
//! segment header) are moved aside whole, never cut short in place nor
//! deleted: the bytes after the damage may be all that is left of records
//! a disk or a bug mangled, and someone may want to read them back. What
//! replay could read (the frames before the damage) stays in the log as a
//! fresh copy under the segment's own name, so the records that were
//! acknowledged are replayed and flushed as before.
//!
//! The originals go to `<wal dir>-quarantine/segments/` (for a store,
//! `<data dir>/wal-quarantine/segments/`), each as
//! `<segment>-<ulid>.wal` with a `.reason` text file beside it. Nothing
//! there is read back by the store; an operator deletes them once seen.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::record::TailProblem;
use super::{segment_path, sync_dir, wal_io};
use crate::error::StorageError;

/// Where the damaged segments of the log in `wal_dir` are kept.
pub fn quarantine_dir(wal_dir: &Path) -> PathBuf {
    let name = wal_dir
        .file_name()
        .map_or_else(|| "wal".into(), |n| n.to_string_lossy().into_owned());
    wal_dir
        .with_file_name(format!("{name}-quarantine"))
        .join("segments")
}

/// Moves damaged segment `id` of `dir` aside with its bytes, `bytes`, and
/// leaves its first `valid_len` bytes (the header and the whole frames
/// before the damage) in its place; none when not even the header holds.
/// Every step leaves either the original or the good copy under the
/// segment's name, so a crash in between replays the same records.
///
/// Blocking.
pub(super) fn set_aside(
    dir: &Path,
    id: u64,
    bytes: &[u8],
    valid_len: usize,
    problem: TailProblem,
) -> Result<PathBuf, StorageError> {
    let path = segment_path(dir, id);
    let aside_dir = quarantine_dir(dir);
    fs::create_dir_all(&aside_dir).map_err(wal_io("create quarantine directory", &aside_dir))?;
    let stem = format!("{id:020}-{}", ulid::Ulid::new());
    let aside = aside_dir.join(format!("{stem}.wal"));
    // A second name for the same bytes costs no space; a copy where the
    // quarantine is on another filesystem.
    if fs::hard_link(&path, &aside).is_err() {
        write_synced(&aside, bytes)?;
    }
    let reason = format!(
        "{problem:?} at byte {valid_len} of {}: replay read the {valid_len} bytes before it from a copy\n",
        bytes.len()
    );
    write_synced(&aside_dir.join(format!("{stem}.reason")), reason.as_bytes())?;
    sync_dir(&aside_dir)?;
    if valid_len >= super::record::SEGMENT_MAGIC.len() {
        let part = dir.join(format!("{id:020}.wal.part"));
        write_synced(&part, &bytes[..valid_len])?;
        fs::rename(&part, &path).map_err(wal_io("replace damaged segment", &path))?;
    } else {
        fs::remove_file(&path).map_err(wal_io("move damaged segment", &path))?;
    }
    sync_dir(dir)?;
    Ok(aside)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let mut file = File::create(path).map_err(wal_io("create", path))?;
    file.write_all(bytes).map_err(wal_io("write", path))?;
    file.sync_all().map_err(wal_io("fsync", path))
}
