//! Getting profiles out: a bounded queue that drops the oldest profile under
//! pressure, exponential backoff between retries (both pure), and the sinks
//! that write pprof files or call WriteRaw. A WriteRaw batch is settled per
//! series (`series_ack`): what the store stored is never sent again, what it
//! refused is dropped, only the rest is retried, so one bad profile does not
//! lose its neighbours' data and a retry does not store a profile twice.

mod replica_choice;
mod series_ack;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_api::parca::profilestore::v1alpha1 as parca;

use crate::metrics::AgentMetrics;
pub use replica_choice::{FAILOVER_AFTER, RETURN_AFTER, ReplicaChoice, preferred_index};
pub use series_ack::{SERIES_STATUS_METADATA, Settled, settle};

/// The metadata marking a request as a resend, with its attempt number
/// (`1` for the first resend): a store replica that does not know one of
/// its idempotency keys asks its peers whether they stored it (the first
/// try may have reached another replica), where a first send is stored
/// without asking. The store's `kiln_storage::peer_keys` holds the same
/// name.
pub const RETRY_ATTEMPT_METADATA: &str = "kiln-retry-attempt";

/// One profile ready to leave the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShipItem {
    /// Series labels, sorted by name, `__name__` included.
    pub labels: Vec<(String, String)>,
    /// Gzipped pprof.
    pub pprof_gzip: Vec<u8>,
    /// File name stem for `--output-dir` (unique per target and window).
    pub file_stem: String,
}

/// A FIFO that holds at most `capacity` items and drops the oldest to make
/// room, so memory stays bounded while the store is unreachable.
#[derive(Debug)]
pub struct BoundedQueue<T> {
    items: VecDeque<T>,
    capacity: usize,
    dropped: u64,
}

impl<T> BoundedQueue<T> {
    /// A queue of at most `capacity` (at least 1) items.
    pub fn new(capacity: usize) -> Self {
        BoundedQueue {
            items: VecDeque::new(),
            capacity: capacity.max(1),
            dropped: 0,
        }
    }

    /// Appends `item`, dropping the oldest items when full; returns how many
    /// were dropped.
    pub fn push(&mut self, item: T) -> u64 {
        let mut dropped = 0;
        while self.items.len() >= self.capacity {
            self.items.pop_front();
            dropped += 1;
        }
        self.items.push_back(item);
        self.dropped += dropped;
        dropped
    }

    /// Puts an item that failed to send back at the front, unless newer
    /// items already fill the queue (then the failed one is the oldest and
    /// is dropped); returns whether it was kept.
    pub fn push_front_if_room(&mut self, item: T) -> bool {
        if self.items.len() >= self.capacity {
            self.dropped += 1;
            return false;
        }
        self.items.push_front(item);
        true
    }

    /// Takes the oldest item.
    pub fn pop(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Items dropped since creation.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Exponential backoff with a cap and deterministic jitter input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// Backoff starting at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            attempt: 0,
        }
    }

    /// The delay before the next retry; `jitter` in [0, 1) adds up to half
    /// the delay again, so agents that failed together do not retry together.
    pub fn next_delay(&mut self, jitter: f64) -> Duration {
        let factor = 2u32.saturating_pow(self.attempt.min(20));
        self.attempt = self.attempt.saturating_add(1);
        let base = self.initial.saturating_mul(factor).min(self.max);
        base + base.mul_f64(jitter.clamp(0.0, 1.0) / 2.0)
    }

    /// Back to the initial delay after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// The shared queue between the collector (producer) and the shipper.
#[derive(Debug, Clone)]
pub struct ShipQueue {
    queue: Arc<Mutex<BoundedQueue<ShipItem>>>,
    notify: Arc<tokio::sync::Notify>,
    metrics: Arc<AgentMetrics>,
}

impl ShipQueue {
    /// A queue of at most `capacity` profiles.
    pub fn new(capacity: usize, metrics: Arc<AgentMetrics>) -> ShipQueue {
        ShipQueue {
            queue: Arc::new(Mutex::new(BoundedQueue::new(capacity))),
            notify: Arc::new(tokio::sync::Notify::new()),
            metrics,
        }
    }

