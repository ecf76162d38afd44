//! A bucket that fails on request: a real local bucket behind a switch that
//! makes listings, or GETs of chosen objects, fail the way an S3 endpoint
//! answering 503 does (an error that is not "not found"). Tests use it for
//! outages whose exact shape a real server cannot be told to produce.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// The switchable bucket; every operation goes to `inner` unless failed.
#[derive(Debug)]
pub struct FaultyBucket {
    inner: Arc<dyn ObjectStore>,
    /// Every operation fails (the endpoint is unreachable).
    down: AtomicBool,
    /// GETs of paths containing one of these fail.
    failing_gets: Mutex<Vec<String>>,
    /// Puts of paths containing this land, then answer this much later.
    slow_puts: Mutex<Option<(String, Duration)>>,
}

fn unavailable(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: format!("503 Service Unavailable ({what})").into(),
    }
}

impl FaultyBucket {
    /// Wraps `inner`, with no fault switched on.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            down: AtomicBool::new(false),
            failing_gets: Mutex::new(Vec::new()),
            slow_puts: Mutex::new(None),
        })
    }

    /// While `down`, every operation fails (the endpoint is unreachable).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// From now on, GETs of paths containing `path_part` fail.
    pub fn fail_gets_of(&self, path_part: &str) {
        self.failing_gets
            .lock()
            .expect("lock")
            .push(path_part.to_owned());
    }

    /// From now on, a put of a path containing `path_part` is stored at
    /// once but answered only `delay` later: a slow upload, or a process
    /// paused right after its upload.
    pub fn slow_puts_of(&self, path_part: &str, delay: Duration) {
        *self.slow_puts.lock().expect("lock") = Some((path_part.to_owned(), delay));
    }

    /// GETs succeed again.
    pub fn heal_gets(&self) {
        self.failing_gets.lock().expect("lock").clear();
    }

    fn check(&self, what: &str) -> Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(unavailable(what));
        }
        Ok(())
    }
}

impl fmt::Display for FaultyBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyBucket({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for FaultyBucket {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.check("put")?;
        let result = self.inner.put_opts(location, payload, opts).await;
        let delay = self
            .slow_puts
            .lock()
            .expect("lock")
            .as_ref()
            .filter(|(part, _)| location.as_ref().contains(part.as_str()))
            .map(|(_, delay)| *delay);
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.check("put")?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.check("get")?;
        let path = location.to_string();
        if self
            .failing_gets
            .lock()
            .expect("lock")
            .iter()
            .any(|part| path.contains(part.as_str()))
        {
            return Err(unavailable("get"));
        }
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.check("get")?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        if self.down.load(Ordering::SeqCst) {
            return stream::once(async { Err(unavailable("delete")) }).boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.down.load(Ordering::SeqCst) {
            return stream::once(async { Err(unavailable("list")) }).boxed();
        }
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.down.load(Ordering::SeqCst) {
            return stream::once(async { Err(unavailable("list")) }).boxed();
        }
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.check("list")?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.check("copy")?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.check("rename")?;
        self.inner.rename_opts(from, to, options).await
    }
}
