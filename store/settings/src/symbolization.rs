//! `[symbolization]`: naming frames that arrive without function names
//! (build id and address only) at query time, from uploaded debug info
//! and debuginfod servers.

use serde::{Deserialize, Serialize};

/// `[symbolization]` in the file; flags and variables named on each field.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SymbolizationOptions {
    /// debuginfod servers asked, in order, for the debug info of build ids no upload covers, e.g. `https://debuginfod.debian.net` (comma- or space-separated; empty asks none) [default: none].
    #[arg(long, env = "KILN_DEBUGINFOD_URLS")]
    pub debuginfod_urls: Option<String>,
    /// Largest debug file taken, by upload or from debuginfod, e.g. `512Mi`; one file is read at a time [default: 512Mi].
    #[arg(long, env = "KILN_DEBUGINFO_MAX_BYTES")]
    pub debuginfo_max_bytes: Option<String>,
    /// Take debug files uploaded to `POST /api/v1/debuginfo` (`kiln debuginfo upload`); `false` answers every upload 403, so only debuginfod names frames [default: true].
    #[arg(long, env = "KILN_DEBUGINFO_UPLOADS")]
    pub debuginfo_uploads: Option<bool>,
    /// How long one debuginfod request may take, body included [default: 60s].
    #[arg(long, env = "KILN_DEBUGINFOD_TIMEOUT")]
    pub debuginfod_timeout: Option<String>,
    /// Bytes of resolved addresses the symbol cache keeps, in memory and in the bucket (`symbol-cache/<replica>`) [default: 64Mi].
    #[arg(long, env = "KILN_SYMBOL_CACHE_BYTES")]
    pub symbol_cache_bytes: Option<String>,
    /// How long a query waits for symbols being fetched before it answers with module+offset names, marked `Kiln-Partial: symbols_pending=<n>` [default: 3s].
    #[arg(long, env = "KILN_SYMBOLIZATION_WAIT")]
    pub symbolization_wait: Option<String>,
    /// How long a build id found nowhere is not looked up again [default: 1h].
    #[arg(long, env = "KILN_SYMBOL_MISS_RETRY")]
    pub symbol_miss_retry: Option<String>,
}
