//! State shared by every handler: the store (once recovered), limits,
//! tokens, metrics and the in-flight slots (ingest and queries apart).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use kiln_engine::IngestStats;
use kiln_engine::model::{Label, NAMESPACE_LABEL};
use kiln_pprof::{DecodeLimits, DecodedProfile};
use kiln_storage::store::IngestRequest;
use kiln_storage::{IngestAdmission, IngestTurn, StorageError, Store, WriterScope};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{Config, Limits};
use crate::error::ApiError;
use crate::ingest::series_batch::{BatchProgress, BatchReport, SeriesUploads};
use crate::ingest::upload::ProfileUpload;
use crate::metrics::{Metrics, StorageGauges};
use crate::query::budget::{QueryMemory, QueryReservation};
use crate::server::auth::WriteTokens;

/// What a write request holds while it runs: the store's admission, one
/// in-flight slot and its body's share of the ingest memory budget.
#[derive(Debug)]
pub struct WritePermit {
    admission: IngestAdmission,
    store: Store,
}

impl WritePermit {
    /// Adds `bytes` to what this request holds of the ingest memory budget,
    /// for the server's own decoding of the body (pprof, multipart).
    pub fn reserve_more(&mut self, bytes: usize) -> Result<(), StorageError> {
        self.store
            .reserve_more_ingest_memory(&mut self.admission, bytes)
    }
}

/// A [`WritePermit`] shared by the layer that admitted a request and the
/// handler that stores it: gRPC ingest is admitted before tonic runs the
/// handler, which finds the permit in the request's extensions. What it
/// holds is given back when the last holder drops it.
#[derive(Debug, Clone)]
pub struct SharedPermit(Arc<Mutex<WritePermit>>);

impl SharedPermit {
    /// Shares `permit`.
    pub fn new(permit: WritePermit) -> Self {
        Self(Arc::new(Mutex::new(permit)))
    }

    /// [`WritePermit::reserve_more`] on the shared permit.
    pub fn reserve_more(&self, bytes: usize) -> Result<(), StorageError> {
        // A holder that panicked while reserving left the count as it was.
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reserve_more(bytes)
    }
}

/// Handler state; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    store: OnceLock<Store>,
    limits: Limits,
    decode_limits: DecodeLimits,
    write_tokens: WriteTokens,
    read_tokens: Vec<String>,
    metrics: Metrics,
    body_read_timeout: Duration,
    /// Queries have their own slots, apart from the store's write slots,
    /// so a flood of slow uploads cannot turn every query away, and a
    /// flood of costly queries cannot turn every write away.
    query_slots: Arc<Semaphore>,
    /// What queries' bodies hold of memory, apart from ingest's budget for
    /// the same reason as the slots.
    query_memory: QueryMemory,
    /// The store listens on loopback only, so requests must name it by a
    /// loopback name or an address: a web page that points its own name
    /// at 127.0.0.1 (DNS rebinding) would otherwise read it as same-origin.
    loopback_only: bool,
    /// Names frames sent without function names, at query time.
    symbolizer: crate::symbolize::Symbolizer,
}

impl AppState {
    /// State for a server whose store is not open yet.
    pub fn new(config: &Config) -> Self {
        let metrics = Metrics::default();
        let symbolizer =
            crate::symbolize::Symbolizer::new(&config.symbolization, metrics.symbolization());
        Self {
            shared: Arc::new(Shared {
                store: OnceLock::new(),
                limits: config.limits.clone(),
                decode_limits: decode_limits(&config.limits),
                write_tokens: WriteTokens::new(
                    config.write_tokens.clone(),
                    &config.namespace_write_tokens,
                ),
                read_tokens: config.read_tokens.clone(),
                metrics,
                body_read_timeout: config.connections.body_read_timeout,
                query_slots: Arc::new(Semaphore::new(config.limits.max_inflight_queries)),
                query_memory: QueryMemory::new(config.limits.query_memory_bytes as u64),
                loopback_only: config.listen.ip().is_loopback(),
                symbolizer,
            }),
        }
    }

    /// The symbolizer queries name their frames with.
    pub fn symbolizer(&self) -> &crate::symbolize::Symbolizer {
        &self.shared.symbolizer
    }