    /// Enqueues a profile (from any thread), dropping the oldest when full.
    pub fn push(&self, item: ShipItem) {
        let dropped = self.with_queue(|q| q.push(item));
        self.metrics.add_drop("queue_full", dropped);
        self.notify.notify_one();
    }

    /// Takes up to `max` queued profiles, oldest first.
    pub fn pop_batch(&self, max: usize) -> Vec<ShipItem> {
        self.with_queue(|q| std::iter::from_fn(|| q.pop()).take(max).collect())
    }

    /// Puts a failed batch back in front, oldest first, as room allows.
    fn requeue(&self, batch: Vec<ShipItem>) {
        for item in batch.into_iter().rev() {
            if !self.with_queue(|q| q.push_front_if_room(item)) {
                self.metrics.add_drop("queue_full", 1);
            }
        }
    }

    /// Number of queued profiles.
    pub fn len(&self) -> usize {
        self.with_queue(|q| q.len())
    }

    /// Whether no profile is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn with_queue<R>(&self, f: impl FnOnce(&mut BoundedQueue<ShipItem>) -> R) -> R {
        // A poisoned lock means a panic elsewhere; the queue itself is still
        // consistent (every operation is a single VecDeque call).
        let mut guard = self
            .queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }
}

/// Where profiles go.
#[derive(Debug, Clone)]
pub enum Sink {
    /// Gzipped pprof files in a directory.
    Directory(PathBuf),
    /// A store speaking Parca's WriteRaw.
    Store {
        /// The gRPC endpoint, e.g. `http://kiln-store:7470`.
        endpoint: String,
        /// A store of several replicas, each by its stable name: every
        /// batch and its retries go to the one chosen for this node
        /// ([`ReplicaChoice`]) instead of `endpoint`.
        replicas: Option<ReplicaChoice>,
        /// The store's write token, sent as `authorization: Bearer ...`.
        token: Option<StoreToken>,
    },
}

/// A bearer token for the store, checked once so every request can carry it.
#[derive(Clone)]
pub struct StoreToken(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl std::fmt::Debug for StoreToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never in logs.
        f.write_str("StoreToken(..)")
    }
}

/// Why a store token is unusable.
#[derive(Debug, thiserror::Error)]
pub enum StoreTokenError {
    /// The token file could not be read.
    #[error("cannot read the store token from {path}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no token, or one that cannot go in a header.
    #[error("the store token in {path} is empty or has characters other than visible ASCII")]
    Invalid {
        /// The file.
        path: PathBuf,
    },
}

impl StoreToken {
    /// Reads the token from `path` (surrounding whitespace, such as the
    /// newline of a file written by hand or a Kubernetes Secret, is ignored).
    pub fn from_file(path: &std::path::Path) -> Result<StoreToken, StoreTokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| StoreTokenError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        StoreToken::parse(text.trim()).ok_or_else(|| StoreTokenError::Invalid {
            path: path.to_owned(),
        })
    }

    fn parse(token: &str) -> Option<StoreToken> {
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        format!("Bearer {token}").parse().ok().map(StoreToken)
    }
}

/// `message` as a request that carries `token`, if any.
fn authorized<T>(message: T, token: Option<&StoreToken>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(StoreToken(value)) = token {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
    }
    request
}

/// Why one send failed.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// Writing a profile file failed.
    #[error("cannot write profile {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The store endpoint is not a valid URI.
    #[error("invalid store endpoint {endpoint}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// Why it is invalid.
        #[source]
        source: tonic::transport::Error,
    },
    /// The WriteRaw call failed.
    #[error("WriteRaw failed with {code:?}: {message}")]
    Rpc {
        /// gRPC status code.
        code: tonic::Code,
        /// Status message.
        message: String,
    },
}

