//! Naming frames at query time: a merge's frames that arrived as a build
//! id and an address, without a function name, are resolved after the
//! merge, once per distinct address, from debug info uploaded to the store
//! (`POST /api/v1/debuginfo`, kept in the bucket by build id) or fetched
//! from the configured debuginfod servers (and then kept in the bucket, so
//! a build id costs a server one request).
//!
//! Resolved addresses and build ids found nowhere are cached
//! (`cache`); a missing build id is looked up again after
//! `--symbol-miss-retry`. Fetching and reading a debug file run as a job
//! per build id, beside the query: a query waits at most
//! `--symbolization-wait` for its jobs, then answers with what is known,
//! marked `Kiln-Partial: symbols_pending=<n>`; the jobs finish anyway, so
//! the next query finds their names. One file is read at a time, within
//! kiln-debuginfo's limits; ingest never waits for any of it.

pub mod cache;
pub mod debuginfod;
pub mod metrics;
pub mod upload;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kiln_debuginfo::{BuildId, DebugFile, DebugInfoLimits};
use kiln_engine::MergedProfile;
use kiln_storage::Store;
use tokio::sync::{Semaphore, watch};

use crate::config::SymbolizationSettings;
use crate::error::ApiError;
use crate::wire::time::now_ms;
use cache::SymbolCache;
use debuginfod::Debuginfod;
use metrics::{LookupResult, LookupSource, SymbolizationMetrics};

/// Most addresses one job resolves: a merge's distinct addresses in one
/// binary are far fewer; this bounds one job's work and memory.
const MAX_ADDRESSES_PER_JOB: usize = 1_000_000;

/// How often the cache is written to the bucket when it changed.
const PERSIST_EVERY: Duration = Duration::from_secs(30);

/// The symbolizer; cheap to clone.
#[derive(Debug, Clone)]
pub struct Symbolizer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: SymbolizationSettings,
    limits: DebugInfoLimits,
    cache: Mutex<SymbolCache>,
    /// Build ids being fetched or read, each with the channel that says
    /// when it is done.
    jobs: Mutex<HashMap<BuildId, watch::Receiver<bool>>>,
    /// One debug file read at a time: what bounds the memory it takes.
    read_turn: Semaphore,
    /// One upload at a time, for the same reason.
    upload_turn: Semaphore,
    debuginfod: Option<Debuginfod>,
    metrics: Arc<SymbolizationMetrics>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a debug file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Bucket,
    Debuginfod,
}

impl Symbolizer {
    /// A symbolizer with `settings`, counting into `metrics`; nothing is
    /// fetched until a query asks.
    pub fn new(settings: &SymbolizationSettings, metrics: Arc<SymbolizationMetrics>) -> Self {
        let debuginfod = if settings.debuginfod_urls.is_empty() {
            None
        } else {
            match Debuginfod::new(settings.fetch_timeout) {
                Ok(client) => Some(client),
                Err(error) => {
                    tracing::warn!(%error, "no debuginfod client; only uploads are used");
                    None
                }
            }
        };
        let limits = DebugInfoLimits {
            max_file_bytes: settings.max_file_bytes,
            max_section_bytes: settings.max_file_bytes.saturating_mul(2),
            ..DebugInfoLimits::default()
        };
        Self {
            inner: Arc::new(Inner {
                settings: settings.clone(),
                limits,
                cache: Mutex::new(SymbolCache::new(
                    usize::try_from(settings.cache_bytes).unwrap_or(usize::MAX),
                )),
                jobs: Mutex::new(HashMap::new()),
                read_turn: Semaphore::new(1),
                upload_turn: Semaphore::new(1),
                debuginfod,
                metrics,
            }),
        }
    }

