//! The read path: every query visits the live head, the heads awaiting
//! upload, and every visible block overlapping the range (decoded blocks
//! come from a bounded cache, else from the bucket).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;

use kiln_engine::model::{BlockMeta, Matcher, TimeRange};
use kiln_engine::query::interrupt::run_interruptible;
use kiln_engine::{Block, BlockError, QueryError, Queryable};

use super::cache::Evicted;
use super::deadline;
use super::incomplete::{self, Incomplete};
use super::peer_head::{FromPeers, ask_peers};
use crate::bucket::{BucketRanges, CorruptBlock};
use crate::error::StorageError;
use crate::peers::{PeerAnswers, PeerScope, UnansweredPeer};
use crate::store::{Shared, Store, allocator, lock, read};

/// Most entries any listing holds or answers (label names, values, series,
/// profile types), the smallest first: a store's series in the head are
/// capped, but blocks hold what earlier heads held, so a listing of a long
/// range has no bound of its own.
pub const MAX_LISTED: usize = 1_000_000;

/// A sorted listing, cut to its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing<T> {
    /// The first entries, sorted, without repeats.
    pub entries: Vec<T>,
    /// Whether entries past the limit were left out.
    pub truncated: bool,
}

/// Bytes read from a block opened by range at a time: one request each
/// from an object store, and what such a block holds beyond its tables.
const RANGED_READ_WINDOW: usize = 1 << 20;

/// Blocks larger than this are opened by range rather than fetched and held
/// whole: an eighth of the block cache. A whole block costs the cache its
/// size; one opened by range, its tables and directory, and a request per
/// window read from an object store. Smaller blocks are one request.
pub(super) fn ranged_read_threshold(block_cache_bytes: u64) -> u64 {
    block_cache_bytes / 8
}

/// Blocks whose blobs carry their own CRCs ([`kiln_engine::BLOB_CRC_VERSION`])
/// larger than this are opened by range whatever the cache's size: opening
/// one reads its tables, directory and index, and a query then reads only
/// the blobs of the series it selects.
///
/// NB: fetched whole, a day block of 2,000 pods (86 MiB) was fetched,
/// zeroed, copied and faulted in for a one-pod query; the workload bench's
/// cold 7-day one-pod merge read every block of the week that way (2.7 s of
/// CPU). Smaller blocks are still one request.
const WHOLE_FETCH_MAX_BYTES: u64 = 4 * RANGED_READ_WINDOW as u64;

/// Whether `meta`'s block is opened by range rather than fetched whole.
pub(super) fn opens_by_range(meta: &BlockMeta, block_cache_bytes: u64) -> bool {
    meta.size_bytes > ranged_read_threshold(block_cache_bytes)
        || (meta.format_version >= kiln_engine::BLOB_CRC_VERSION
            && meta.size_bytes > WHOLE_FETCH_MAX_BYTES)
}

/// A block the bucket did not give: gone (deleted after the view was
/// taken), or unreadable now, possibly transient (network), so skipped
/// for this answer and tried again by the next query.
fn unreadable(meta: &BlockMeta, err: StorageError) -> Unavailable {
    if let StorageError::Bucket {
        source: object_store::Error::NotFound { .. },
        ..
    } = err
    {
        return Unavailable::Gone;
    }
    tracing::warn!(block = %meta.id, error = %err, "skipping unreadable block");
    Unavailable::Skipped(err.to_string())
}

/// A read of a block opened by range that failed for its IO, not its bytes:
/// gone (a compaction or retention deleted it after the view was taken) or
/// unreadable for now. `None` for damage.
fn read_failure(error: &BlockError) -> Option<Unavailable> {
    match error {
        BlockError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Some(Unavailable::Gone)
        }
        BlockError::Io { source, .. } => Some(Unavailable::Skipped(source.to_string())),
        _ => None,
    }
}

fn overlaps(meta: &BlockMeta, range: &TimeRange) -> bool {
    meta.min_time_ms < range.end_ms && meta.max_time_ms >= range.start_ms
}

/// Why a listed block was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unavailable {
    /// Deleted after the view was taken: a compaction replaced it (its data
    /// is in the block that names it as a source) or retention removed it.
    Gone,
    /// Corrupt or unreadable (reported), and why; skipped.
    Skipped(String),
}

