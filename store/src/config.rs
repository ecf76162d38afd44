//! Configuration: the settings of [`kiln_store_settings::StoreSettings`] (each
//! one a flag, a `KILN_*` environment variable and a key of the TOML file),
//! layered and checked into the [`Config`] the server runs with. Layering,
//! lowest first: defaults < file < environment < flags.
//!
//! `load` is the IO edge (the file, the token variables and token files);
//! `Config::resolve` is pure: defaults applied, values parsed and checked,
//! each error naming the setting as the file spells it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::FromArgMatches as _;
pub use kiln_store_settings::StoreSettings;

mod bucket;
mod connections;
mod file;
mod limits;
mod recording;
mod symbolization;
#[cfg(test)]
mod tests;
mod tokens;
mod units;

pub use bucket::{BucketSettings, ObjectStoreKind};
pub use connections::ConnectionLimits;
pub use file::{parse_file_settings, read_file_settings};
pub use limits::{BLOCKING_THREADS_BESIDE_WRITES, Limits};
pub use recording::{RecordingSettings, compile_rules};
pub use symbolization::SymbolizationSettings;
pub use tokens::{NamespaceToken, read_token_files};
pub use units::{parse_bytes, parse_duration};

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file or a token file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML for this schema.
    #[error("config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said (includes line and column).
        message: String,
    },
    /// The config file declares a schema version this build does not know,
    /// or none.
    #[error("config file {}: version {} is not supported (expected `version = 1`)",
        path.display(), version.map_or_else(|| "(missing)".to_owned(), |v| v.to_string()))]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found, if any.
        version: Option<u32>,
    },
    /// A value is out of its allowed range or inconsistent with another.
    #[error("invalid setting `{setting}`: {message}")]
    Invalid {
        /// The setting, as named in the file.
        setting: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The flags and variables clap parsed do not fit the settings type
    /// (a clap definition out of step with the fields).
    #[error("command line: {message}")]
    Arguments {
        /// What clap said.
        message: String,
    },
}

impl ConfigError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Read { .. } => "config_read",
            Self::Parse { .. } => "config_parse",
            Self::Version { .. } => "config_version",
            Self::Invalid { .. } => "config_invalid",
            Self::Arguments { .. } => "config_arguments",
        }
    }
}

/// Another replica of this store, as `--peers` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddress {
    /// Its replica name.
    pub name: String,
    /// Its `host:port` (plain HTTP: replicas talk inside the cluster).
    pub authority: String,
}

/// The `name=http://host:port` list, without `own` (the operator gives
/// every replica the same list).
fn peer_addresses(list: Option<&str>, own: &str) -> Result<Vec<PeerAddress>, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        setting: "storage.peers",
        message,
    };
    let mut peers: Vec<PeerAddress> = Vec::new();
    for entry in list.unwrap_or("").split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        let (name, url) = entry
            .split_once('=')
            .ok_or_else(|| invalid(format!("{entry:?} is not `name=http://host:port`")))?;
        let authority = url
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|a| !a.is_empty() && !a.contains('/') && !a.contains('@'))
            .ok_or_else(|| invalid(format!("{url:?} is not `http://host:port`")))?;
        if authority
            .rsplit_once(':')
            .is_none_or(|(_, port)| port.parse::<u16>().is_err())
        {
            return Err(invalid(format!("{url:?} names no port")));
        }
        if name.is_empty() || peers.iter().any(|p| p.name == name) {
            return Err(invalid(format!(
                "replica names must be set and distinct: {name:?}"
            )));
        }
        if name != own {
            peers.push(PeerAddress {
                name: name.to_owned(),
                authority: authority.to_owned(),
            });
        }
    }
    Ok(peers)
}

