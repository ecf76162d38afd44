//! The scrape loop (IO): each endpoint's profiles on their interval, at
//! most `slots` scrapes at once, each on a task of its own; what they
//! return is turned into stored profiles here, where the delta state lives,
//! and queued for the shipper like CPU profiles.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kiln_contract::labels as label;
use kiln_pprof::DecodeLimits;
use kiln_targets::PprofProfile;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;

use super::delta::{self, DeltaOutcome, DeltaState, Prepared};
use super::fetch::{self, FetchLimits};
use super::{ScrapeEndpoint, ScrapeError, profile_name};
use crate::metrics::AgentMetrics;
use crate::ship::{ShipItem, ShipQueue};

/// How scraping is bounded.
#[derive(Debug, Clone)]
pub struct ScrapeConfig {
    /// Scrapes in flight at once; a hanging endpoint holds one for its timeout.
    pub slots: usize,
    /// Largest body read off the wire.
    pub max_body_bytes: usize,
    /// Bounds on decoding it (the decompressed size caps a gzip bomb).
    pub decode_limits: DecodeLimits,
    /// Bytes of previous scrapes kept for deltas, over every endpoint.
    pub state_bytes: usize,
}

impl Default for ScrapeConfig {
    /// Four slots of at most 16 MiB on the wire, one decode at a time of at
    /// most 32 MiB inflated and 64 MiB decoded; 32 MiB of delta state. A Go service's heap profile is
    /// typically tens to hundreds of KiB.
    fn default() -> Self {
        ScrapeConfig {
            slots: 4,
            max_body_bytes: 16 << 20,
            decode_limits: DecodeLimits {
                max_input_bytes: 16 << 20,
                max_decompressed_bytes: 32 << 20,
                max_decoded_bytes: 64 << 20,
                ..DecodeLimits::default()
            },
            state_bytes: 32 << 20,
        }
    }
}

/// One endpoint's profile: the unit scheduled.
type Key = (String, PprofProfile);

/// A finished scrape, back from its task.
struct Done {
    key: Key,
    labels: Vec<(String, String)>,
    scraped_unix_ns: i64,
    result: Result<Prepared, ScrapeError>,
}

/// How often due scrapes are looked for.
const TICK: Duration = Duration::from_millis(200);

/// Scrapes the endpoints `endpoints` holds (it may change, e.g. as pods come
/// and go) until `shutdown` turns true.
pub async fn run_scraper(
    endpoints: watch::Receiver<Vec<ScrapeEndpoint>>,
    config: ScrapeConfig,
    queue: ShipQueue,
    metrics: Arc<AgentMetrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(config.slots.max(1)));
    // One decode at a time: bodies wait in their slots, so the worst case
    // is `slots` bodies plus one inflated and decoded profile, not `slots`
    // of each.
    let decoding = Arc::new(Semaphore::new(1));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut state = DeltaState::new(config.state_bytes);
    let mut next_due: HashMap<Key, Instant> = HashMap::new();
    // One scrape per endpoint at a time: a hanging endpoint holds one slot,
    // never one per profile.
    let mut in_flight: HashSet<String> = HashSet::new();
    let mut round = 0usize;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    return;
                }
            }
            Some(done) = done_rx.recv() => {
                in_flight.remove(&done.key.0);
                store(done, &mut state, &queue, &metrics);
            }
            _ = tick.tick() => {
                let current = endpoints.borrow().clone();
                let ids: HashSet<&str> = current.iter().map(|e| e.id.as_str()).collect();
                state.retain(|id| ids.contains(id));
                next_due.retain(|(id, _), _| ids.contains(id.as_str()));
                let now = Instant::now();
                // Each tick starts one endpoint further on, so when slots are
                // short no endpoint always comes last.
                round = round.wrapping_add(1);
                let start = round % current.len().max(1);
                for endpoint in current.iter().cycle().skip(start).take(current.len()) {
                    if in_flight.contains(&endpoint.id) {
                        continue;
                    }
                    let due = endpoint.urls.iter().find(|(kind, _)| {
                        next_due
                            .get(&(endpoint.id.clone(), *kind))
                            .is_none_or(|due| *due <= now)
                    });
                    if let (Some((kind, _)), Some(name)) = (due, &endpoint.missing_port) {
                        // Nothing to fetch: the error is counted on the
                        // endpoint's interval, as a failing fetch would be.
                        next_due.insert((endpoint.id.clone(), *kind), now + endpoint.interval);
                        tracing::debug!(endpoint = %endpoint.id, profile = kind.path(), port = %name, "no container of the pod declares the port name; not scraped");
                        metrics.add_scrape_error("port_name");
                        continue;
                    }
                    if let Some((kind, url)) = due {
                        let key = (endpoint.id.clone(), *kind);
                        // All slots busy: try again next tick, not queued,
                        // so hanging endpoints never pile up work.
                        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                            break;
                        };
                        next_due.insert(key.clone(), now + endpoint.interval);
                        in_flight.insert(endpoint.id.clone());
                        let task = Scrape {
                            key,
                            url: url.clone(),
                            labels: endpoint.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                            limits: FetchLimits {
                                timeout: endpoint.timeout,
                                max_body_bytes: config.max_body_bytes,
                            },
                            decode_limits: config.decode_limits.clone(),
                            decoding: Arc::clone(&decoding),
                        };
                        let done_tx = done_tx.clone();
                        tokio::spawn(async move {
                            let done = task.run().await;
                            drop(permit);
                            let _ = done_tx.send(done);
                        });
                    }
                }
            }
        }
    }
}