impl Shared {
    /// The decoded block, from the bounded cache or the bucket. Called on a
    /// blocking thread; `runtime` drives the bucket fetch.
    pub(super) fn load_block(
        &self,
        runtime: &tokio::runtime::Handle,
        meta: &BlockMeta,
    ) -> Result<Arc<Block>, Unavailable> {
        if let Some(block) = lock(&self.catalog.cache).get(&meta.id) {
            return Ok(block);
        }
        let block = self.fetch_block(runtime, meta)?;
        let bytes = block.approx_decoded_bytes() as u64;
        let evicted = lock(&self.catalog.cache).insert(meta.id.clone(), Arc::clone(&block), bytes);
        free_evicted(evicted);
        Ok(block)
    }

    /// Fetches and decodes a block from the bucket: whole when it is small
    /// (one request), else opened by range, holding its tables and reading
    /// the blobs queries ask for ([`opens_by_range`]).
    fn fetch_block(
        &self,
        runtime: &tokio::runtime::Handle,
        meta: &BlockMeta,
    ) -> Result<Arc<Block>, Unavailable> {
        if let Some(error) = lock(&self.catalog.corrupt).get(&meta.id) {
            return Err(Unavailable::Skipped(error.clone()));
        }
        if opens_by_range(meta, self.config.block_cache_bytes) {
            return self.open_block_ranged(runtime, meta);
        }
        let bytes = runtime
            .block_on(self.bucket.get_block_data(meta))
            .map_err(|err| unreadable(meta, err))?;
        match Block::decode_shared(bytes) {
            Ok(block) => Ok(Arc::new(block)),
            Err(err) => {
                self.mark_corrupt(&meta.id, err.to_string());
                Err(Unavailable::Skipped(err.to_string()))
            }
        }
    }

    fn open_block_ranged(
        &self,
        runtime: &tokio::runtime::Handle,
        meta: &BlockMeta,
    ) -> Result<Arc<Block>, Unavailable> {
        let ranges =
            BucketRanges::open(&self.bucket, meta, runtime).map_err(|err| unreadable(meta, err))?;
        match Block::open_ranged(ranges, RANGED_READ_WINDOW) {
            Ok(block) => Ok(Arc::new(block)),
            Err(err) => match read_failure(&err) {
                Some(unavailable) => Err(unavailable),
                None => {
                    self.mark_corrupt(&meta.id, err.to_string());
                    Err(Unavailable::Skipped(err.to_string()))
                }
            },
        }
    }

    pub(in crate::store) fn mark_corrupt(&self, id: &str, error: String) {
        tracing::warn!(block = %id, %error, "skipping corrupt block");
        lock(&self.catalog.cache).remove(id);
        lock(&self.catalog.corrupt).insert(id.to_string(), error);
    }
}

impl Store {
    /// Runs `visit` over the head, pending heads and every overlapping
    /// block, accumulating into a fresh `new_acc()`, on a blocking thread.
    ///
    /// `compile` runs once, on that thread, before any head or block is
    /// visited: a query's `=~` patterns are compiled once, not once per
    /// head and block (a large pattern over two weeks of blocks would cost
    /// its compile thousands of times), and never on an async worker.
    ///
    /// At most `max_running_queries` run at once; a query waits for its
    /// turn within its deadline, so a flood of expensive queries cannot
    /// take every core from ingest (and make it refuse writes), and is
    /// refused as overload if it never gets one.
    ///
    /// A block deleted between the view's snapshot and its read was replaced
    /// by a compaction (whose output holds its data and some already
    /// visited) or removed by retention, here or by another replica: the
    /// answer would silently miss or double data, so the bucket is listed
    /// again and the whole query runs again on the new view; it fails with
    /// `QueryRaced` rather than answer partially.
    pub(super) async fn visit_all<C, T, F>(
        &self,
        range: TimeRange,
        scope: Vec<Matcher>,
        compile: impl FnOnce() -> Result<C, QueryError> + Send + 'static,
        new_acc: impl Fn() -> T + Send + 'static,
        visit: F,
    ) -> Result<T, StorageError>
    where
        C: Send + 'static,
        T: Send + 'static,
        F: Fn(&C, &dyn Queryable, &mut T) -> Result<(), QueryError> + Send + 'static,
    {
        self.visit_all_cached(
            // Only merges read stacks, and they call the cached visit.
            PeerScope::new(scope, range, false),
            compile,
            new_acc,
            visit,
            |metas: &[BlockMeta], _: &mut T| vec![false; metas.len()],
            |acc| acc,
        )
        .await
    }