/// The validated configuration the server runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Main address.
    pub listen: SocketAddr,
    /// Extra metrics address.
    pub metrics_listen: Option<SocketAddr>,
    /// Local data directory.
    pub data_dir: PathBuf,
    /// Replica name.
    pub replica: String,
    /// The store's name, claimed in the bucket prefix.
    pub store_name: Option<String>,
    /// The other replicas, asked for their unflushed data by every query.
    pub peers: Vec<PeerAddress>,
    /// How long a query waits for a peer to take its connection.
    pub peer_connect_timeout: Duration,
    /// Head cut interval.
    pub flush_interval: Duration,
    /// Bucket re-listing interval.
    pub relist_interval: Duration,
    /// Block retention.
    pub retention: Duration,
    /// How far ahead of now a profile's time may be.
    pub max_future_skew: Duration,
    /// Deadline of one query.
    pub query_timeout: Duration,
    /// Optional total size cap.
    pub retention_bytes: Option<u64>,
    /// Memory the store's configurable parts are sized from.
    pub memory_budget: u64,
    /// Compaction planning interval.
    pub compaction_interval: Duration,
    /// Shards of the live head (`None`: the store's default, from the cores).
    pub head_shards: Option<usize>,
    /// Writes decoding or applying at once (`None`: the store's default,
    /// the cores).
    pub ingest_workers: Option<usize>,
    /// Object storage.
    pub bucket: BucketSettings,
    /// Limits.
    pub limits: Limits,
    /// Connection limits of the main port.
    pub connections: ConnectionLimits,
    /// Tokens for writes to any namespace (with `namespace_write_tokens`
    /// empty too: no auth for writes).
    pub write_tokens: Vec<String>,
    /// Tokens for writes to some namespaces only.
    pub namespace_write_tokens: Vec<NamespaceToken>,
    /// Tokens for reads (empty: no auth).
    pub read_tokens: Vec<String>,
    /// Log filter.
    pub log: String,
    /// Recording rules and their series' retention.
    pub recording: RecordingSettings,
    /// Naming frames sent without function names, at query time.
    pub symbolization: SymbolizationSettings,
}

/// More head shards than this only repeat the symbols in memory.
const MAX_HEAD_SHARDS: usize = 16;

/// A bound on a typo, not on any machine's cores.
const MAX_INGEST_WORKERS: usize = 1024;

/// Below this the head would be cut every few profiles.
const MIN_MEMORY_BUDGET: u64 = 64 << 20;

impl Config {
    /// Reads the file `--config` names (if any), lays the flags and
    /// variables clap parsed into `matches` over it, then the token
    /// variables and token files, and resolves the result.
    pub fn load(matches: &clap::ArgMatches) -> Result<Self, ConfigError> {
        let flags =
            StoreSettings::from_arg_matches(matches).map_err(|error| ConfigError::Arguments {
                message: error.to_string(),
            })?;
        let mut settings = match &flags.config {
            Some(path) => read_file_settings(path)?,
            None => StoreSettings::default(),
        };
        // Only what was given on the command line or in the environment
        // replaces what the file says.
        clap::FromArgMatches::update_from_arg_matches(&mut settings, matches).map_err(|error| {
            ConfigError::Arguments {
                message: error.to_string(),
            }
        })?;
        settings
            .auth
            .overlay_environment(|name| std::env::var(name).ok());
        read_token_files(&mut settings.auth, |path: &Path| {
            std::fs::read_to_string(path)
        })?;
        Self::resolve(&settings, std::env::var("HOSTNAME").ok())
    }

