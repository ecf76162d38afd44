//! What a target asks the agent to scrape from its pods' pprof endpoints
//! (Go's `net/http/pprof` and anything serving the same paths), beside the
//! CPU profiles the agent records itself.

use serde::{Deserialize, Serialize};

use crate::port::PprofPort;

/// Fewest seconds between two scrapes of one endpoint.
pub const MIN_SCRAPE_INTERVAL_SECONDS: u32 = 5;
/// Most seconds between two scrapes (a delta spans at most this).
pub const MAX_SCRAPE_INTERVAL_SECONDS: u32 = 3600;
/// Longest a scrape may take.
pub const MAX_SCRAPE_TIMEOUT_SECONDS: u32 = 60;
/// Longest path prefix accepted.
pub const MAX_PATH_PREFIX_BYTES: usize = 256;

/// The profiles a pprof endpoint serves under its path prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PprofProfile {
    /// Live heap (`inuse_*`) and, cumulatively, allocations (`alloc_*`):
    /// stored as a gauge of what is in use.
    Heap,
    /// Allocations since start (`alloc_*`), cumulative: stored as deltas.
    Allocs,
    /// Goroutines now, a gauge.
    Goroutine,
    /// Contended mutexes since start, cumulative: stored as deltas.
    Mutex,
    /// Blocking on synchronization since start, cumulative: stored as deltas.
    Block,
}

impl PprofProfile {
    /// Every profile, in the default set's order.
    pub const ALL: [PprofProfile; 5] = [
        PprofProfile::Heap,
        PprofProfile::Allocs,
        PprofProfile::Goroutine,
        PprofProfile::Mutex,
        PprofProfile::Block,
    ];

    /// The path below the prefix, as `net/http/pprof` serves it.
    pub fn path(self) -> &'static str {
        match self {
            PprofProfile::Heap => "heap",
            PprofProfile::Allocs => "allocs",
            PprofProfile::Goroutine => "goroutine",
            PprofProfile::Mutex => "mutex",
            PprofProfile::Block => "block",
        }
    }

    /// True when the endpoint's values add up since the process started,
    /// so the agent stores each scrape minus the one before.
    pub fn is_cumulative(self) -> bool {
        matches!(
            self,
            PprofProfile::Allocs | PprofProfile::Mutex | PprofProfile::Block
        )
    }
}

/// Scraping of one target's pods: `http://<pod IP>:<port><pathPrefix>/<profile>`,
/// `port` resolved per pod when it is a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PprofScrape {
    /// The pod's port serving pprof, by number or by container port name.
    pub port: PprofPort,
    /// The path the profiles are served under, e.g. `/debug/pprof`.
    pub path_prefix: String,
    /// Which profiles; sorted and without repeats in a canonical file.
    pub profiles: Vec<PprofProfile>,
    /// Seconds between two scrapes of one endpoint.
    pub interval_seconds: u32,
    /// Seconds one scrape may take before it is abandoned.
    pub timeout_seconds: u32,
}

impl PprofScrape {
    /// Sorts and deduplicates the profiles.
    pub(crate) fn normalize(&mut self) {
        self.profiles.sort();
        self.profiles.dedup();
    }

    /// The first problem with these settings, as (field, problem).
    pub(crate) fn problems(&self) -> Option<(&'static str, String)> {
        if let Some(problem) = self.port.problem() {
            return Some(("pprofScrape.port", problem));
        }
        let prefix = &self.path_prefix;
        if !prefix.starts_with('/')
            || prefix.len() > MAX_PATH_PREFIX_BYTES
            || prefix.contains("..")
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-_.~".contains(&b))
        {
            return Some((
                "pprofScrape.pathPrefix",
                format!(
                    "{prefix:?} must be an absolute path of letters, digits and -_.~/ (at most {MAX_PATH_PREFIX_BYTES} bytes, no ..)"
                ),
            ));
        }
        if self.profiles.is_empty() {
            return Some(("pprofScrape.profiles", "must name a profile".to_owned()));
        }
        if !(MIN_SCRAPE_INTERVAL_SECONDS..=MAX_SCRAPE_INTERVAL_SECONDS)
            .contains(&self.interval_seconds)
        {
            return Some((
                "pprofScrape.intervalSeconds",
                format!(
                    "{} is outside {MIN_SCRAPE_INTERVAL_SECONDS}..={MAX_SCRAPE_INTERVAL_SECONDS}",
                    self.interval_seconds
                ),
            ));
        }
        if self.timeout_seconds == 0
            || self.timeout_seconds > MAX_SCRAPE_TIMEOUT_SECONDS
            || self.timeout_seconds > self.interval_seconds
        {
            return Some((
                "pprofScrape.timeoutSeconds",
                format!(
                    "{} must be 1 to {MAX_SCRAPE_TIMEOUT_SECONDS} and at most intervalSeconds",
                    self.timeout_seconds
                ),
            ));
        }
        None
    }