    /// [`Store::visit_all`] over `scope` (its range, and what peers are
    /// asked for), where `cached` may answer blocks from what
    /// the cache holds for them (merge partials) given only the metadata
    /// of the blocks to visit; it returns, per block, whether it answered
    /// it (the others are loaded and visited). `finish` turns the result
    /// into the answer on the same blocking thread.
    pub(super) async fn visit_all_cached<C, T, R, F, K>(
        &self,
        scope: PeerScope,
        compile: impl FnOnce() -> Result<C, QueryError> + Send + 'static,
        new_acc: impl Fn() -> T + Send + 'static,
        visit: F,
        cached: K,
        finish: impl FnOnce(T) -> R + Send + 'static,
    ) -> Result<R, StorageError>
    where
        C: Send + 'static,
        T: Send + 'static,
        R: Send + 'static,
        F: Fn(&C, &dyn Queryable, &mut T) -> Result<(), QueryError> + Send + 'static,
        K: Fn(&[BlockMeta], &mut T) -> Vec<bool> + Send + 'static,
    {
        let range = scope.range();
        let shared = Arc::clone(&self.shared);
        let store = self.clone();
        let runtime = tokio::runtime::Handle::current();
        let timeout = shared.config.query_timeout;
        // The request's deadline when it set one, so that its visits share
        // one clock; the blocking thread below stops at it, or as soon as
        // this future is dropped (`_cancel_on_drop`).
        let deadline = deadline::visit_deadline(timeout);
        let (interrupt, _cancel_on_drop) =
            deadline::interrupt_at(deadline, shared.config.query_held_bytes());
        let runner = self.query_runner(deadline).await?;
        // Peers get three quarters of what is left, so an answer that comes
        // at their deadline still leaves this replica time to read it.
        let peers = shared.catalog.peers.get().cloned();
        let now = Instant::now();
        let peer_deadline = now + deadline.saturating_duration_since(now) * 3 / 4;
        let peer_runtime = runtime.clone();
        let ask = move || ask_peers(peers.as_ref(), &peer_runtime, &scope, peer_deadline);
        // Checked between parts, and inside each head's and block's scan
        // between series (the engine's interrupt), so a query stops within
        // one series' work of its deadline instead of holding its turn (and
        // a core) for as long as its range and selector make it run.
        let stopped = interrupt.clone();
        let check_deadline = move |visited: usize, total: usize| {
            if stopped.stopped().is_some() {
                return Err(StorageError::QueryTimeout {
                    timeout,
                    visited,
                    total,
                });
            }
            Ok(())
        };
        let (acc, mut missed) = tokio::task::spawn_blocking(move || {
            run_interruptible(interrupt, || {
                let _runner = runner;
                let compiled = compile().map_err(|source| StorageError::Query { source })?;
                let visit = |q: &dyn Queryable, acc: &mut T| visit(&compiled, q, acc);
                for attempt in 0..QUERY_ATTEMPTS {
                    let listings = store.listings_done();
                    let mut skipped = Vec::new();
                    let mut unanswered_peers = Vec::new();
                    if let Some(acc) = visit_snapshot(
                        &shared,
                        &runtime,
                        range,
                        new_acc(),
                        (&visit, &cached, &ask),
                        &check_deadline,
                        (&mut skipped, &mut unanswered_peers),
                    )? {
                        let missed = Incomplete {
                            skipped_blocks: skipped,
                            unanswered_peers,
                            ..Incomplete::default()
                        };
                        return Ok((finish(acc), missed));
                    }
                    if attempt + 1 < QUERY_ATTEMPTS {
                        runtime.block_on(store.relist_after(listings))?;
                    }
                }
                Err(StorageError::QueryRaced {
                    attempts: QUERY_ATTEMPTS,
                })
            })
        })
        .await
        .map_err(|e| StorageError::task("query", e))??;
        missed.bucket_not_listed = !self.shared.catalog.bucket_listed();
        missed.held_wal_ranges = lock(&self.shared.upkeep.held).len();
        incomplete::note(missed);
        Ok(acc)
    }

