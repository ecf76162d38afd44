//! Why a storage operation failed, and whose fault it was.

use std::path::PathBuf;

/// Who caused an error, so the server can pick a status code without
/// matching on every variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request itself is wrong (bad pprof, limits exceeded, bad query):
    /// HTTP 4xx / gRPC `INVALID_ARGUMENT`. Retrying the same request cannot help.
    Client,
    /// The store is busy or shutting down: HTTP 429/503 / gRPC
    /// `RESOURCE_EXHAUSTED`/`UNAVAILABLE`. Retrying later can help.
    Overloaded,
    /// Something on the server side failed (disk, bucket, a bug): HTTP 500 /
    /// gRPC `INTERNAL`.
    Server,
}

/// A failed storage operation.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The pprof payload could not be decoded or failed validation.
    #[error("invalid profile: {source}")]
    InvalidProfile {
        /// What the pprof decoder refused.
        #[source]
        source: kiln_pprof::PprofError,
    },
    /// The request is well-formed pprof but the engine refused it (limits,
    /// missing `__name__`, ...).
    #[error("profile rejected: {source}")]
    Rejected {
        /// What the engine refused.
        #[source]
        source: kiln_engine::IngestError,
    },
    /// The profile's time is outside what the store accepts: older than
    /// retention, or further in the future than the allowed clock skew.
    #[error(
        "profile time {time_ms} (unix ms) is {}; accepted: {earliest_ms} to {latest_ms} (now - retention to now + max future skew)",
        if time_ms > latest_ms { "in the future" } else { "older than retention" }
    )]
    TimeOutOfRange {
        /// The profile's time, unix ms.
        time_ms: i64,
        /// The earliest accepted time (now - retention).
        earliest_ms: i64,
        /// The latest accepted time (now + the configured skew).
        latest_ms: i64,
    },
    /// Decoding this request needs more memory than the whole ingest budget.
    #[error(
        "decoding this profile needs about {bytes} bytes, more than the store's ingest memory budget of {budget}; send smaller profiles"
    )]
    OverMemoryBudget {
        /// Bytes the request would hold.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
    /// The ingest memory budget is taken by requests in flight right now.
    #[error(
        "the store's ingest memory budget ({budget} bytes) is in use; {bytes} more bytes are not available now, retry later"
    )]
    MemoryBusy {
        /// Bytes the request asked for.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
    /// A query ran past its deadline; nothing partial is answered.
    #[error(
        "query stopped after {timeout:?} with {visited} of {total} heads and blocks read; narrow the time range or the selector"
    )]
    QueryTimeout {
        /// The deadline.
        timeout: std::time::Duration,
        /// Heads and blocks read before it.
        visited: usize,
        /// Heads and blocks the query needed.
        total: usize,
    },
    /// Every query runner stayed busy for the query's whole deadline.
    #[error("store busy: {running} queries kept running for {waited:?}; retry")]
    QueriesBusy {
        /// Queries allowed to run at once.
        running: usize,
        /// How long this query waited for one of them.
        waited: std::time::Duration,
    },
    /// Compactions kept replacing blocks while the query read them.
    #[error("blocks were replaced by compaction during the query, {attempts} times; retry")]
    QueryRaced {
        /// Passes made.
        attempts: usize,
    },
    /// A client's idempotency key is empty or too long.
    #[error("invalid idempotency key: {message}")]
    InvalidIdempotencyKey {
        /// What is wrong with it.
        message: String,
    },
    /// The writer's token may not write the namespace of one of the
    /// profile's series.
    #[error(
        "this writer's token may write only the namespaces {allowed:?}; a series of the \
         profile has namespace {namespace:?} (\"\": no `namespace` label)"
    )]
    NamespaceNotAllowed {
        /// The namespace refused (cut to 256 characters).
        namespace: String,
        /// The namespaces the writer may write (the first 16).
        allowed: Vec<String>,
    },
    /// Another request with the same idempotency key is being stored now.
    #[error("a profile with idempotency key {key:?} is being stored right now; retry")]
    IdempotencyKeyInFlight {
        /// The key.
        key: String,
    },
    /// A query could not be evaluated (bad matcher, bad range, ...).
    #[error("query failed: {source}")]
    Query {
        /// What the engine reported.
        #[source]
        source: kiln_engine::QueryError,
    },
    /// Too many ingests are in flight; the caller should back off.
    #[error("store overloaded: more than {limit} ingests in flight")]
    Overloaded {
        /// The configured in-flight limit.
        limit: usize,
    },
    /// Data waits for the bucket (uploads keep failing) up to the upload
    /// budget; writes are refused until uploads drain, so a long bucket
    /// outage cannot grow memory until the store is killed, nor the WAL a
    /// restart must replay.
    #[error(
        "store overloaded: {unuploaded_bytes} bytes ({pending} cut heads and the live head) wait for upload to the bucket, the budget is {budget_bytes}; retry later"
    )]
    UploadBacklog {
        /// Heads cut but not yet uploaded.
        pending: usize,
        /// Bytes held by those heads and the live head.
        unuploaded_bytes: u64,
        /// `max_head_bytes + max_pending_upload_bytes`.
        budget_bytes: u64,
    },
    /// The store is shutting down and accepts no more writes.
    #[error("store is shutting down")]
    ShuttingDown,
    /// Reading or writing the write-ahead log failed.
    #[error("write-ahead log {op} failed at {}: {source}", path.display())]
    Wal {
        /// What was being done (`open`, `append`, `fsync`, ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A write or fsync of the write-ahead log failed: this write was not
    /// logged, and writes are refused until the log has started a fresh
    /// segment (at the next write, and every second meanwhile).
    #[error("write-ahead log refuses writes after a failed write or fsync: {message}")]
    WalFailed {
        /// What failed.
        message: String,
    },
    /// An object-store operation failed.
    #[error("object store {op} of {path} failed: {source}")]
    Bucket {
        /// What was being done (`put`, `get`, `list`, `delete`).
        op: &'static str,
        /// The object path.
        path: String,
        /// What the object store reported.
        #[source]
        source: object_store::Error,
    },
    /// A recorded-series file is too large or damaged; queries skip it.
    #[error("recorded-series file {name}: {message}")]
    RecordedFile {
        /// Its file name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A debug file or symbol cache in the bucket is too large, or its key
    /// is not one the store writes.
    #[error("{key}: {message}")]
    DebugInfoObject {
        /// The object's key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A block's `meta.json` could not be parsed.
    #[error("block {id}: meta.json is invalid: {source}")]
    BlockMeta {
        /// The block id.
        id: String,
        /// What serde_json reported.
        #[source]
        source: serde_json::Error,
    },
    /// A block's `meta.json` names a different block id than its path.
    #[error("block {id}: meta.json names block {found}")]
    MetaMismatch {
        /// The id from the object path.
        id: String,
        /// The id inside meta.json.
        found: String,
    },
    /// A lease object in the bucket could not be used; while it cannot, this
    /// process does not clean up, compact or apply retention.
    #[error("lease {path}: {message}")]
    Lease {
        /// The lease's bucket path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The bucket prefix was claimed by a store of another name: sharing it
    /// would mix the two stores' profiles and retention.
    #[error(
        "the bucket prefix belongs to store {owner:?}, not {store:?}; give each store its own bucket or --bucket-prefix"
    )]
    BucketClaimedByAnotherStore {
        /// This store's name.
        store: String,
        /// The name in the prefix's claim.
        owner: String,
    },
    /// A step that must be done by a lease's holder alone was not done (or
    /// was stopped): this process no longer trusts the generation it holds,
    /// so another process may hold the lease now.
    #[error("{action}: the lease {lease} is no longer held by this process")]
    LeaseLost {
        /// The lease's bucket path.
        lease: String,
        /// What was not done.
        action: &'static str,
    },
    /// Another live process holds this replica name's lease in the bucket:
    /// two processes acting for one name would compact the same blocks and
    /// count their data twice.
    #[error(
        "replica name {replica:?} is held by another live store (process {holder}, which renewed its lease while this one waited); give each replica sharing a bucket its own --replica"
    )]
    ReplicaNameInUse {
        /// The replica name.
        replica: String,
        /// The other process's id in its lease.
        holder: String,
    },
    /// A block under one replica's prefix says another replica wrote it.
    #[error(
        "block {id}: stored under replica {prefix:?} but its meta.json names replica {replica:?}"
    )]
    OwnerMismatch {
        /// The block id.
        id: String,
        /// The replica whose prefix holds it.
        prefix: String,
        /// The replica its meta.json names.
        replica: String,
    },
    /// A block could not be encoded, decoded or compacted.
    #[error("block {id}: {source}")]
    Block {
        /// The block id.
        id: String,
        /// What the engine reported.
        #[source]
        source: kiln_engine::BlockError,
    },
    /// A peer asked for more of this replica's unflushed data than one
    /// answer may hold; it narrows its query or counts this replica as
    /// unanswered.
    #[error("the selected unflushed data is past {max_bytes} bytes, what one peer answer may hold")]
    PeerAnswerTooLarge {
        /// The limit.
        max_bytes: usize,
    },
    /// A compaction's local spill file could not be written or read back.
    #[error("compaction spill file {op} failed at {}: {source}", path.display())]
    Spill {
        /// What was being done (`create`, `write`, `read`).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The store configuration is unusable.
    #[error("invalid store configuration: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
    /// A blocking task panicked or was cancelled (a bug, not bad input).
    #[error("background task for {what} failed: {message}")]
    Task {
        /// What the task was doing.
        what: &'static str,
        /// The join error.
        message: String,
    },
}

