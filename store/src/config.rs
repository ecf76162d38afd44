//! Configuration: flags (clap, each with a `KILN_*` environment variable)
//! over an optional TOML file over defaults. Layering, lowest first:
//! defaults < file < environment < command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

mod connections;
mod file;
mod units;

pub use connections::{ConnectionFlags, ConnectionLimits};
pub use file::{
    FileAuth, FileBucket, FileConfig, FileLimits, FileServer, FileStorage, parse_file_config,
    read_file_config,
};
pub use units::{parse_bytes, parse_duration};

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file cannot be read.
    #[error("cannot read config file {}: {source}", path.display())]
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
    /// The config file declares a schema version this build does not know.
    #[error("config file {}: version {version} is not supported (expected 1)", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// A value is out of its allowed range or inconsistent with another.
    #[error("invalid setting `{setting}`: {message}")]
    Invalid {
        /// The setting, as named in the file.
        setting: &'static str,
        /// What is wrong.
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
        }
    }
}

/// `kiln-store`: Kiln's profile store. Every flag can also be set through the
/// environment variable named in its help, or in the `--config` file.
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "kiln-store", version, about)]
pub struct Cli {
    /// TOML config file (lowest precedence after the built-in defaults).
    #[arg(long, env = "KILN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address serving gRPC and HTTP [default: 127.0.0.1:7470].
    #[arg(long, env = "KILN_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Optional separate address for `/metrics` (it is always on the main port too).
    #[arg(long, env = "KILN_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Local directory for the write-ahead log (and the bucket when it is local) [default: ./kiln-data].
    #[arg(long, env = "KILN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// This replica's name; replicas sharing a bucket need distinct names [default: $HOSTNAME or "kiln"].
    #[arg(long, env = "KILN_REPLICA")]
    pub replica: Option<String>,
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
    /// work). Split over the head (1/8), the block cache (1/4) and one
    /// compaction (1/4); set it below the container's memory limit
    /// [default: 2Gi].
    #[arg(long, env = "KILN_MEMORY_BUDGET")]
    pub memory_budget: Option<String>,
    /// How often compaction is planned, e.g. `5m` [default: 5m].
    #[arg(long, env = "KILN_COMPACTION_INTERVAL")]
    pub compaction_interval: Option<String>,
    /// Object storage: `local`, `s3`, `gcs` or `azure` [default: local].
    #[arg(long, env = "KILN_OBJECT_STORE")]
    pub object_store: Option<String>,
    /// Bucket (s3, gcs), container (azure) or directory (local) [default: <data-dir>/bucket].
    #[arg(long, env = "KILN_BUCKET")]
    pub bucket: Option<String>,
    /// Custom S3 endpoint, e.g. `http://127.0.0.1:9000`.
    #[arg(long, env = "KILN_BUCKET_ENDPOINT")]
    pub bucket_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, env = "KILN_BUCKET_REGION")]
    pub bucket_region: Option<String>,
    /// Path prefix inside the bucket, so several stores can share one bucket.
    #[arg(long, env = "KILN_BUCKET_PREFIX")]
    pub bucket_prefix: Option<String>,
    /// Allow a plain-HTTP bucket endpoint (S3-compatible test servers).
    #[arg(long, env = "KILN_BUCKET_ALLOW_HTTP")]
    pub bucket_allow_http: Option<bool>,
    /// Azure storage account.
    #[arg(long, env = "KILN_AZURE_ACCOUNT")]
    pub azure_account: Option<String>,
    /// Largest request body or gRPC message, in bytes [default: 32 MiB].
    #[arg(long, env = "KILN_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<usize>,
    /// Most labels on one series [default: 48].
    #[arg(long, env = "KILN_MAX_LABELS_PER_SERIES")]
    pub max_labels_per_series: Option<usize>,
    /// Longest label name or value, in bytes [default: 2048].
    #[arg(long, env = "KILN_MAX_LABEL_BYTES")]
    pub max_label_bytes: Option<usize>,
    /// Most series per profile name in the head [default: 100000].
    #[arg(long, env = "KILN_MAX_SERIES_PER_PROFILE_NAME")]
    pub max_series_per_profile_name: Option<usize>,
    /// Most series per `namespace` label value in the head (series without
    /// one share a namespace); profiles that would add more are refused,
    /// existing series still ingest [default: 100000].
    #[arg(long, env = "KILN_MAX_SERIES_PER_NAMESPACE")]
    pub max_series_per_namespace: Option<usize>,
    /// Most series in the head in all; profiles that would add more are
    /// refused, existing series still ingest [default: 500000].
    #[arg(long, env = "KILN_MAX_SERIES")]
    pub max_series: Option<usize>,
    /// Most samples in one profile [default: 1000000].
    #[arg(long, env = "KILN_MAX_SAMPLES_PER_PROFILE")]
    pub max_samples_per_profile: Option<usize>,
    /// Most profiles (raw samples) in one Push or WriteRaw request [default: 1024].
    #[arg(long, env = "KILN_MAX_PROFILES_PER_REQUEST")]
    pub max_profiles_per_request: Option<usize>,
    /// Ingest requests processed at once; more get 429 / RESOURCE_EXHAUSTED [default: 256].
    #[arg(long, env = "KILN_MAX_INFLIGHT")]
    pub max_inflight: Option<usize>,
    /// Queries processed at once, apart from ingest so neither can starve
    /// the other; more get 429 / RESOURCE_EXHAUSTED [default: --memory-budget
    /// / 32 MiB, between 4 and 256].
    #[arg(long, env = "KILN_MAX_INFLIGHT_QUERIES")]
    pub max_inflight_queries: Option<usize>,
    /// Connection limits of the main port.
    #[command(flatten)]
    pub connections: ConnectionFlags,
    /// Bearer tokens accepted for writes, comma separated (auth is off when none).
    #[arg(long, env = "KILN_WRITE_TOKENS", value_delimiter = ',')]
    pub write_tokens: Option<Vec<String>>,
    /// Bearer tokens accepted for queries, comma separated (auth is off when none).
    #[arg(long, env = "KILN_READ_TOKENS", value_delimiter = ',')]
    pub read_tokens: Option<Vec<String>>,
    /// Log filter, e.g. `info` or `kiln_store=debug` [default: info].
    #[arg(long, env = "KILN_LOG")]
    pub log: Option<String>,
}