    /// One of the `max_running_queries` turns, waited for until `deadline`.
    async fn query_runner(&self, deadline: Instant) -> Result<OwnedSemaphorePermit, StorageError> {
        let waited = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout_at(
            deadline.into(),
            Arc::clone(&self.shared.catalog.query_runners).acquire_owned(),
        )
        .await
        {
            Ok(Ok(runner)) => Ok(runner),
            Ok(Err(_closed)) => Err(StorageError::ShuttingDown),
            Err(_elapsed) => Err(StorageError::QueriesBusy {
                running: self.shared.config.max_running_queries,
                waited,
            }),
        }
    }

    /// Runs CPU-bound query work the engine does not do, such as checking a
    /// selector's `=~` patterns by compiling them, on a blocking thread and
    /// in one of the query turns, so that a flood of queries takes no more
    /// cores for it than for reading heads and blocks.
    pub async fn run_query_work<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, StorageError> {
        let runner = self
            .query_runner(deadline::visit_deadline(self.shared.config.query_timeout))
            .await?;
        tokio::task::spawn_blocking(move || {
            let _runner = runner;
            work()
        })
        .await
        .map_err(|e| StorageError::task("query work", e))
    }
}

/// Evicted bytes past which a query hands free memory back to the OS.
/// Measured with the workload bench under a 512 MiB budget: each decoded
/// block a long-range query evicted left its hundreds of thousands of small
/// allocations free inside glibc's arenas, and RSS reached 657 MiB while
/// the heap in use stayed under 170 MiB.
const TRIM_AFTER_EVICTED_BYTES: u64 = 8 << 20;

/// Frees what the cache evicted (outside its lock, on a query's blocking
/// thread) and, when that was much, returns the free pages to the OS.
pub(super) fn free_evicted(evicted: Evicted) {
    let bytes = evicted.bytes;
    drop(evicted);
    if bytes >= TRIM_AFTER_EVICTED_BYTES {
        allocator::release_free_memory_now();
    }
}

/// Queries made again when a block they listed was deleted under them.
const QUERY_ATTEMPTS: usize = 3;

