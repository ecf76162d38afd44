//! `[limits]`: what one request, profile, profile name or namespace may
//! use, and how many requests run at once.

use serde::{Deserialize, Serialize};

/// `[limits]` in the file; flags and variables named on each field.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOptions {
    /// Largest request body or gRPC message, in bytes [default: 32 MiB].
    #[arg(long, env = "KILN_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<usize>,
    /// Most labels on one series [default: 48].
    #[arg(long, env = "KILN_MAX_LABELS_PER_SERIES")]
    pub max_labels_per_series: Option<usize>,
    /// Longest label name or value, in bytes [default: 2048].
    #[arg(long, env = "KILN_MAX_LABEL_BYTES")]
    pub max_label_bytes: Option<usize>,
    /// Most series per profile name that the store retains (head and
    /// blocks within retention) [default: 100000].
    #[arg(long, env = "KILN_MAX_SERIES_PER_PROFILE_NAME")]
    pub max_series_per_profile_name: Option<usize>,
    /// Most series per `namespace` label value that the store retains
    /// (head and blocks within retention; series without the label share
    /// a namespace); profiles that would add more are refused, existing
    /// series still ingest [default: 100000].
    #[arg(long, env = "KILN_MAX_SERIES_PER_NAMESPACE")]
    pub max_series_per_namespace: Option<usize>,
    /// Most series the store retains in all (head and blocks within
    /// retention); profiles that would add more are refused, existing
    /// series still ingest [default: 500000].
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
    /// Memory, in bytes, all queries in flight may hold together for their
    /// request bodies and what is parsed from them, reserved as the bytes
    /// arrive (a query that does not fit now gets 429); each running query
    /// may also hold its share of it (this over the queries running at
    /// once) in the profile it merges, past which it gets 413
    /// `query_too_large` [default: --memory-budget / 4].
    #[arg(long, env = "KILN_QUERY_MEMORY_BYTES")]
    pub query_memory_bytes: Option<usize>,
}