/// Where blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectStoreKind {
    /// A local directory.
    Local,
    /// Amazon S3 or an S3-compatible service.
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage.
    Azure,
}

/// Bucket settings after layering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSettings {
    /// The backend.
    pub kind: ObjectStoreKind,
    /// Bucket, container or directory.
    pub name: String,
    /// Custom endpoint.
    pub endpoint: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Prefix inside the bucket.
    pub prefix: Option<String>,
    /// Allow plain HTTP.
    pub allow_http: bool,
    /// Azure account.
    pub azure_account: Option<String>,
}

/// Request limits after layering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest body / message in bytes.
    pub max_request_bytes: usize,
    /// Most labels per series.
    pub max_labels_per_series: usize,
    /// Longest label name or value.
    pub max_label_bytes: usize,
    /// Most series per profile name.
    pub max_series_per_profile_name: usize,
    /// Most series per namespace.
    pub max_series_per_namespace: usize,
    /// Most series in all.
    pub max_series: usize,
    /// Most samples per profile.
    pub max_samples_per_profile: usize,
    /// Most profiles in one Push or WriteRaw request.
    pub max_profiles_per_request: usize,
    /// Ingest requests in flight.
    pub max_inflight: usize,
    /// Queries in flight.
    pub max_inflight_queries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_bytes: 32 << 20,
            max_labels_per_series: 48,
            max_label_bytes: 2048,
            max_series_per_profile_name: 100_000,
            max_series_per_namespace: 100_000,
            max_series: 500_000,
            max_samples_per_profile: 1_000_000,
            max_profiles_per_request: 1024,
            max_inflight: 256,
            // What the default 2 GiB memory budget derives.
            max_inflight_queries: 64,
        }
    }
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
    /// Object storage.
    pub bucket: BucketSettings,
    /// Limits.
    pub limits: Limits,
    /// Connection limits of the main port.
    pub connections: ConnectionLimits,
    /// Tokens for writes (empty: no auth).
    pub write_tokens: Vec<String>,
    /// Tokens for reads (empty: no auth).
    pub read_tokens: Vec<String>,
    /// Log filter.
    pub log: String,
}

