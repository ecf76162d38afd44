//! `[storage]`: the local data directory, the head, retention and the
//! memory budget everything else is sized from.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[storage]` in the file; flags and variables named on each field.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StorageOptions {
    /// Local directory for the write-ahead log (and the bucket when it is local) [default: ./kiln-data].
    #[arg(long, env = "KILN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// This replica's name; replicas sharing a bucket need distinct names [default: $HOSTNAME or "kiln"].
    #[arg(long, env = "KILN_REPLICA")]
    pub replica: Option<String>,
    /// The store these replicas form, claimed in the bucket prefix; a store of another name refuses the prefix (the operator sets `<namespace>/<name>`) [default: none, nothing claimed].
    #[arg(long, env = "KILN_STORE_NAME")]
    pub store_name: Option<String>,
    /// The replicas of this store as `name=http://host:port`, comma-separated: every query asks each (but this replica) for its unflushed data, and an answer lacking one is marked partial (the operator lists every replica of a `ProfileStore`) [default: none].
    #[arg(long, env = "KILN_PEERS")]
    pub peers: Option<String>,
    /// How long a query waits for a peer to take its connection, e.g. `2s`, apart from (and far shorter than) the query's deadline: a replica whose name still points at a dead pod's address swallows the connection, and the answer is then marked partial after this long, not after most of the query timeout; such an address is then skipped for 10 s [default: 2s].
    #[arg(long, env = "KILN_PEER_CONNECT_TIMEOUT")]
    pub peer_connect_timeout: Option<String>,
    /// How often the head is cut into a block, e.g. `60s`; bounds cross-replica staleness [default: 60s].
    #[arg(long, env = "KILN_FLUSH_INTERVAL")]
    pub flush_interval: Option<String>,
    /// How often the bucket is listed again to see other replicas' blocks [default: 15s].
    #[arg(long, env = "KILN_RELIST_INTERVAL")]
    pub relist_interval: Option<String>,
    /// How long blocks are kept, e.g. `14d` [default: 14d].
    #[arg(long, env = "KILN_RETENTION")]
    pub retention: Option<String>,
    /// How far past the store's clock a profile's time may be, e.g. `10m`;
    /// later (and older-than-retention) profiles are refused [default: 10m].
    #[arg(long, env = "KILN_MAX_FUTURE_SKEW")]
    pub max_future_skew: Option<String>,
    /// How long one query may run before it is stopped with an error, e.g. `30s` [default: 30s].
    #[arg(long, env = "KILN_QUERY_TIMEOUT")]
    pub query_timeout: Option<String>,
    /// Optional cap on the bucket's total block bytes; the oldest blocks go first.
    #[arg(long, env = "KILN_RETENTION_BYTES")]
    pub retention_bytes: Option<u64>,
    /// Memory the store may use, e.g. `1536Mi` or `2Gi` (plain bytes also
    /// work). Split over the head (1/8), the block cache (1/4), one
    /// compaction (1/4) and ingests being decoded (1/4); set it below the
    /// container's memory limit [default: 2Gi].
    #[arg(long, env = "KILN_MEMORY_BUDGET")]
    pub memory_budget: Option<String>,
    /// Shards of the in-memory head, 1 to 16: ingests bound for different
    /// shards apply in parallel, each shard holding its own copy of the
    /// symbols its workloads use; replicas of one workload (differing only
    /// in pod, node and the like) share a shard [default: the cores
    /// available, at most 8].
    #[arg(long, env = "KILN_HEAD_SHARDS")]
    pub head_shards: Option<usize>,
    /// How many writes decode or apply at once, 1 to 1024; the rest wait
    /// their turn, admitted up to `max_inflight`. More than the cores only
    /// holds more decoded profiles in memory [default: the cores available].
    #[arg(long, env = "KILN_INGEST_WORKERS")]
    pub ingest_workers: Option<usize>,
    /// How often compaction is planned, e.g. `5m` [default: 5m].
    #[arg(long, env = "KILN_COMPACTION_INTERVAL")]
    pub compaction_interval: Option<String>,
}