impl ShipError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ShipError::Write { .. } => "write",
            ShipError::Endpoint { .. } => "endpoint",
            ShipError::Rpc { .. } => "rpc",
        }
    }

    /// Whether retrying can help (bad requests are dropped, not retried).
    pub fn is_retryable(&self) -> bool {
        match self {
            ShipError::Write { .. } | ShipError::Endpoint { .. } => true,
            ShipError::Rpc { code, .. } => !matches!(
                code,
                tonic::Code::InvalidArgument
                    | tonic::Code::Unimplemented
                    | tonic::Code::PermissionDenied
                    | tonic::Code::Unauthenticated
            ),
        }
    }
}

/// Most profiles sent in one WriteRaw request (one series each): a window
/// of `--all` yields one profile per process, and one request per process
/// would cost a round trip each.
pub const MAX_BATCH: usize = 64;

/// This agent process's name in idempotency keys: random, so agents on
/// different nodes (whose profiles may share a pid and a window) never
/// share keys.
fn agent_instance() -> &'static str {
    static INSTANCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/uuid")
            .map(|uuid| uuid.trim().to_string())
            .unwrap_or_else(|_| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                format!("{}-{nanos}", std::process::id())
            })
    })
}

/// The idempotency key of a profile: the same on every retry, so the store
/// keeps one copy when an answer was lost and the batch is sent again.
pub fn idempotency_key(item: &ShipItem) -> String {
    format!("{}/{}", agent_instance(), item.file_stem)
}

/// The WriteRaw request carrying a batch of profiles, one series each, with
/// their idempotency keys.
pub fn write_raw_request(items: &[ShipItem]) -> parca::WriteRawRequest {
    parca::WriteRawRequest {
        kiln_idempotency_keys: items.iter().map(idempotency_key).collect(),
        series: items
            .iter()
            .map(|item| parca::RawProfileSeries {
                labels: Some(parca::LabelSet {
                    labels: item
                        .labels
                        .iter()
                        .map(|(name, value)| parca::Label {
                            name: name.clone(),
                            value: value.clone(),
                        })
                        .collect(),
                }),
                samples: vec![parca::RawSample {
                    raw_profile: item.pprof_gzip.clone(),
                    executable_info: Vec::new(),
                }],
            })
            .collect(),
        normalized: false,
        ..parca::WriteRawRequest::default()
    }
}