impl Config {
    /// Layers `cli` (flags and environment, as clap resolved them) over the
    /// file it names (if any) over the defaults.
    pub fn load(cli: &Cli) -> Result<Self, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file_config(path)?,
            None => FileConfig::default(),
        };
        Self::layer(cli, &file, std::env::var("HOSTNAME").ok())
    }

    /// Pure layering, for tests: `hostname` is the default replica name.
    pub fn layer(
        cli: &Cli,
        file: &FileConfig,
        hostname: Option<String>,
    ) -> Result<Self, ConfigError> {
        let defaults = Limits::default();
        let data_dir = cli
            .data_dir
            .clone()
            .or_else(|| file.storage.data_dir.clone())
            .unwrap_or_else(|| PathBuf::from("kiln-data"));
        let kind_text = cli
            .object_store
            .clone()
            .or_else(|| file.bucket.kind.clone())
            .unwrap_or_else(|| "local".to_owned());
        let kind = match kind_text.as_str() {
            "local" | "file" | "filesystem" => ObjectStoreKind::Local,
            "s3" => ObjectStoreKind::S3,
            "gcs" => ObjectStoreKind::Gcs,
            "azure" => ObjectStoreKind::Azure,
            other => {
                return Err(ConfigError::Invalid {
                    setting: "bucket.kind",
                    message: format!("{other:?} is not one of local, s3, gcs, azure"),
                });
            }
        };
        let bucket_name = cli.bucket.clone().or_else(|| file.bucket.name.clone());
        let bucket_name = match (&kind, bucket_name) {
            (_, Some(name)) if !name.is_empty() => name,
            (ObjectStoreKind::Local, _) => data_dir.join("bucket").display().to_string(),
            _ => {
                return Err(ConfigError::Invalid {
                    setting: "bucket.name",
                    message: format!("object store {kind_text} needs a bucket name (--bucket)"),
                });
            }
        };
        let azure_account = cli
            .azure_account
            .clone()
            .or_else(|| file.bucket.azure_account.clone());
        if kind == ObjectStoreKind::Azure && azure_account.is_none() {
            return Err(ConfigError::Invalid {
                setting: "bucket.azure_account",
                message: "azure needs an account (--azure-account)".to_owned(),
            });
        }
        let duration =
            |setting: &'static str, cli: &Option<String>, file: &Option<String>, default: &str| {
                let text = cli
                    .clone()
                    .or_else(|| file.clone())
                    .unwrap_or_else(|| default.to_owned());
                parse_duration(&text).map_err(|message| ConfigError::Invalid { setting, message })
            };
        let flush_interval = duration(
            "storage.flush_interval",
            &cli.flush_interval,
            &file.storage.flush_interval,
            "60s",
        )?;
        if flush_interval < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                setting: "storage.flush_interval",
                message: "must be at least 1s".to_owned(),
            });
        }
        let relist_interval = duration(
            "storage.relist_interval",
            &cli.relist_interval,
            &file.storage.relist_interval,
            "15s",
        )?;
        if relist_interval.is_zero() {
            return Err(ConfigError::Invalid {
                setting: "storage.relist_interval",
                message: "must be greater than 0".to_owned(),
            });
        }
        let retention = duration(
            "storage.retention",
            &cli.retention,
            &file.storage.retention,
            "14d",
        )?;
        let max_future_skew = duration(
            "storage.max_future_skew",
            &cli.max_future_skew,
            &file.storage.max_future_skew,
            "10m",
        )?;
        let query_timeout = duration(
            "storage.query_timeout",
            &cli.query_timeout,
            &file.storage.query_timeout,
            "30s",
        )?;
        if query_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                setting: "storage.query_timeout",
                message: "must be greater than 0".to_owned(),
            });
        }
        let compaction_interval = duration(
            "storage.compaction_interval",
            &cli.compaction_interval,
            &file.storage.compaction_interval,
            "5m",
        )?;
        if compaction_interval.is_zero() {
            return Err(ConfigError::Invalid {
                setting: "storage.compaction_interval",
                message: "must be greater than 0".to_owned(),
            });
        }
        let memory_budget = parse_bytes(
            cli.memory_budget
                .as_deref()
                .or(file.storage.memory_budget.as_deref())
                .unwrap_or("2Gi"),
        )
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
        let pick =
            |cli: Option<usize>, file: Option<usize>, default: usize, setting: &'static str| {
                let value = cli.or(file).unwrap_or(default);
                if value == 0 {
                    Err(ConfigError::Invalid {
                        setting,
                        message: "must be greater than 0".to_owned(),
                    })
                } else {
                    Ok(value)
                }
            };
        let limits = Limits {
            max_request_bytes: pick(
                cli.max_request_bytes,
                file.limits.max_request_bytes,
                defaults.max_request_bytes,
                "limits.max_request_bytes",
            )?,
            max_labels_per_series: pick(
                cli.max_labels_per_series,
                file.limits.max_labels_per_series,
                defaults.max_labels_per_series,
                "limits.max_labels_per_series",
            )?,
            max_label_bytes: pick(
                cli.max_label_bytes,
                file.limits.max_label_bytes,
                defaults.max_label_bytes,
                "limits.max_label_bytes",
            )?,
            max_series_per_profile_name: pick(
                cli.max_series_per_profile_name,
                file.limits.max_series_per_profile_name,
                defaults.max_series_per_profile_name,
                "limits.max_series_per_profile_name",
            )?,
            max_series_per_namespace: pick(
                cli.max_series_per_namespace,
                file.limits.max_series_per_namespace,
                defaults.max_series_per_namespace,
                "limits.max_series_per_namespace",
            )?,
            max_series: pick(
                cli.max_series,
                file.limits.max_series,
                defaults.max_series,
                "limits.max_series",
            )?,
            max_samples_per_profile: pick(
                cli.max_samples_per_profile,
                file.limits.max_samples_per_profile,
                defaults.max_samples_per_profile,
                "limits.max_samples_per_profile",
            )?,
            max_profiles_per_request: pick(
                cli.max_profiles_per_request,
                file.limits.max_profiles_per_request,
                defaults.max_profiles_per_request,
                "limits.max_profiles_per_request",
            )?,
            max_inflight: pick(
                cli.max_inflight,
                file.limits.max_inflight,
                defaults.max_inflight,
                "limits.max_inflight",
            )?,
            max_inflight_queries: pick(
                cli.max_inflight_queries,
                file.limits.max_inflight_queries,
                default_query_slots(memory_budget),
                "limits.max_inflight_queries",
            )?,
        };
        let connections = ConnectionLimits::layer(&cli.connections, &file.server, memory_budget)?;
        let tokens = |cli: &Option<Vec<String>>, file: &Option<Vec<String>>| -> Vec<String> {
            cli.clone()
                .or_else(|| file.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect()
        };
        let replica = cli
            .replica
            .clone()
            .or_else(|| file.storage.replica.clone())
            .or(hostname)
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "kiln".to_owned());
        Ok(Self {
            listen: cli
                .listen
                .or(file.server.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7470))),
            metrics_listen: cli.metrics_listen.or(file.server.metrics_listen),
            data_dir,
            replica,
            flush_interval,
            relist_interval,
            retention,
            max_future_skew,
            query_timeout,
            retention_bytes: cli.retention_bytes.or(file.storage.retention_bytes),
            memory_budget,
            compaction_interval,
            bucket: BucketSettings {
                kind,
                name: bucket_name,
                endpoint: cli
                    .bucket_endpoint
                    .clone()
                    .or_else(|| file.bucket.endpoint.clone()),
                region: cli
                    .bucket_region
                    .clone()
                    .or_else(|| file.bucket.region.clone()),
                prefix: cli
                    .bucket_prefix
                    .clone()
                    .or_else(|| file.bucket.prefix.clone())
                    .filter(|p| !p.trim_matches('/').is_empty()),
                allow_http: cli
                    .bucket_allow_http
                    .or(file.bucket.allow_http)
                    .unwrap_or(false),
                azure_account,
            },
            limits,
            connections,
            write_tokens: tokens(&cli.write_tokens, &file.auth.write_tokens),
            read_tokens: tokens(&cli.read_tokens, &file.auth.read_tokens),
            log: cli
                .log
                .clone()
                .or_else(|| file.server.log.clone())
                .unwrap_or_else(|| "info".to_owned()),
        })
    }
}