    /// Pure: applies the defaults to `settings` and checks every value;
    /// `hostname` is the default replica name. Token files must already
    /// have been read into the lists ([`read_token_files`]).
    pub fn resolve(
        settings: &StoreSettings,
        hostname: Option<String>,
    ) -> Result<Self, ConfigError> {
        let server = &settings.server;
        let storage = &settings.storage;
        let data_dir = storage
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("kiln-data"));
        let flush_interval = duration(
            "storage.flush_interval",
            storage.flush_interval.as_deref(),
            "60s",
        )?;
        if flush_interval < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                setting: "storage.flush_interval",
                message: "must be at least 1s".to_owned(),
            });
        }
        let memory_budget = parse_bytes(storage.memory_budget.as_deref().unwrap_or("2Gi"))
            .map_err(|message| ConfigError::Invalid {
                setting: "storage.memory_budget",
                message,
            })?;
        if memory_budget < MIN_MEMORY_BUDGET {
            return Err(ConfigError::Invalid {
                setting: "storage.memory_budget",
                message: format!("must be at least {}Mi", MIN_MEMORY_BUDGET >> 20),
            });
        }
        if let Some(shards) = storage.head_shards
            && !(1..=MAX_HEAD_SHARDS).contains(&shards)
        {
            return Err(ConfigError::Invalid {
                setting: "storage.head_shards",
                message: format!("must be 1 to {MAX_HEAD_SHARDS}, not {shards}"),
            });
        }
        if let Some(workers) = storage.ingest_workers
            && !(1..=MAX_INGEST_WORKERS).contains(&workers)
        {
            return Err(ConfigError::Invalid {
                setting: "storage.ingest_workers",
                message: format!("must be 1 to {MAX_INGEST_WORKERS}, not {workers}"),
            });
        }
        let replica = storage
            .replica
            .clone()
            .or(hostname)
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "kiln".to_owned());
        let peers = peer_addresses(storage.peers.as_deref(), &replica)?;
        Ok(Self {
            listen: server
                .listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7470))),
            metrics_listen: server.metrics_listen,
            bucket: BucketSettings::resolve(&settings.bucket, &data_dir)?,
            data_dir,
            replica,
            store_name: storage.store_name.clone().filter(|n| !n.is_empty()),
            peers,
            peer_connect_timeout: positive_duration(
                "storage.peer_connect_timeout",
                storage.peer_connect_timeout.as_deref(),
                "2s",
            )?,
            flush_interval,
            relist_interval: positive_duration(
                "storage.relist_interval",
                storage.relist_interval.as_deref(),
                "15s",
            )?,
            retention: duration("storage.retention", storage.retention.as_deref(), "14d")?,
            max_future_skew: duration(
                "storage.max_future_skew",
                storage.max_future_skew.as_deref(),
                "10m",
            )?,
            query_timeout: positive_duration(
                "storage.query_timeout",
                storage.query_timeout.as_deref(),
                "30s",
            )?,
            retention_bytes: storage.retention_bytes,
            memory_budget,
            compaction_interval: positive_duration(
                "storage.compaction_interval",
                storage.compaction_interval.as_deref(),
                "5m",
            )?,
            head_shards: storage.head_shards,
            ingest_workers: storage.ingest_workers,
            limits: Limits::resolve(&settings.limits, memory_budget)?,
            connections: ConnectionLimits::resolve(server, memory_budget)?,
            namespace_write_tokens: tokens::namespace_tokens(
                settings.auth.namespace_write_tokens.as_deref(),
                &tokens::trimmed(settings.auth.write_tokens.as_deref()),
            )?,
            write_tokens: tokens::trimmed(settings.auth.write_tokens.as_deref()),
            read_tokens: tokens::trimmed(settings.auth.read_tokens.as_deref()),
            log: server.log.clone().unwrap_or_else(|| "info".to_owned()),
            recording: RecordingSettings::resolve(&settings.recording)?,
            symbolization: SymbolizationSettings::resolve(&settings.symbolization)?,
        })
    }
}

/// `value` (or `default`) as a duration; errors name `setting`.
fn duration(
    setting: &'static str,
    value: Option<&str>,
    default: &str,
) -> Result<Duration, ConfigError> {
    parse_duration(value.unwrap_or(default))
        .map_err(|message| ConfigError::Invalid { setting, message })
}

/// Like [`duration`], and zero is refused.
fn positive_duration(
    setting: &'static str,
    value: Option<&str>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let parsed = duration(setting, value, default)?;
    if parsed.is_zero() {
        return Err(ConfigError::Invalid {
            setting,
            message: "must be greater than 0".to_owned(),
        });
    }
    Ok(parsed)
}