    /// Runs `change` on the cache and sets the cache size gauge after it.
    fn with_cache<T>(&self, change: impl FnOnce(&mut SymbolCache) -> T) -> T {
        let mut cache = lock(&self.inner.cache);
        let out = change(&mut cache);
        self.inner.metrics.cache_bytes(cache.bytes());
        out
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &SymbolizationSettings {
        &self.inner.settings
    }

    /// The upload slot, if free.
    pub fn upload_turn(
        &self,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, tokio::sync::TryAcquireError> {
        self.inner.upload_turn.try_acquire()
    }

    /// The limits a debug file is read within.
    pub fn limits(&self) -> DebugInfoLimits {
        self.inner.limits
    }

    /// Reads the cache this replica last wrote to the bucket, then writes
    /// it back every 30 s while it changes, until `stop` says so (and once
    /// more then).
    pub async fn keep_cache(self, store: Store, mut stop: watch::Receiver<bool>) {
        let max = self.inner.settings.cache_bytes.saturating_mul(2) + (1 << 20);
        match store.symbol_cache(max).await {
            Ok(Some(bytes)) => match kiln_debuginfo::cache_file::decode(&bytes, max as usize) {
                Ok(contents) => self.with_cache(|cache| cache.load(contents)),
                Err(error) => tracing::warn!(%error, "symbol cache not read; starting empty"),
            },
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "symbol cache not read; starting empty"),
        }
        loop {
            let stopping = tokio::select! {
                _ = tokio::time::sleep(PERSIST_EVERY) => false,
                _ = stop.wait_for(|stopped| *stopped) => true,
            };
            self.persist(&store).await;
            if stopping {
                return;
            }
        }
    }

    /// Writes the cache to the bucket if it changed.
    pub async fn persist(&self, store: &Store) {
        let contents = {
            let mut cache = lock(&self.inner.cache);
            if !cache.dirty {
                return;
            }
            cache.dirty = false;
            cache.contents()
        };
        let bytes = kiln_debuginfo::cache_file::encode(&contents);
        if let Err(error) = store.put_symbol_cache(Bytes::from(bytes)).await {
            tracing::warn!(%error, "symbol cache not written; trying again later");
            lock(&self.inner.cache).dirty = true;
        }
    }

    /// Forgets what was known of `build_id` (its debug info was just
    /// uploaded), so the next query reads the new file.
    pub fn forget(&self, build_id: &BuildId) {
        self.with_cache(|cache| cache.forget(build_id));
    }

    /// Names the frames of `merged` that lack names and can be looked up;
    /// see the module docs. A merge whose addresses are all cached (or
    /// known missing) takes one pass on the blocking pool. Build ids still
    /// being fetched or read when the wait is over are noted as
    /// `symbols_pending`.
    pub async fn symbolize(
        &self,
        store: &Store,
        merged: MergedProfile,
    ) -> Result<MergedProfile, ApiError> {
        let symbolizer = self.clone();
        let (merged, wanted) = store
            .run_query_work(move || symbolizer.apply_cached(merged, true))
            .await?;
        if wanted.is_empty() {
            return Ok(merged);
        }
        let mut waits: Vec<watch::Receiver<bool>> = wanted
            .into_iter()
            .map(|(id, offsets)| self.start_job(store, id, offsets))
            .collect();
        let deadline = tokio::time::Instant::now() + self.inner.settings.wait;
        let mut pending = 0;
        let mut done = 0;
        for wait in &mut waits {
            match tokio::time::timeout_at(deadline, wait.wait_for(|done| *done)).await {
                Ok(Ok(_)) => done += 1,
                _ => pending += 1,
            }
        }
        if pending > 0 {
            kiln_storage::store::note_symbols_pending(pending);
            self.inner.metrics.pending_answer();
        }
        if done == 0 {
            return Ok(merged);
        }
        let symbolizer = self.clone();
        let (merged, _) = store
            .run_query_work(move || symbolizer.apply_cached(merged, false))
            .await?;
        Ok(merged)
    }

    /// Names what the cache knows in one pass over the merge's locations;
    /// returns the merge and, by build id, the addresses to look up (build
    /// time). With `count`, the cache lookups are counted (the first pass
    /// of a query, not the one after its jobs).
    fn apply_cached(
        &self,
        mut merged: MergedProfile,
        count: bool,
    ) -> (MergedProfile, BTreeMap<BuildId, Vec<(u64, u64)>>) {
        let mut wanted: BTreeMap<BuildId, Vec<(u64, u64)>> = BTreeMap::new();
        // The text a client sent, parsed once per distinct id (ids the
        // cache does not key as sent: uppercase, or not a build id).
        let mut parsed: HashMap<String, Option<BuildId>> = HashMap::new();
        let now = now_ms();
        // Hits: named, or a build id remembered as missing; misses: what
        // goes to a job.
        let (mut hits, mut misses) = (0, 0);
        let cache = lock(&self.inner.cache);
        merged.apply_symbols(|sent, offset, mapping_offset| {
            if let Some(frames) = cache.get(sent, offset) {
                hits += 1;
                return Some(frames);
            }
            if !parsed.contains_key(sent) {
                parsed.insert(sent.to_owned(), BuildId::parse(sent).ok());
            }
            let id = parsed.get(sent)?.as_ref()?;
            if let Some(frames) = cache.get(id.as_str(), offset) {
                hits += 1;
                return Some(frames);
            }
            if cache.is_missing(id, now) {
                hits += 1;
            } else {
                misses += 1;
                wanted
                    .entry(id.clone())
                    .or_default()
                    .push((offset, mapping_offset));
            }
            None
        });
        drop(cache);
        if count {
            let metrics = &self.inner.metrics;
            metrics.lookups(LookupSource::Cache, LookupResult::Hit, hits);
            metrics.lookups(LookupSource::Cache, LookupResult::Miss, misses);
        }
        (merged, wanted)
    }

    /// Starts the job that fetches and reads `build_id`'s debug file and
    /// resolves `offsets`, unless one runs already (whose end this query
    /// waits for); returns the channel that says it is done.
    fn start_job(
        &self,
        store: &Store,
        build_id: BuildId,
        mut offsets: Vec<(u64, u64)>,
    ) -> watch::Receiver<bool> {
        let mut jobs = lock(&self.inner.jobs);
        if let Some(running) = jobs.get(&build_id) {
            return running.clone();
        }
        let (done, waiting) = watch::channel(false);
        jobs.insert(build_id.clone(), waiting.clone());
        drop(jobs);
        offsets.truncate(MAX_ADDRESSES_PER_JOB);
        let symbolizer = self.clone();
        let store = store.clone();
        tokio::spawn(async move {
            symbolizer.run_job(&store, &build_id, offsets).await;
            lock(&symbolizer.inner.jobs).remove(&build_id);
            let _ = done.send(true);
        });
        waiting
    }

    async fn run_job(&self, store: &Store, build_id: &BuildId, offsets: Vec<(u64, u64)>) {
        let retry_at = now_ms().saturating_add(
            i64::try_from(self.inner.settings.miss_retry.as_millis()).unwrap_or(i64::MAX),
        );
        let (bytes, source) = match self.fetch(store, build_id).await {
            Some(found) => found,
            None => {
                tracing::info!(%build_id, "no debug info found; looking again after the retry time");
                self.with_cache(|cache| cache.insert_missing(build_id.clone(), retry_at));
                return;
            }
        };
        let Ok(_turn) = self.inner.read_turn.acquire().await else {
            return;
        };
        let limits = self.inner.limits;
        let expected = build_id.clone();
        let read = tokio::task::spawn_blocking(move || {
            let file = DebugFile::parse(&bytes, limits)?;
            if let Some(found) = file.build_id()
                && *found != expected
            {
                return Err(kiln_debuginfo::DebugInfoError::BadBuildId {
                    text: format!("the file's build id is {found}, not {expected}"),
                });
            }
            let frames: Vec<(u64, Vec<kiln_debuginfo::Frame>)> = offsets
                .iter()
                .map(|&(offset, mapping_offset)| (offset, file.frames(offset, mapping_offset)))
                .collect();
            Ok((frames, bytes))
        })
        .await;
        match read {
            Ok(Ok((frames, bytes))) => {
                if source == Source::Debuginfod
                    && let Err(error) = store.put_debuginfo(build_id.as_str(), bytes).await
                {
                    tracing::warn!(%build_id, %error, "debug file not kept in the bucket");
                }
                self.with_cache(|cache| {
                    for (offset, frames) in frames {
                        cache.insert(build_id.clone(), offset, cache::symbolized(frames));
                    }
                });
            }
            Ok(Err(error)) => {
                tracing::warn!(%build_id, %error, reason = error.reason(), "debug file unusable");
                self.with_cache(|cache| cache.insert_missing(build_id.clone(), retry_at));
            }
            Err(error) => {
                tracing::warn!(%build_id, %error, "reading a debug file failed");
                self.with_cache(|cache| cache.insert_missing(build_id.clone(), retry_at));
            }
        }
    }

    /// The debug file of `build_id`: uploaded or fetched before (the
    /// bucket), else from the first debuginfod server that has it.
    async fn fetch(&self, store: &Store, build_id: &BuildId) -> Option<(Bytes, Source)> {
        let max = self.inner.settings.max_file_bytes;
        let metrics = &self.inner.metrics;
        match store.debuginfo(build_id.as_str(), max).await {
            Ok(Some(bytes)) => {
                metrics.lookups(LookupSource::Bucket, LookupResult::Hit, 1);
                return Some((bytes, Source::Bucket));
            }
            Ok(None) => metrics.lookups(LookupSource::Bucket, LookupResult::Miss, 1),
            Err(error) => {
                metrics.lookups(LookupSource::Bucket, LookupResult::Error, 1);
                tracing::warn!(%build_id, %error, "debug file not read from the bucket");
            }
        }
        let debuginfod = self.inner.debuginfod.as_ref()?;
        for server in &self.inner.settings.debuginfod_urls {
            let started = Instant::now();
            let answer = debuginfod.debuginfo(server, build_id, max).await;
            metrics.debuginfod_fetch(started.elapsed());
            match answer {
                Ok(Some(bytes)) => {
                    metrics.lookups(LookupSource::Debuginfod, LookupResult::Hit, 1);
                    return Some((bytes, Source::Debuginfod));
                }
                Ok(None) => metrics.lookups(LookupSource::Debuginfod, LookupResult::Miss, 1),
                Err(error) => {
                    metrics.lookups(LookupSource::Debuginfod, LookupResult::Error, 1);
                    tracing::warn!(%build_id, %error, reason = error.reason(), "debuginfod lookup failed");
                }
            }
        }
        None
    }
}