/// Below this the head would be cut every few profiles.
const MIN_MEMORY_BUDGET: u64 = 64 << 20;

/// Queries in flight by default: one per 32 MiB of the memory budget.
/// Query scratch has no byte reservation of its own; it shares the budget's
/// last eighth with the runtime, and one query with a heavy `=~` pattern
/// can hold a few MiB of compiled regex and DFA cache (audit R8).
fn default_query_slots(memory_budget: u64) -> usize {
    usize::try_from(memory_budget >> 25)
        .unwrap_or(usize::MAX)
        .clamp(4, 256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::path::Path;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_reads_a_kiln_environment_variable() {
        for arg in Cli::command().get_arguments() {
            if matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert!(
                env.as_deref().is_some_and(|e| e.starts_with("KILN_")),
                "--{} has no KILN_ environment variable",
                arg.get_id()
            );
        }
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let config = Config::layer(&Cli::default(), &FileConfig::default(), None).unwrap();
        assert_eq!(config.listen, SocketAddr::from(([127, 0, 0, 1], 7470)));
        assert_eq!(config.flush_interval, Duration::from_secs(60));
        assert_eq!(config.max_future_skew, Duration::from_secs(600));
        assert_eq!(config.query_timeout, Duration::from_secs(30));
        assert_eq!(config.bucket.kind, ObjectStoreKind::Local);
        assert_eq!(config.limits, Limits::default());
        assert_eq!(config.connections, ConnectionLimits::default());
        assert_eq!(config.bucket.name, "kiln-data/bucket");
        assert_eq!(config.replica, "kiln");
        assert!(config.write_tokens.is_empty());
    }

    #[test]
    fn file_overrides_defaults_and_cli_overrides_file() {
        let file = parse_file_config(
            r#"
version = 1
[server]
listen = "0.0.0.0:9000"
[storage]
flush_interval = "15s"
replica = "from-file"
[bucket]
kind = "s3"
name = "profiles"
endpoint = "http://127.0.0.1:5000"
allow_http = true
[limits]
max_inflight = 8
[auth]
write_tokens = ["w1"]
"#,
            Path::new("kiln.toml"),
        )
        .unwrap();
        let cli = Cli::try_parse_from([
            "kiln-store",
            "--replica",
            "from-cli",
            "--max-inflight",
            "16",
        ])
        .unwrap();
        let config = Config::layer(&cli, &file, Some("host".into())).unwrap();
        assert_eq!(config.listen, SocketAddr::from(([0, 0, 0, 0], 9000)));
        assert_eq!(config.flush_interval, Duration::from_secs(15));
        assert_eq!(config.replica, "from-cli");
        assert_eq!(config.limits.max_inflight, 16);
        assert_eq!(config.bucket.kind, ObjectStoreKind::S3);
        assert!(config.bucket.allow_http);
        assert_eq!(config.write_tokens, ["w1"]);
    }

    #[test]
    fn unknown_keys_and_versions_in_the_file_are_refused() {
        let err =
            parse_file_config("version = 1\nlisten = \"x\"\n", Path::new("k.toml")).unwrap_err();
        assert!(err.to_string().contains("unknown field `listen`"), "{err}");
        let err = parse_file_config("version = 2\n", Path::new("k.toml")).unwrap_err();
        assert_eq!(err.reason(), "config_version");
        let err = parse_file_config("[server]\n", Path::new("k.toml")).unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
    }

    #[test]
    fn bad_values_name_the_setting() {
        let cli = Cli::try_parse_from(["kiln-store", "--object-store", "s3"]).unwrap();
        let err = Config::layer(&cli, &FileConfig::default(), None).unwrap_err();
        assert!(err.to_string().contains("bucket.name"), "{err}");
        let cli = Cli::try_parse_from(["kiln-store", "--flush-interval", "fast"]).unwrap();
        let err = Config::layer(&cli, &FileConfig::default(), None).unwrap_err();
        assert!(err.to_string().contains("storage.flush_interval"), "{err}");
        let cli = Cli::try_parse_from(["kiln-store", "--max-inflight", "0"]).unwrap();
        assert!(Config::layer(&cli, &FileConfig::default(), None).is_err());
    }

    #[test]
    fn memory_budget_parses_quantities_and_refuses_tiny_or_bad_values() {
        let config = Config::layer(&Cli::default(), &FileConfig::default(), None).unwrap();
        assert_eq!(config.memory_budget, 2 << 30);
        assert_eq!(config.compaction_interval, Duration::from_secs(300));
        let cli = Cli::try_parse_from(["kiln-store", "--memory-budget", "1536Mi"]).unwrap();
        let config = Config::layer(&cli, &FileConfig::default(), None).unwrap();
        assert_eq!(config.memory_budget, 1536 << 20);
        assert_eq!(config.limits.max_inflight_queries, 48, "one per 32 MiB");
        assert_eq!(config.connections.max_connections, 3072, "one per 512 KiB");
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert!(parse_bytes("2G").is_err());
        for bad in ["1Mi", "lots"] {
            let cli = Cli::try_parse_from(["kiln-store", "--memory-budget", bad]).unwrap();
            let err = Config::layer(&cli, &FileConfig::default(), None).unwrap_err();
            assert!(err.to_string().contains("storage.memory_budget"), "{err}");
        }
    }
}