    /// Makes the recovered store available; from now on `/readyz` reports
    /// its health.
    pub fn set_store(&self, store: Store) {
        // A second call would be a bug in main; keep the first store.
        let _ = self.shared.store.set(store);
    }

    /// The store, or `NotReady` while it is recovering.
    pub fn store(&self) -> Result<&Store, ApiError> {
        self.shared.store.get().ok_or(ApiError::NotReady)
    }

    /// True once the store is open.
    pub fn is_ready(&self) -> bool {
        self.shared.store.get().is_some()
    }

    /// Request limits.
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// pprof decode limits derived from the request limits.
    pub fn decode_limits(&self) -> &DecodeLimits {
        &self.shared.decode_limits
    }

    /// Whether the store listens on loopback only.
    pub fn loopback_only(&self) -> bool {
        self.shared.loopback_only
    }

    /// Tokens for writes, with what each may write.
    pub fn write_tokens(&self) -> &WriteTokens {
        &self.shared.write_tokens
    }

    /// Tokens for reads; empty means reads are open.
    pub fn read_tokens(&self) -> &[String] {
        &self.shared.read_tokens
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// How long a client may take to send a request body.
    pub fn body_read_timeout(&self) -> Duration {
        self.shared.body_read_timeout
    }

    /// Reserves `bytes` more of the query memory budget for `reservation`
    /// (a query's body as it arrives, and what is parsed from it), or
    /// refuses at once: 429 while other queries hold the budget, 413 when
    /// one query would need more than all of it.
    pub fn reserve_query_memory(
        &self,
        reservation: &mut QueryReservation,
        bytes: usize,
    ) -> Result<(), ApiError> {
        self.shared.query_memory.reserve(reservation, bytes)
    }

    /// Takes a query slot, or refuses at once when all are taken, so
    /// overload turns into 429 / RESOURCE_EXHAUSTED instead of queueing.
    /// Callers that read a body take the slot once it has arrived, so that
    /// slow senders hold no slot while they send.
    pub fn admit_query(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.shared.query_slots)
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded {
                kind: "query",
                limit: self.shared.limits.max_inflight_queries,
            })
    }

    /// Admits one write in the store's one write budget, reserving
    /// `body_bytes`.
    fn admit_write_bytes(&self, body_bytes: usize) -> Result<WritePermit, ApiError> {
        let store = self.store()?;
        let admission = store.admit_ingest(body_bytes).map_err(|err| match err {
            StorageError::Overloaded { limit } => ApiError::Overloaded {
                kind: "ingest",
                limit,
            },
            other => other.into(),
        })?;
        Ok(WritePermit {
            admission,
            store: store.clone(),
        })
    }

    /// Waits for one of the store's ingest turns, for the server's own
    /// CPU-bound step of a write (inflating, converting, decoding OTLP), so
    /// those count against the same cores as the store's decode and apply.
    /// Give it back before handing the write to the store.
    pub async fn ingest_turn(&self) -> Result<IngestTurn, ApiError> {
        Ok(self.store()?.ingest_turn().await?)
    }

    /// Takes an ingest slot with nothing reserved yet: the caller reserves
    /// the body as it arrives, its inflated form as it grows and its
    /// decoded form before decoding ([`WritePermit::reserve_more`]), so a
    /// request holds of the ingest budget only what it has become. Taking
    /// twice the declared length up front let a small gzip body inflate
    /// far past its reservation, and a body without a length hold the
    /// largest reservation for as long as it trickled in.
    pub fn admit_write_unsized(&self) -> Result<WritePermit, ApiError> {
        self.admit_write_bytes(0)
    }

    /// Stores a WriteRaw or Push request series by series, so that one
    /// pod's bad labels cannot lose the profiles of the other pods batched
    /// with it ([`BatchProgress`]). Each profile's write is one hop to the
    /// blocking pool; a keyed one goes through [`Store::ingest_resent`],
    /// which keeps the keys. A batch without keys is stored by
    /// [`AppState::ingest_series_blocking`] instead, in its decode's hop.
    /// `resend` is the attempt number of a request the client marked as a
    /// resend (`kiln-retry-attempt`).
    pub async fn ingest_series(
        &self,
        protocol: &'static str,
        writer: &WriterScope,
        batch: Vec<SeriesUploads>,
        resend: Option<u32>,
    ) -> Result<BatchReport, ApiError> {
        let store = self.store()?;
        // A resend's keys unknown here may be known at a peer (the first
        // try went there): one lookup for the request, before any profile
        // is stored. First sends never ask.
        let at_peers = match resend {
            Some(_) => store.keys_at_peers(resent_keys(&batch)).await,
            None => None,
        };
        let mut progress = BatchProgress::new(batch.len());
        for series in batch {
            let Some((index, uploads, keys)) = progress.series_to_store(series) else {
                continue;
            };
            let mut keys = keys.into_iter();
            for (stored, upload) in uploads.into_iter().enumerate() {
                let bytes = upload.pprof.len() as u64;
                // WriteRaw and Push hand the store bytes, never a profile.
                let (request, _) = store_request(upload, writer);
                // A keyed profile resent within the window is answered as
                // stored without being stored again, so a client's retry of
                // a batch stored in part does not count profiles twice.
                let outcome = match keys.next().flatten() {
                    Some(key) => store.ingest_resent(request, &key, at_peers.as_ref()).await,
                    None => store.ingest(request).await,
                };
                if let Err(error) = self.count_stored(protocol, bytes, outcome) {
                    progress.profile_failed(index, stored, error);
                    break;
                }
            }
        }
        Ok(progress.finish())
    }

    /// [`AppState::ingest_series`] for a batch whose profiles carry no
    /// idempotency key, on this blocking-pool thread, in the hop that
    /// decoded it: `turn` is the turn it was decoded under, which the first
    /// profile's write takes over ([`Store::ingest_blocking`]); each later
    /// one waits for its own.
    ///
    /// Blocking: never call it on an async worker.
    pub fn ingest_series_blocking(
        &self,
        protocol: &'static str,
        writer: &WriterScope,
        turn: IngestTurn,
        batch: Vec<SeriesUploads>,
    ) -> Result<BatchReport, ApiError> {
        let store = self.store()?;
        let mut turn = Some(turn);
        let mut progress = BatchProgress::new(batch.len());
        for series in batch {
            let Some((index, uploads, _)) = progress.series_to_store(series) else {
                continue;
            };
            for (stored, upload) in uploads.into_iter().enumerate() {
                let bytes = upload.pprof.len() as u64;
                let (request, _) = store_request(upload, writer);
                let outcome = match turn.take() {
                    Some(turn) => Ok(turn),
                    None => store.ingest_turn_blocking(),
                }
                .and_then(|turn| store.ingest_blocking(turn, request, None));
                if let Err(error) = self.count_stored(protocol, bytes, outcome) {
                    progress.profile_failed(index, stored, error);
                    break;
                }
            }
        }
        Ok(progress.finish())
    }

    /// Counts a profile of `bytes` in the ingest metrics if it was stored;
    /// why not if it was not.
    fn count_stored(
        &self,
        protocol: &'static str,
        bytes: u64,
        outcome: Result<IngestStats, StorageError>,
    ) -> Result<(), StorageError> {
        let stats = outcome?;
        self.shared
            .metrics
            .record_ingest(protocol, stats.samples, bytes);
        Ok(())
    }

    /// Stores every upload, in order, on this blocking-pool thread; stops
    /// at the first refusal (earlier uploads of the same request stay
    /// stored). The request was admitted
    /// ([`AppState::admit_write_unsized`]) and its series labels checked
    /// where its uploads were built (`crate::ingest::upload`), in the same
    /// blocking hop, under `turn`: the first upload's write takes that turn
    /// over, each later one waits for its own. The store runs the engine's
    /// checks of what the profile adds, logs and applies it, on this thread
    /// ([`Store::ingest_blocking`]), so an upload takes one hop in all.
    ///
    /// Blocking: never call it on an async worker.
    pub fn ingest_blocking(
        &self,
        protocol: &'static str,
        writer: &WriterScope,
        mut turn: Option<IngestTurn>,
        uploads: Vec<ProfileUpload>,
    ) -> Result<(), ApiError> {
        let store = self.store()?;
        for upload in uploads {
            let turn = match turn.take() {
                Some(turn) => turn,
                None => store.ingest_turn_blocking()?,
            };
            let bytes = upload.pprof.len() as u64;
            let (request, decoded) = store_request(upload, writer);
            self.count_stored(
                protocol,
                bytes,
                store.ingest_blocking(turn, request, decoded),
            )?;
        }
        Ok(())
    }

    /// Gauges for `/metrics`.
    pub fn storage_gauges(&self) -> StorageGauges {
        let in_use = |slots: &Semaphore, limit: usize| {
            limit.saturating_sub(slots.available_permits()) as u64
        };
        let inflight_queries = in_use(
            &self.shared.query_slots,
            self.shared.limits.max_inflight_queries,
        );
        match self.shared.store.get() {
            None => StorageGauges {
                inflight_requests: inflight_queries,
                inflight_queries,
                ..StorageGauges::default()
            },
            Some(store) => {
                let stats = store.stats();
                let census = store.series_census();
                StorageGauges {
                    ready: store.health().is_ready(),
                    head_bytes: stats.head_bytes,
                    head_profiles: stats.head_profiles,
                    blocks: stats.blocks,
                    block_bytes: stats.block_bytes,
                    corrupt_blocks: stats.corrupt_blocks,
                    ingest_memory_reserved_bytes: stats.ingest_memory_reserved_bytes,
                    quarantined_wal_records: store.replay_report().quarantined_records,
                    quarantined_wal_segments: stats.wal_quarantined_segments,
                    wal_failed_writes: stats.wal_failed_writes,
                    compactions_skipped_low_disk: stats.compactions_skipped_low_disk,
                    pending_uploads: stats.pending_uploads,
                    inflight_requests: store.ingests_in_flight() as u64 + inflight_queries,
                    inflight_queries,
                    retention_seconds: store.config().retention.as_secs(),
                    retention_bytes: store.config().max_total_bytes.unwrap_or(0),
                    retained_series: census.series,
                    series_census_bytes: census.bytes,
                    series_census_unreadable_blocks: census.unreadable_blocks,
                    keys: store.key_stats(),
                }
            }
        }
    }
}

