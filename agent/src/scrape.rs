//! Scraping pprof endpoints (Go's `net/http/pprof`): heap, allocations,
//! goroutines, mutex and block profiles, shipped beside CPU profiles with
//! the same labels.
//!
//! [`delta`] is pure (what is kept of a scrape, deltas of cumulative
//! profiles); [`fetch`] is one bounded HTTP GET; [`runner`] schedules
//! scrapes on a few slots of their own, so a slow endpoint never delays
//! another or the CPU sampler (which runs on its own thread regardless).

pub mod delta;
pub mod fetch;
pub mod pods;
pub mod runner;

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_targets::PprofProfile;

pub use runner::{ScrapeConfig, run_scraper};

/// Why one scrape stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// Not a plain `http://host[:port]/path` URL.
    #[error("{url:?} is not an http:// URL")]
    Url {
        /// The URL given.
        url: String,
    },
    /// The TCP connection failed.
    #[error("connecting: {source}")]
    Connect {
        /// What connect reported.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed (not HTTP, reset, malformed).
    #[error("HTTP: {source}")]
    Http {
        /// What hyper reported.
        #[source]
        source: hyper::Error,
    },
    /// The whole scrape took longer than its timeout.
    #[error("no complete answer within {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// A redirect, which is never followed.
    #[error("redirect ({status}), not followed")]
    Redirect {
        /// The HTTP status.
        status: u16,
    },
    /// Any status but 200.
    #[error("HTTP status {status}")]
    Status {
        /// The HTTP status.
        status: u16,
    },
    /// A media type pprof is not served as (an HTML page, JSON).
    #[error("content type {content_type:?} is not pprof")]
    ContentType {
        /// The type served (at most 64 characters of it).
        content_type: String,
    },
    /// The body is over the cap.
    #[error("body over {limit} bytes")]
    TooLarge {
        /// The cap.
        limit: usize,
    },
    /// The body is not a pprof profile within the decode limits (a gzip
    /// bomb ends here, at the decompressed limit).
    #[error("not a usable pprof profile: {source}")]
    Decode {
        /// What the decoder reported.
        #[source]
        source: kiln_pprof::PprofError,
    },
    /// The task decoding the body ended abnormally (a panic in the decoder).
    #[error("the decoding task failed")]
    DecodeTask,
    /// A pprof profile without the sample types this profile keeps.
    #[error(transparent)]
    Prepare {
        /// What was missing.
        #[from]
        source: delta::PrepareError,
    },
}

impl ScrapeError {
    /// A fixed metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Url { .. } => "url",
            ScrapeError::Connect { .. } => "connect",
            ScrapeError::Http { .. } => "http",
            ScrapeError::Timeout { .. } => "timeout",
            ScrapeError::Redirect { .. } => "redirect",
            ScrapeError::Status { .. } => "status",
            ScrapeError::ContentType { .. } => "content_type",
            ScrapeError::TooLarge { .. } => "too_large",
            ScrapeError::Decode { source } => match source {
                kiln_pprof::PprofError::DecompressedTooLarge { .. } => "decompressed_too_large",
                _ => "decode",
            },
            ScrapeError::DecodeTask => "decode_task",
            ScrapeError::Prepare { source } => source.reason(),
        }
    }
}

/// The `__name__` a scraped profile is stored under: the names Pyroscope
/// and Grafana give Go's profiles (`memory:inuse_space:bytes:space:bytes`,
/// `goroutine:goroutine:count:goroutine:count`, `mutex:delay:…`,
/// `block:delay:…`), so their UIs recognise the series. Heap and allocs
/// share `memory`: their sample types (`inuse_*`, `alloc_*`) tell them apart.
pub fn profile_name(profile: PprofProfile) -> &'static str {
    match profile {
        PprofProfile::Heap | PprofProfile::Allocs => "memory",
        PprofProfile::Goroutine => "goroutine",
        PprofProfile::Mutex => "mutex",
        PprofProfile::Block => "block",
    }
}