/// One pass of [`Store::visit_all`] over one snapshot of the view; `None`
/// when a listed block was gone by the time it was read.
///
/// Peers are asked after this replica's own snapshot is taken (see
/// [`crate::peers`] for why that order makes the union exact).
fn visit_snapshot<T, F, K, A>(
    shared: &Shared,
    runtime: &tokio::runtime::Handle,
    range: TimeRange,
    mut acc: T,
    (visit, cached, ask): (&F, &K, &A),
    check_deadline: &impl Fn(usize, usize) -> Result<(), StorageError>,
    (skipped, unanswered): (&mut Vec<CorruptBlock>, &mut Vec<UnansweredPeer>),
) -> Result<Option<T>, StorageError>
where
    F: Fn(&dyn Queryable, &mut T) -> Result<(), QueryError>,
    K: Fn(&[BlockMeta], &mut T) -> Vec<bool>,
    A: Fn() -> PeerAnswers,
{
    let has_peers = shared.catalog.peers.get().is_some();
    // A scan stopped part way is the visit's deadline (or its request
    // gone), reported as such.
    let failed = |source: QueryError, visited: usize, total: usize| match source {
        QueryError::Stopped { .. } => match check_deadline(visited, total) {
            Err(timeout) => timeout,
            Ok(()) => StorageError::Query { source },
        },
        source => StorageError::Query { source },
    };
    let (frozen, mut metas, known) = {
        // The view is snapshotted under every shard's read lock: a cut
        // (which holds every write lock) moves data head -> frozen
        // atomically with respect to this.
        let shards = shared.ingest.head.read_all();
        let view = read(&shared.catalog.view);
        let frozen = view.frozen.clone();
        let known = has_peers.then(|| view.known_ids());
        let metas: Vec<BlockMeta> = view
            .visible()
            .filter(|m| overlaps(m, &range))
            .cloned()
            .collect();
        drop(view);
        let total = 1 + frozen.len() + metas.len();
        // Each shard is released once visited, so ingest into it goes on
        // while the others are read.
        for shard in shards {
            visit(&*shard, &mut acc).map_err(|source| failed(source, 0, total))?;
        }
        (frozen, metas, known)
    };
    let from_peers = match known {
        Some(known) => FromPeers::choose(ask(), &known),
        None => FromPeers::default(),
    };
    unanswered.extend(from_peers.unanswered);
    metas.extend(
        from_peers
            .unlisted
            .into_iter()
            .filter(|m| overlaps(m, &range)),
    );
    let total = 1 + frozen.len() + metas.len();
    for (i, pending) in frozen.iter().enumerate() {
        check_deadline(1 + i, total)?;
        for head in &pending.heads {
            visit(head, &mut acc).map_err(|source| failed(source, 1 + i, total))?;
        }
    }
    for data in &from_peers.blocks {
        visit(data, &mut acc).map_err(|source| failed(source, 1 + frozen.len(), total))?;
    }
    let answered = cached(&metas, &mut acc);
    for (i, meta) in metas.iter().enumerate() {
        check_deadline(1 + frozen.len() + i, total)?;
        if answered.get(i).copied().unwrap_or(false) {
            continue;
        }
        let block = match shared.load_block(runtime, meta) {
            Ok(block) => block,
            Err(Unavailable::Gone) => return Ok(None),
            Err(Unavailable::Skipped(error)) => {
                skipped.push(CorruptBlock {
                    id: meta.id.clone(),
                    error,
                });
                continue;
            }
        };
        match visit(block.as_ref(), &mut acc) {
            Ok(()) => {}
            Err(QueryError::CorruptBlock { source, .. }) => match read_failure(&source) {
                // Read by range, the block's object went away under the
                // query or could not be read: nothing about its bytes is
                // known to be wrong, so it leaves the cache, not marked
                // corrupt.
                Some(Unavailable::Gone) => {
                    lock(&shared.catalog.cache).remove(&meta.id);
                    return Ok(None);
                }
                Some(Unavailable::Skipped(error)) => {
                    lock(&shared.catalog.cache).remove(&meta.id);
                    skipped.push(CorruptBlock {
                        id: meta.id.clone(),
                        error,
                    });
                }
                None => {
                    let error = "corrupt data found while querying".to_owned();
                    shared.mark_corrupt(&meta.id, error.clone());
                    skipped.push(CorruptBlock {
                        id: meta.id.clone(),
                        error,
                    });
                }
            },
            Err(source) => return Err(failed(source, 1 + frozen.len() + i, total)),
        }
    }
    Ok(Some(acc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(format_version: u32, size_bytes: u64) -> BlockMeta {
        BlockMeta {
            format_version,
            id: "b".into(),
            min_time_ms: 0,
            max_time_ms: 1,
            compaction_level: 1,
            replica: "r".into(),
            sources: vec![],
            series: 1,
            samples: 1,
            profiles: 1,
            size_bytes,
        }
    }

    /// A block whose blobs carry CRCs is read by range past a few windows,
    /// whatever the cache; a format 1 block only past an eighth of the
    /// cache, since opening it by range reads its whole data anyway.
    #[test]
    fn blocks_with_blob_crcs_are_opened_by_range_past_a_few_windows() {
        let cache = 1 << 30;
        let v2 = kiln_engine::BLOB_CRC_VERSION;
        assert!(!opens_by_range(&meta(v2, WHOLE_FETCH_MAX_BYTES), cache));
        assert!(opens_by_range(&meta(v2, WHOLE_FETCH_MAX_BYTES + 1), cache));
        assert!(!opens_by_range(&meta(1, 86 << 20), cache));
        assert!(opens_by_range(&meta(1, (cache / 8) + 1), cache));
        assert!(opens_by_range(&meta(v2, 86 << 20), cache));
    }
}