/// One scrape's inputs, moved onto its task.
struct Scrape {
    key: Key,
    url: String,
    labels: Vec<(String, String)>,
    limits: FetchLimits,
    decode_limits: DecodeLimits,
    decoding: Arc<Semaphore>,
}

impl Scrape {
    async fn run(self) -> Done {
        let kind = self.key.1;
        let result = match fetch::fetch(&self.url, self.limits).await {
            Ok(bytes) => {
                let limits = self.decode_limits;
                let Ok(_decoding) = self.decoding.acquire_owned().await else {
                    return Done {
                        key: self.key,
                        labels: self.labels,
                        scraped_unix_ns: unix_ns(),
                        result: Err(ScrapeError::DecodeTask),
                    };
                };
                // Decoding a large profile takes milliseconds of CPU: off
                // the runtime that also ships.
                tokio::task::spawn_blocking(move || {
                    let profile = kiln_pprof::decode(&bytes, &limits)
                        .map_err(|source| ScrapeError::Decode { source })?;
                    Ok(delta::prepare(kind, profile)?)
                })
                .await
                .unwrap_or(Err(ScrapeError::DecodeTask))
            }
            Err(error) => Err(error),
        };
        Done {
            key: self.key,
            labels: self.labels,
            scraped_unix_ns: unix_ns(),
            result,
        }
    }
}

fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Turns a finished scrape into what is stored, and queues it.
fn store(done: Done, state: &mut DeltaState, queue: &ShipQueue, metrics: &AgentMetrics) {
    let (id, kind) = &done.key;
    let prepared = match done.result {
        Ok(prepared) => prepared,
        Err(error) => {
            tracing::debug!(endpoint = %id, profile = kind.path(), %error, "scrape failed");
            metrics.add_scrape_error(error.reason());
            return;
        }
    };
    let profile = if kind.is_cumulative() {
        match state.delta(id, *kind, prepared, done.scraped_unix_ns) {
            DeltaOutcome::Baseline => {
                metrics.add_scrape("baseline");
                return;
            }
            DeltaOutcome::OverBudget => {
                metrics.add_scrape_error("state_budget");
                return;
            }
            DeltaOutcome::Delta(profile) => {
                metrics.add_scrape("delta");
                profile
            }
            DeltaOutcome::Restarted(profile) => {
                metrics.add_scrape("restarted");
                profile
            }
        }
    } else {
        metrics.add_scrape("gauge");
        delta::as_gauge(prepared.profile, done.scraped_unix_ns)
    };
    metrics.set_scrape_state_bytes(u64::try_from(state.bytes()).unwrap_or(u64::MAX));
    // Nothing changed since the previous scrape: no profile, rather than an
    // empty one per interval.
    if profile.sample.is_empty() {
        return;
    }
    let mut labels = done.labels;
    labels.retain(|(name, _)| name != label::PROFILE_NAME);
    labels.push((
        label::PROFILE_NAME.to_owned(),
        profile_name(*kind).to_owned(),
    ));
    labels.sort();
    let stem = format!(
        "{}-{}-{:016x}",
        kind.path(),
        done.scraped_unix_ns / 1_000_000,
        stable_hash(id)
    );
    queue.push(ShipItem {
        labels,
        pprof_gzip: kiln_pprof::encode_gzip(&profile),
        file_stem: stem,
    });
}

/// A file-name-safe stand-in for an endpoint id (a URL or pod name).
fn stable_hash(text: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// An endpoint whose port name the pod does not declare fetches nothing and counts one
    /// `port_name` error per profile per interval, not one per tick.
    #[tokio::test]
    async fn a_missing_port_counts_an_error_per_profile_and_interval_and_fetches_nothing() {
        let metrics = Arc::new(AgentMetrics::default());
        let queue = ShipQueue::new(16, Arc::clone(&metrics));
        let endpoint = ScrapeEndpoint {
            id: "sandbox:http-debug/debug/pprof".to_owned(),
            urls: vec![
                (PprofProfile::Heap, String::new()),
                (PprofProfile::Allocs, String::new()),
            ],
            missing_port: Some("http-debug".to_owned()),
            labels: BTreeMap::new(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        };
        let (_endpoints_tx, endpoints) = watch::channel(vec![endpoint]);
        let (shutdown_tx, shutdown) = watch::channel(false);
        let scraper = tokio::spawn(run_scraper(
            endpoints,
            ScrapeConfig::default(),
            queue.clone(),
            Arc::clone(&metrics),
            shutdown,
        ));
        tokio::time::sleep(Duration::from_millis(2300)).await;
        shutdown_tx.send(true).expect("scraper listens");
        scraper.await.expect("scraper ends");
        // Each profile is due at about 0.2 s, 1.2 s and 2.2 s: 4 to 6 errors; one per 200 ms
        // tick would be about 11.
        let errors = metrics.scrape_errors("port_name");
        assert!((2..=6).contains(&errors), "{errors} port_name errors");
        assert_eq!(queue.len(), 0, "nothing stored");
        assert_eq!(
            metrics.scrape_errors("url") + metrics.scrape_errors("connect"),
            0
        );
    }
}
