//! The TOML config file: its schema (every field optional, `version = 1`
//! required) and reading it. Layering over flags and defaults is in the
//! parent module.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::ConfigError;

/// The config file. Every field is optional; `version = 1` is required.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Schema version; must be 1.
    pub version: u32,
    /// `[server]`.
    #[serde(default)]
    pub server: FileServer,
    /// `[storage]`.
    #[serde(default)]
    pub storage: FileStorage,
    /// `[bucket]`.
    #[serde(default)]
    pub bucket: FileBucket,
    /// `[limits]`.
    #[serde(default)]
    pub limits: FileLimits,
    /// `[auth]`.
    #[serde(default)]
    pub auth: FileAuth,
}

/// `[server]` in the config file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileServer {
    /// See `--listen`.
    pub listen: Option<SocketAddr>,
    /// See `--metrics-listen`.
    pub metrics_listen: Option<SocketAddr>,
    /// See `--log`.
    pub log: Option<String>,
    /// See `--max-connections`.
    pub max_connections: Option<usize>,
    /// See `--header-read-timeout`.
    pub header_read_timeout: Option<String>,
    /// See `--body-read-timeout`.
    pub body_read_timeout: Option<String>,
    /// See `--idle-timeout`.
    pub idle_timeout: Option<String>,
}

/// `[storage]` in the config file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileStorage {
    /// See `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// See `--replica`.
    pub replica: Option<String>,
    /// See `--flush-interval`.
    pub flush_interval: Option<String>,
    /// See `--relist-interval`.
    pub relist_interval: Option<String>,
    /// See `--retention`.
    pub retention: Option<String>,
    /// See `--max-future-skew`.
    pub max_future_skew: Option<String>,
    /// See `--query-timeout`.
    pub query_timeout: Option<String>,
    /// See `--retention-bytes`.
    pub retention_bytes: Option<u64>,
    /// See `--memory-budget`.
    pub memory_budget: Option<String>,
    /// See `--compaction-interval`.
    pub compaction_interval: Option<String>,
}

/// `[bucket]` in the config file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBucket {
    /// See `--object-store`.
    pub kind: Option<String>,
    /// See `--bucket`.
    pub name: Option<String>,
    /// See `--bucket-endpoint`.
    pub endpoint: Option<String>,
    /// See `--bucket-region`.
    pub region: Option<String>,
    /// See `--bucket-prefix`.
    pub prefix: Option<String>,
    /// See `--bucket-allow-http`.
    pub allow_http: Option<bool>,
    /// See `--azure-account`.
    pub azure_account: Option<String>,
}

/// `[limits]` in the config file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    /// See `--max-request-bytes`.
    pub max_request_bytes: Option<usize>,
    /// See `--max-labels-per-series`.
    pub max_labels_per_series: Option<usize>,
    /// See `--max-label-bytes`.
    pub max_label_bytes: Option<usize>,
    /// See `--max-series-per-profile-name`.
    pub max_series_per_profile_name: Option<usize>,
    /// See `--max-series-per-namespace`.
    pub max_series_per_namespace: Option<usize>,
    /// See `--max-series`.
    pub max_series: Option<usize>,
    /// See `--max-samples-per-profile`.
    pub max_samples_per_profile: Option<usize>,
    /// See `--max-profiles-per-request`.
    pub max_profiles_per_request: Option<usize>,
    /// See `--max-inflight`.
    pub max_inflight: Option<usize>,
    /// See `--max-inflight-queries`.
    pub max_inflight_queries: Option<usize>,
}

/// `[auth]` in the config file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuth {
    /// See `--write-tokens`.
    pub write_tokens: Option<Vec<String>>,
    /// See `--read-tokens`.
    pub read_tokens: Option<Vec<String>>,
}

/// Reads and checks a TOML config file.
pub fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file_config(&text, path)
}

/// Parses config file text; `path` is only used in errors.
pub fn parse_file_config(text: &str, path: &Path) -> Result<FileConfig, ConfigError> {
    let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim().to_owned(),
    })?;
    if file.version != 1 {
        return Err(ConfigError::Version {
            path: path.to_owned(),
            version: file.version,
        });
    }
    Ok(file)
}