    /// The URL of `profile` on a pod at `ip` (v4 or v6), on `port`
    /// (this scrape's port, resolved for that pod: [`PprofPort::resolve`]).
    pub fn url(&self, ip: std::net::IpAddr, port: u16, profile: PprofProfile) -> String {
        let prefix = self.path_prefix.trim_end_matches('/');
        let host = match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        };
        // No query: `debug=0`, Go's default, is the protobuf format, and
        // `seconds=` would make the endpoint compute a delta itself (the
        // agent keeps the previous scrape instead).
        format!("http://{host}:{port}{prefix}/{}", profile.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape() -> PprofScrape {
        PprofScrape {
            port: PprofPort::Number(6060),
            path_prefix: "/debug/pprof".into(),
            profiles: PprofProfile::ALL.to_vec(),
            interval_seconds: 15,
            timeout_seconds: 10,
        }
    }

    #[test]
    fn urls_join_the_pod_ip_port_prefix_and_profile() {
        let s = scrape();
        assert_eq!(
            s.url("10.0.0.7".parse().unwrap(), 6060, PprofProfile::Heap),
            "http://10.0.0.7:6060/debug/pprof/heap"
        );
        let trailing = PprofScrape {
            path_prefix: "/debug/pprof/".into(),
            ..scrape()
        };
        assert_eq!(
            trailing.url("fd00::7".parse().unwrap(), 6060, PprofProfile::Allocs),
            "http://[fd00::7]:6060/debug/pprof/allocs"
        );
    }

    #[test]
    fn cumulative_profiles_are_allocs_mutex_and_block() {
        let cumulative: Vec<_> = PprofProfile::ALL
            .into_iter()
            .filter(|p| p.is_cumulative())
            .collect();
        assert_eq!(
            cumulative,
            [
                PprofProfile::Allocs,
                PprofProfile::Mutex,
                PprofProfile::Block
            ]
        );
    }

    #[test]
    fn settings_out_of_bounds_name_their_field() {
        assert_eq!(scrape().problems(), None);
        for (bad, field) in [
            (
                PprofScrape {
                    port: PprofPort::Number(0),
                    ..scrape()
                },
                "pprofScrape.port",
            ),
            (
                PprofScrape {
                    port: PprofPort::Name("Debug_Port".into()),
                    ..scrape()
                },
                "pprofScrape.port",
            ),
            (
                PprofScrape {
                    path_prefix: "debug".into(),
                    ..scrape()
                },
                "pprofScrape.pathPrefix",
            ),
            (
                PprofScrape {
                    path_prefix: "/a/../b".into(),
                    ..scrape()
                },
                "pprofScrape.pathPrefix",
            ),
            (
                PprofScrape {
                    path_prefix: "/a?x=1".into(),
                    ..scrape()
                },
                "pprofScrape.pathPrefix",
            ),
            (
                PprofScrape {
                    profiles: vec![],
                    ..scrape()
                },
                "pprofScrape.profiles",
            ),
            (
                PprofScrape {
                    interval_seconds: 1,
                    ..scrape()
                },
                "pprofScrape.intervalSeconds",
            ),
            (
                PprofScrape {
                    timeout_seconds: 30,
                    ..scrape()
                },
                "pprofScrape.timeoutSeconds",
            ),
        ] {
            assert_eq!(bad.problems().map(|(f, _)| f), Some(field), "{bad:?}");
        }
    }
}