/// Sends queued profiles until `shutdown` fires and the queue is empty (or,
/// after shutdown, a send fails).
pub async fn run_shipper(
    sink: Sink,
    queue: ShipQueue,
    metrics: Arc<AgentMetrics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    // How many times in a row what the queue starts with was sent before:
    // a failed batch, or the part of one the store did not store, goes
    // back to the front, so the next batch begins with it.
    let mut resends: u32 = 0;
    let mut client = None;
    let mut replicas = match &sink {
        Sink::Store { replicas, .. } => replicas.clone(),
        Sink::Directory(_) => None,
    };
    loop {
        let batch = queue.pop_batch(MAX_BATCH);
        if batch.is_empty() {
            if *shutdown.borrow() {
                return;
            }
            tokio::select! {
                () = queue.notify.notified() => {}
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let result = match &sink {
            Sink::Directory(dir) => write_files(dir, &batch).await.map(|()| Vec::new()),
            Sink::Store {
                endpoint, token, ..
            } => {
                let endpoint = replicas
                    .as_ref()
                    .map_or(endpoint.as_str(), |r| r.endpoint());
                send_write_raw(endpoint, token.as_ref(), &mut client, &batch, resends).await
            }
        };
        match result {
            Ok(statuses) => {
                let settled = settle(batch, &statuses);
                metrics.profiles_shipped.add(settled.stored as u64);
                if !settled.rejected.is_empty() {
                    tracing::warn!(
                        profiles = settled.rejected.len(),
                        first = %statuses.first().map_or("", |s| s.message.as_str()),
                        "the store refused profiles of a batch; dropped"
                    );
                    metrics.add_drop("rejected", settled.rejected.len() as u64);
                }
                if settled.retry.is_empty() {
                    backoff.reset();
                    resends = 0;
                    if replicas
                        .as_mut()
                        .is_some_and(|r| r.settled(std::time::Instant::now()))
                    {
                        tracing::info!("returning to this node's own store replica");
                        client = None;
                    }
                    continue;
                }
                // The store stopped part way (overload, shutdown): only what
                // it did not store goes back, so a retry stores nothing twice.
                metrics.add_ship_error("partial");
                if *shutdown.borrow() {
                    metrics.add_drop("shutdown", (settled.retry.len() + queue.len()) as u64);
                    return;
                }
                queue.requeue(settled.retry);
                resends = resends.saturating_add(1);
                let delay = backoff.next_delay(jitter());
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => {}
                }
            }
            Err(error) => {
                metrics.add_ship_error(error.reason());
                tracing::warn!(%error, "shipping a profile failed");
                client = None;
                if error.is_retryable()
                    && let Some(replicas) = replicas.as_mut()
                    && replicas.failed(std::time::Instant::now())
                {
                    tracing::warn!(
                        next = replicas.endpoint(),
                        "the store replica failed for {FAILOVER_AFTER:?}; retrying at the next"
                    );
                }
                if !error.is_retryable() {
                    metrics.add_drop("rejected", batch.len() as u64);
                    resends = 0;
                    continue;
                }
                if *shutdown.borrow() {
                    metrics.add_drop("shutdown", (batch.len() + queue.len()) as u64);
                    return;
                }
                queue.requeue(batch);
                resends = resends.saturating_add(1);
                let delay = backoff.next_delay(jitter());
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
    }
}

/// Writes every file of the batch; files already written before a failure
/// are rewritten identically on retry.
async fn write_files(dir: &std::path::Path, batch: &[ShipItem]) -> Result<(), ShipError> {
    for item in batch {
        write_file(dir, item).await?;
    }
    Ok(())
}

async fn write_file(dir: &std::path::Path, item: &ShipItem) -> Result<(), ShipError> {
    let path = dir.join(format!("{}.pb.gz", item.file_stem));
    let temporary = dir.join(format!(".{}.pb.gz.tmp", item.file_stem));
    let data = item.pprof_gzip.clone();
    let (tmp, dest) = (temporary.clone(), path.clone());
    // Write then rename, so readers never see half a profile.
    let outcome = tokio::task::spawn_blocking(move || {
        std::fs::write(&tmp, &data)?;
        std::fs::rename(&tmp, &dest)
    })
    .await
    .unwrap_or_else(|join| Err(std::io::Error::other(join.to_string())));
    outcome.map_err(|source| ShipError::Write { path, source })
}

type StoreClient =
    parca::profile_store_service_client::ProfileStoreServiceClient<tonic::transport::Channel>;

/// Sends one batch, the `resend`th time (0: a first send); the statuses of
/// the series the store did not store entirely (none from a store without
/// Kiln's extension).
async fn send_write_raw(
    endpoint: &str,
    token: Option<&StoreToken>,
    client: &mut Option<StoreClient>,
    batch: &[ShipItem],
    resend: u32,
) -> Result<Vec<parca::KilnSeriesStatus>, ShipError> {
    if client.is_none() {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .map_err(|source| ShipError::Endpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .connect_lazy();
        *client = Some(StoreClient::new(channel));
    }
    let Some(client) = client.as_mut() else {
        return Ok(Vec::new());
    };
    client
        .write_raw(write_raw_call(batch, token, resend))
        .await
        .map(|response| response.into_inner().kiln_series_status)
        .map_err(|status| ShipError::Rpc {
            code: status.code(),
            message: status.message().to_owned(),
        })
}

/// The WriteRaw call for a batch sent the `resend`th time: per-series
/// statuses asked for, and a resend marked with its attempt number.
fn write_raw_call(
    batch: &[ShipItem],
    token: Option<&StoreToken>,
    resend: u32,
) -> tonic::Request<parca::WriteRawRequest> {
    let mut request = authorized(write_raw_request(batch), token);
    let metadata = request.metadata_mut();
    metadata.insert(
        SERIES_STATUS_METADATA,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    if resend > 0 {
        metadata.insert(RETRY_ATTEMPT_METADATA, resend.into());
    }
    request
}

fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(nanos % 1000) / 1000.0
}

#[cfg(test)]
mod tests;
