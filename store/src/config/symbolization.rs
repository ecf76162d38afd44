//! `[symbolization]` resolved: the debuginfod servers and the bounds on
//! what symbolizing may fetch, parse, keep and wait for.

use std::time::Duration;

use kiln_store_settings::SymbolizationOptions;

use super::{ConfigError, parse_bytes, positive_duration};

/// Smallest file cap: below this no real debug file fits.
const MIN_DEBUGINFO_BYTES: u64 = 64 << 10;

/// The symbolizer's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolizationSettings {
    /// debuginfod base URLs (`http://` or `https://`, no trailing slash),
    /// asked in order.
    pub debuginfod_urls: Vec<String>,
    /// Largest debug file uploaded or fetched.
    pub max_file_bytes: u64,
    /// Whether `POST /api/v1/debuginfo` takes files at all.
    pub accept_uploads: bool,
    /// Deadline of one debuginfod request, body included.
    pub fetch_timeout: Duration,
    /// Bytes of resolved addresses kept.
    pub cache_bytes: u64,
    /// How long a query waits for symbols being fetched.
    pub wait: Duration,
    /// How long a build id found nowhere is not looked up again.
    pub miss_retry: Duration,
}

impl SymbolizationSettings {
    /// Applies the defaults and checks each value.
    pub fn resolve(options: &SymbolizationOptions) -> Result<Self, ConfigError> {
        let mut debuginfod_urls = Vec::new();
        for url in options
            .debuginfod_urls
            .as_deref()
            .unwrap_or("")
            .split([',', ' '])
            .map(str::trim)
            .filter(|u| !u.is_empty())
        {
            let host = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if host.is_none_or(|h| h.is_empty() || h.starts_with('/')) {
                return Err(ConfigError::Invalid {
                    setting: "symbolization.debuginfod_urls",
                    message: format!("{url:?} is not an http:// or https:// URL"),
                });
            }
            debuginfod_urls.push(url.trim_end_matches('/').to_owned());
        }
        let bytes = |setting: &'static str, value: Option<&str>, default: &str| {
            parse_bytes(value.unwrap_or(default))
                .map_err(|message| ConfigError::Invalid { setting, message })
        };
        let max_file_bytes = bytes(
            "symbolization.debuginfo_max_bytes",
            options.debuginfo_max_bytes.as_deref(),
            "512Mi",
        )?;
        if max_file_bytes < MIN_DEBUGINFO_BYTES {
            return Err(ConfigError::Invalid {
                setting: "symbolization.debuginfo_max_bytes",
                message: format!("must be at least {}Ki", MIN_DEBUGINFO_BYTES >> 10),
            });
        }
        Ok(Self {
            debuginfod_urls,
            max_file_bytes,
            accept_uploads: options.debuginfo_uploads.unwrap_or(true),
            fetch_timeout: positive_duration(
                "symbolization.debuginfod_timeout",
                options.debuginfod_timeout.as_deref(),
                "60s",
            )?,
            cache_bytes: bytes(
                "symbolization.symbol_cache_bytes",
                options.symbol_cache_bytes.as_deref(),
                "64Mi",
            )?,
            wait: super::duration(
                "symbolization.symbolization_wait",
                options.symbolization_wait.as_deref(),
                "3s",
            )?,
            miss_retry: positive_duration(
                "symbolization.symbol_miss_retry",
                options.symbol_miss_retry.as_deref(),
                "1h",
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debuginfod_urls_are_http_or_https_and_lose_their_trailing_slash() {
        let options = SymbolizationOptions {
            debuginfod_urls: Some("http://127.0.0.1:8002/, https://debuginfod.debian.net".into()),
            ..Default::default()
        };
        let settings = SymbolizationSettings::resolve(&options).unwrap();
        assert_eq!(
            settings.debuginfod_urls,
            ["http://127.0.0.1:8002", "https://debuginfod.debian.net"]
        );
        assert_eq!(settings.miss_retry, Duration::from_secs(3600));
        assert_eq!(settings.max_file_bytes, 512 << 20);
        assert!(
            settings.accept_uploads,
            "uploads are taken unless turned off"
        );
        let off = SymbolizationOptions {
            debuginfo_uploads: Some(false),
            ..Default::default()
        };
        assert!(!SymbolizationSettings::resolve(&off).unwrap().accept_uploads);
        for bad in ["ftp://x", "debuginfod.debian.net", "http://"] {
            let options = SymbolizationOptions {
                debuginfod_urls: Some(bad.into()),
                ..Default::default()
            };
            let err = SymbolizationSettings::resolve(&options).unwrap_err();
            assert!(err.to_string().contains("debuginfod_urls"), "{bad}: {err}");
        }
        assert!(
            SymbolizationSettings::resolve(&SymbolizationOptions::default())
                .unwrap()
                .debuginfod_urls
                .is_empty()
        );
    }
}