impl StorageError {
    /// A short, fixed name for metrics and logs, one per variant (or per
    /// underlying reason for client errors, which carry their own).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidProfile { source } => source.reason(),
            Self::Rejected { source } => source.reason(),
            Self::InvalidIdempotencyKey { .. } => "invalid_idempotency_key",
            Self::NamespaceNotAllowed { .. } => "namespace_not_allowed",
            Self::IdempotencyKeyInFlight { .. } => "idempotency_key_in_flight",
            Self::TimeOutOfRange { .. } => "time_out_of_range",
            Self::QueryTimeout { .. } => "query_timeout",
            Self::QueryRaced { .. } => "query_raced",
            Self::QueriesBusy { .. } => "queries_busy",
            Self::OverMemoryBudget { .. } => "over_memory_budget",
            Self::MemoryBusy { .. } => "memory_busy",
            Self::Query { source } => source.reason(),
            Self::Overloaded { .. } => "overloaded",
            Self::UploadBacklog { .. } => "upload_backlog",
            Self::ShuttingDown => "shutting_down",
            Self::Wal { .. } => "wal_io",
            Self::WalFailed { .. } => "wal_failed",
            Self::Bucket { .. } => "bucket",
            Self::RecordedFile { .. } => "recorded_file",
            Self::DebugInfoObject { .. } => "debuginfo_object",
            Self::BlockMeta { .. } => "block_meta",
            Self::MetaMismatch { .. } => "meta_mismatch",
            Self::OwnerMismatch { .. } => "owner_mismatch",
            Self::Block { .. } => "block",
            Self::Lease { .. } => "lease",
            Self::LeaseLost { .. } => "lease_lost",
            Self::BucketClaimedByAnotherStore { .. } => "bucket_claimed",
            Self::ReplicaNameInUse { .. } => "replica_name_in_use",
            Self::Config { .. } => "config",
            Self::Spill { .. } => "compaction_spill",
            Self::PeerAnswerTooLarge { .. } => "peer_answer_too_large",
            Self::Task { .. } => "task",
        }
    }

    /// Whose fault the error is; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidProfile { .. }
            | Self::Rejected { .. }
            | Self::InvalidIdempotencyKey { .. }
            | Self::NamespaceNotAllowed { .. }
            | Self::TimeOutOfRange { .. }
            | Self::OverMemoryBudget { .. }
            | Self::QueryTimeout { .. }
            | Self::PeerAnswerTooLarge { .. }
            | Self::Query { .. } => ErrorClass::Client,
            Self::Overloaded { .. }
            | Self::MemoryBusy { .. }
            | Self::UploadBacklog { .. }
            | Self::QueryRaced { .. }
            | Self::QueriesBusy { .. }
            | Self::IdempotencyKeyInFlight { .. }
            | Self::ShuttingDown => ErrorClass::Overloaded,
            Self::Wal { .. }
            | Self::WalFailed { .. }
            | Self::Bucket { .. }
            | Self::RecordedFile { .. }
            | Self::DebugInfoObject { .. }
            | Self::BlockMeta { .. }
            | Self::MetaMismatch { .. }
            | Self::OwnerMismatch { .. }
            | Self::Block { .. }
            | Self::Lease { .. }
            | Self::LeaseLost { .. }
            | Self::BucketClaimedByAnotherStore { .. }
            | Self::ReplicaNameInUse { .. }
            | Self::Config { .. }
            | Self::Spill { .. }
            | Self::Task { .. } => ErrorClass::Server,
        }
    }

    /// True when the request was at fault (answer 4xx, do not retry).
    pub fn is_client_error(&self) -> bool {
        self.class() == ErrorClass::Client
    }

    /// True when sending the same request again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Overloaded { .. }
                | Self::MemoryBusy { .. }
                | Self::UploadBacklog { .. }
                | Self::QueryRaced { .. }
                | Self::QueriesBusy { .. }
                | Self::IdempotencyKeyInFlight { .. }
                | Self::Lease { .. }
                | Self::ShuttingDown
                | Self::Wal { .. }
                | Self::WalFailed { .. }
                | Self::Bucket { .. }
                | Self::Task { .. }
        )
    }

    pub(crate) fn task(what: &'static str, err: tokio::task::JoinError) -> Self {
        Self::Task {
            what,
            message: err.to_string(),
        }
    }
}