/// One process's pprof endpoint and what to scrape of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeEndpoint {
    /// Names the process across scrapes (its pod and container, or the URL),
    /// so deltas are taken against the same process's previous scrape.
    pub id: String,
    /// The URL of each profile (empty URLs when `missing_port` is set).
    pub urls: Vec<(PprofProfile, String)>,
    /// The port name the target asks for that no container of the pod
    /// declares: nothing is fetched, and each profile's due scrape counts a
    /// `port_name` error instead, so a typo shows in the agent's metrics
    /// and no other port is ever scraped in its place.
    pub missing_port: Option<String>,
    /// Series labels (those CPU profiles of the same target carry).
    pub labels: BTreeMap<String, String>,
    /// Between two scrapes of one profile.
    pub interval: Duration,
    /// Longest one scrape may take.
    pub timeout: Duration,
}

/// `base` (e.g. `http://127.0.0.1:6060/debug/pprof`) with each profile's
/// path appended.
pub fn urls_under(base: &str, profiles: &[PprofProfile]) -> Vec<(PprofProfile, String)> {
    let base = base.trim_end_matches('/');
    profiles
        .iter()
        .map(|&p| (p, format!("{base}/{}", p.path())))
        .collect()
}

/// The endpoints of `--scrape` URLs (host mode): every profile under each
/// base URL, labelled `service_name` (`service_name`, else the URL's
/// `host:port`), `instance` (`host:port`) and `node`.
pub fn host_endpoints(
    bases: &[String],
    service_name: Option<&str>,
    node: &str,
    interval: Duration,
    timeout: Duration,
) -> Result<Vec<ScrapeEndpoint>, ScrapeError> {
    bases
        .iter()
        .map(|base| {
            let uri: hyper::Uri = base
                .parse()
                .map_err(|_| ScrapeError::Url { url: base.clone() })?;
            let authority = match (uri.scheme_str(), uri.authority()) {
                (Some("http"), Some(authority)) => authority.as_str().to_owned(),
                _ => {
                    return Err(ScrapeError::Url { url: base.clone() });
                }
            };
            let labels = BTreeMap::from([
                (
                    kiln_contract::labels::SERVICE_NAME.to_owned(),
                    service_name.unwrap_or(&authority).to_owned(),
                ),
                ("instance".to_owned(), authority),
                (kiln_contract::labels::NODE.to_owned(), node.to_owned()),
            ]);
            Ok(ScrapeEndpoint {
                id: base.clone(),
                urls: urls_under(base, &PprofProfile::ALL),
                missing_port: None,
                labels,
                interval,
                timeout,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_endpoints_are_labelled_by_service_and_instance() {
        let second = Duration::from_secs(1);
        let endpoints = host_endpoints(
            &["http://127.0.0.1:6060/debug/pprof".to_owned()],
            None,
            "n1",
            second,
            second,
        )
        .expect("valid");
        let labels: Vec<(&str, &str)> = endpoints[0]
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("instance", "127.0.0.1:6060"),
                ("node", "n1"),
                ("service_name", "127.0.0.1:6060")
            ]
        );
        assert_eq!(endpoints[0].urls.len(), PprofProfile::ALL.len());
        for bad in ["https://x/debug/pprof", "127.0.0.1:6060", "file:///etc"] {
            let error = host_endpoints(&[bad.to_owned()], None, "n1", second, second)
                .expect_err("not plain http");
            assert_eq!(error.reason(), "url", "{bad}");
        }
    }

    #[test]
    fn urls_append_each_profile_once() {
        let urls = urls_under(
            "http://127.0.0.1:6060/debug/pprof/",
            &[PprofProfile::Heap, PprofProfile::Block],
        );
        assert_eq!(
            urls,
            [
                (
                    PprofProfile::Heap,
                    "http://127.0.0.1:6060/debug/pprof/heap".to_owned()
                ),
                (
                    PprofProfile::Block,
                    "http://127.0.0.1:6060/debug/pprof/block".to_owned()
                ),
            ]
        );
    }
}
