//! Records that replay could not apply are set aside here instead of
//! stopping recovery: one record that fails or panics the engine would
//! otherwise fail every restart the same way, a crash loop that lasts until
//! someone deletes the WAL segment by hand.
//!
//! Each one is written, intact, to `<data dir>/wal-quarantine/` as
//! `<segment>-<ordinal>.payload` (the frame payload exactly as logged, which
//! `kiln_storage::wal::record::decode_payload` parses) next to a
//! `<segment>-<ordinal>.reason` text file, so an operator can inspect it or
//! re-send it once the cause is fixed. Nothing in the directory is read back.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::StorageError;
use crate::store::StoreConfig;

/// The quarantine directory of a store.
pub(super) fn quarantine_dir(config: &StoreConfig) -> PathBuf {
    config.data_dir.join("wal-quarantine")
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Wal { op, path, source }
}

/// Writes one payload aside, durably, with why it was refused. Writing it
/// again (a second recovery before the segment is flushed) overwrites the
/// same files, so the directory holds each record once.
pub(super) fn put(
    dir: &Path,
    segment: u64,
    ordinal: u64,
    payload: &[u8],
    reason: &str,
) -> Result<PathBuf, StorageError> {
    fs::create_dir_all(dir).map_err(io("create quarantine directory", dir))?;
    let stem = format!("{segment:020}-{ordinal:08}");
    let path = dir.join(format!("{stem}.payload"));
    write_synced(&path, payload)?;
    write_synced(&dir.join(format!("{stem}.reason")), reason.as_bytes())?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync quarantine directory", dir))?;
    Ok(path)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let mut file = fs::File::create(path).map_err(io("create quarantine file", path))?;
    file.write_all(bytes)
        .map_err(io("write quarantine file", path))?;
    file.sync_all().map_err(io("fsync quarantine file", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarantined_payload_is_kept_intact_with_its_reason() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("wal-quarantine");
        let path = put(&target, 7, 3, b"\x01payload", "bad pprof").expect("put");
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some("00000000000000000007-00000003.payload")
        );
        assert_eq!(fs::read(&path).expect("read"), b"\x01payload");
        let reason = fs::read_to_string(path.with_extension("reason")).expect("read reason");
        assert_eq!(reason, "bad pprof");
    }
}
