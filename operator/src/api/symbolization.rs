//! `ProfileStore.spec.symbolization`: where the store finds debug info to name frames that
//! arrive as a build id and an address (stripped binaries, the OpenTelemetry eBPF profiler,
//! Parca Agent), and how much it keeps. The operator relays each field to the store's own flag
//! of the same meaning (`--debuginfod-urls`, `--debuginfo-uploads`, `--debuginfo-max-bytes`,
//! `--symbol-cache-bytes`); unset fields keep the store's defaults.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::profile_store::QUANTITY_PATTERN;

/// A debuginfod base URL: `http://` or `https://`, a host, an optional path. No spaces or
/// commas, which the store's `--debuginfod-urls` splits on.
pub const DEBUGINFOD_URL_PATTERN: &str = r"^https?://[^\s,/?#]+(/[^\s,?#]*)?$";
/// Most debuginfod servers one store asks (each miss asks them all in turn).
pub const MAX_DEBUGINFOD_URLS: usize = 8;
/// Longest debuginfod URL.
pub const MAX_DEBUGINFOD_URL_LENGTH: usize = 256;

/// Naming frames that arrive without function names, at query time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SymbolizationSpec {
    /// debuginfod servers asked, in order, for the debug info of a build id no upload
    /// covers (`https://debuginfod.debian.net`); none by default. At most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_DEBUGINFOD_URLS),
        inner(pattern(DEBUGINFOD_URL_PATTERN), length(max = MAX_DEBUGINFOD_URL_LENGTH))
    )]
    pub debuginfod_urls: Vec<String>,
    /// Take debug files uploaded with `kiln debuginfo upload` (`POST /api/v1/debuginfo`, a
    /// write token for any namespace). On by default; false refuses every upload with 403.
    #[serde(default = "default_true")]
    pub accept_uploads: bool,
    /// Largest debug file taken, uploaded or from debuginfod (`512Mi`, the store's default,
    /// when unset); at least `64Ki`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(QUANTITY_PATTERN), length(max = 32))]
    #[x_kube(validation = Rule::new("quantity(self).compareTo(quantity('64Ki')) >= 0").message("symbolization.maxDebugFileSize must be at least 64Ki").reason(Reason::FieldValueInvalid))]
    pub max_debug_file_size: Option<String>,
    /// Bytes of resolved addresses each replica caches, in memory and in the bucket (`64Mi`,
    /// the store's default, when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(QUANTITY_PATTERN), length(max = 32))]
    pub cache_size: Option<String>,
}

impl Default for SymbolizationSpec {
    fn default() -> Self {
        Self {
            debuginfod_urls: Vec::new(),
            accept_uploads: true,
            max_debug_file_size: None,
            cache_size: None,
        }
    }
}

fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every URL the CRD admits is one the store takes as one URL; what it refuses, the CRD
    /// refuses too.
    #[test]
    fn crd_urls_are_store_urls() {
        let pattern = regex::Regex::new(DEBUGINFOD_URL_PATTERN).expect("valid pattern");
        for good in [
            "https://debuginfod.debian.net",
            "http://debuginfod.kiln-system.svc:8002/",
            "https://example.com/debuginfod",
        ] {
            assert!(pattern.is_match(good), "{good}");
        }
        for bad in [
            "ftp://x",
            "debuginfod.debian.net",
            "http://",
            "http:///path",
            "https://a,https://b",
            "https://a b",
            "https://a?x=1",
        ] {
            assert!(!pattern.is_match(bad), "{bad}");
        }
    }
}