/// The keys of a batch's profiles that may be stored (their series was
/// split without an error).
fn resent_keys(batch: &[SeriesUploads]) -> Vec<String> {
    batch
        .iter()
        .filter(|series| series.uploads.is_ok())
        .flat_map(|series| series.keys.iter().flatten().cloned())
        .collect()
}

/// The store's request for `upload` by `writer`, and the profile its pprof
/// decodes to when the server decoded or built it. A writer bound to one
/// namespace writes into it the series that name none, as a tenant's SDK
/// does not know it runs as a tenant.
fn store_request(
    upload: ProfileUpload,
    writer: &WriterScope,
) -> (IngestRequest, Option<DecodedProfile>) {
    // One copy at a time, for the profile being stored.
    let mut labels = Arc::unwrap_or_clone(upload.labels);
    if let Some(namespace) = writer.sole_namespace()
        && labels.get(NAMESPACE_LABEL).is_none()
    {
        labels.insert(Label::new(NAMESPACE_LABEL, namespace));
    }
    let request = IngestRequest {
        labels,
        time_ms: upload.time_ms,
        duration_nanos: upload.duration_nanos,
        pprof: upload.pprof,
        writer: writer.clone(),
    };
    (request, upload.decoded)
}

/// pprof decode limits: the defaults, tightened by the request limits.
///
/// NB: the inflate cap is the decoder's default (64 MiB) and no longer grows
/// with `--max-request-bytes` (it was 4x, 128 MiB by default): one request
/// may cost its body, the inflated protobuf and the decoded profile (itself
/// bounded by `max_decoded_bytes`, estimated before decoding), and 128 MiB of
/// empty labels decode to gigabytes: a small gzipped body must not be
/// able to allocate more than the pod has.
pub fn decode_limits(limits: &Limits) -> DecodeLimits {
    let defaults = DecodeLimits::default();
    DecodeLimits {
        max_input_bytes: limits.max_request_bytes,
        max_samples: limits.max_samples_per_profile,
        ..defaults
    }
}
