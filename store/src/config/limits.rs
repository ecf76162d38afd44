//! What one request, profile, profile name or namespace may use: `[limits]`
//! resolved.

use kiln_store_settings::LimitOptions;

use super::ConfigError;

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
    /// Memory all queries in flight may hold for their bodies.
    pub query_memory_bytes: usize,
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
            // What the default 2 GiB memory budget derives.
            query_memory_bytes: 512 << 20,
        }
    }
}

/// Blocking-pool threads kept for everything but admitted writes (queries,
/// decoding, file IO): tokio's own default for the whole pool.
pub const BLOCKING_THREADS_BESIDE_WRITES: usize = 512;

impl Limits {
    /// Threads the runtime's blocking pool may start. An admitted write
    /// holds its pool thread while it waits for its WAL fsync, so with
    /// tokio's default of 512 in all, a `max_inflight` near 512 would leave
    /// queries no thread to run on. Every write in flight gets a thread of
    /// its own on top of the default.
    pub fn blocking_threads(&self) -> usize {
        BLOCKING_THREADS_BESIDE_WRITES.saturating_add(self.max_inflight)
    }

    /// Defaults applied (the query slots follow `memory_budget`); every
    /// limit must be greater than zero.
    pub fn resolve(options: &LimitOptions, memory_budget: u64) -> Result<Self, ConfigError> {
        let defaults = Self::default();
        let pick = |value: Option<usize>, default: usize, setting: &'static str| {
            let value = value.unwrap_or(default);
            if value == 0 {
                return Err(ConfigError::Invalid {
                    setting,
                    message: "must be greater than 0".to_owned(),
                });
            }
            Ok(value)
        };
        Ok(Self {
            max_request_bytes: pick(
                options.max_request_bytes,
                defaults.max_request_bytes,
                "limits.max_request_bytes",
            )?,
            max_labels_per_series: pick(
                options.max_labels_per_series,
                defaults.max_labels_per_series,
                "limits.max_labels_per_series",
            )?,
            max_label_bytes: pick(
                options.max_label_bytes,
                defaults.max_label_bytes,
                "limits.max_label_bytes",
            )?,
            max_series_per_profile_name: pick(
                options.max_series_per_profile_name,
                defaults.max_series_per_profile_name,
                "limits.max_series_per_profile_name",
            )?,
            max_series_per_namespace: pick(
                options.max_series_per_namespace,
                defaults.max_series_per_namespace,
                "limits.max_series_per_namespace",
            )?,
            max_series: pick(options.max_series, defaults.max_series, "limits.max_series")?,
            max_samples_per_profile: pick(
                options.max_samples_per_profile,
                defaults.max_samples_per_profile,
                "limits.max_samples_per_profile",
            )?,
            max_profiles_per_request: pick(
                options.max_profiles_per_request,
                defaults.max_profiles_per_request,
                "limits.max_profiles_per_request",
            )?,
            max_inflight: pick(
                options.max_inflight,
                defaults.max_inflight,
                "limits.max_inflight",
            )?,
            max_inflight_queries: pick(
                options.max_inflight_queries,
                default_query_slots(memory_budget),
                "limits.max_inflight_queries",
            )?,
            query_memory_bytes: pick(
                options.query_memory_bytes,
                default_query_memory(memory_budget),
                "limits.query_memory_bytes",
            )?,
        })
    }
}

/// Queries in flight by default: one per 32 MiB of the memory budget.
/// Query scratch has no byte reservation of its own; it shares the budget's
/// last eighth with the runtime, and one query with a heavy `=~` pattern
/// can hold a few MiB of compiled regex and DFA cache, so the slots bound
/// what many heavy queries at once can take.
fn default_query_slots(memory_budget: u64) -> usize {
    usize::try_from(memory_budget >> 25)
        .unwrap_or(usize::MAX)
        .clamp(4, 256)
}

/// Query memory by default: the quarter of the memory budget that the store
/// gives queries (`StoreConfig::apply_memory_budget`), at least room for a
/// few of the largest query bodies.
fn default_query_memory(memory_budget: u64) -> usize {
    usize::try_from(memory_budget / 4)
        .unwrap_or(usize::MAX)
        .max(4 << 20)
}
