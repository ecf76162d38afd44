//! A local-directory bucket's block files, read by range straight into the
//! caller's buffer.
//!
//! NB: object_store's `LocalFileSystem` answers each range read with a
//! fresh zeroed buffer of the range's size. The store caps glibc's mmap
//! threshold at 256 KiB (`store::allocator`), so every 1 MiB window a
//! ranged block or a compaction source reads came from fresh pages the
//! kernel cleared, and was then copied into the window: in a query-only
//! run of the 2,000-pod workload (all six merges, cold and warm), clearing
//! those pages was 7.8 % of the CPU (perf,
//! docs/benchmarks/log/2026-12-03-store-cold-merges-fresh-pages.md). Reading
//! into the window the reader keeps clears no fresh pages.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use object_store::local::LocalFileSystem;
use object_store::path::Path;

/// Where a local bucket keeps its objects: the store object_store writes
/// through, and the prefix a `PrefixStore` above it adds.
#[derive(Debug)]
pub(super) struct LocalFiles {
    fs: LocalFileSystem,
    prefix: Option<Path>,
}

impl LocalFiles {
    pub(super) fn new(fs: LocalFileSystem, prefix: Option<Path>) -> Self {
        Self { fs, prefix }
    }

    /// The file that holds object `location`, found as object_store finds
    /// it (the prefix's parts first, then the location's, each encoded as
    /// `LocalFileSystem` encodes them).
    fn file_of(&self, location: &Path) -> io::Result<std::path::PathBuf> {
        let path = match &self.prefix {
            Some(prefix) => prefix.parts().chain(location.parts()).collect(),
            None => location.clone(),
        };
        self.fs
            .path_to_filesystem(&path)
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))
    }

    /// Appends the `len` bytes of object `location` at `offset` to `buf`.
    /// A missing object is `NotFound`, one too short `UnexpectedEof`; on an
    /// error `buf` is as it was.
    pub(super) fn read_range(
        &self,
        location: &Path,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> io::Result<()> {
        // Opened per read, as object_store does: a block deleted by
        // retention then reads as missing, not from an unlinked file.
        let file = File::open(self.file_of(location)?)?;
        let before = buf.len();
        buf.resize(before + len, 0);
        let read = file.read_exact_at(&mut buf[before..], offset);
        if read.is_err() {
            buf.truncate(before);
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::prefix::PrefixStore;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

    use super::*;

    fn local(dir: &std::path::Path) -> LocalFileSystem {
        LocalFileSystem::new_with_prefix(dir).expect("local")
    }

    #[tokio::test]
    async fn reads_what_object_store_wrote_under_a_prefix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let prefixed: Arc<dyn ObjectStore> =
            Arc::new(PrefixStore::new(local(dir.path()), "cluster a/x"));
        let location = Path::from("blocks/replica-0/01M8Y5CPFK92PAW2DYN4RX4K1D/data");
        let body: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        prefixed
            .put(&location, PutPayload::from(body.clone()))
            .await
            .expect("put");
        let files = LocalFiles::new(local(dir.path()), Some(Path::from("cluster a/x")));

        let mut buf = b"kept".to_vec();
        files
            .read_range(&location, 4_000, 3_000, &mut buf)
            .expect("read");
        assert_eq!(&buf[..4], b"kept");
        assert_eq!(&buf[4..], &body[4_000..7_000]);
        let expected = prefixed
            .get_range(&location, 4_000..7_000)
            .await
            .expect("get_range");
        assert_eq!(&buf[4..], &expected[..]);
    }

    #[test]
    fn a_missing_or_short_object_is_an_error_and_leaves_the_buffer() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("blocks")).expect("mkdir");
        std::fs::write(dir.path().join("blocks/data"), [7u8; 100]).expect("write");
        let files = LocalFiles::new(local(dir.path()), None);
        let mut buf = vec![1, 2, 3];

        let missing = files
            .read_range(&Path::from("blocks/gone"), 0, 10, &mut buf)
            .expect_err("missing");
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        let short = files
            .read_range(&Path::from("blocks/data"), 90, 20, &mut buf)
            .expect_err("short");
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(buf, [1, 2, 3]);
    }
}
