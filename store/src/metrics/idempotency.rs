//! What idempotency keys did, across replicas: the counters of
//! `kiln_storage::store::KeyStats`, registered on the store's `/metrics` by
//! [`super::Metrics`] and set from the store at each scrape (the store
//! counts; the counters only carry its totals, so they are Prometheus
//! counters that never go back while the process lives).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use kiln_storage::store::KeyStats;

/// Where a repeated key was found: this replica's own keys, or a peer's
/// answer to a resent request.
const ANSWERED_BY: [&str; 2] = ["replica", "peer"];

/// The counters; set at each scrape.
#[derive(Debug, Default)]
pub struct IdempotencyMetrics {
    repeats: Family<[(&'static str, &'static str); 1], Counter>,
    peer_lookup_failures: Counter,
    replay_dropped: Counter,
    replay_unverified: Counter,
}

impl IdempotencyMetrics {
    /// Registers every counter in `registry` (the library appends `_total`).
    pub fn register(&self, registry: &mut Registry) {
        // Both sources are exposed from the start, at 0.
        for source in ANSWERED_BY {
            drop(self.repeats.get_or_create(&[("answered_by", source)]));
        }
        registry.register(
            "kiln_idempotency_repeats",
            "Keyed profiles answered as already stored and not stored again, by where the key was found: this replica's own keys (replica), or a peer asked about a resent request's keys (peer)",
            self.repeats.clone(),
        );
        registry.register(
            "kiln_idempotency_peer_lookup_failures",
            "Peers that gave no usable answer in time to a resent request's key lookup, one per peer and request; the keys no peer vouched for were stored anyway (availability first)",
            self.peer_lookup_failures.clone(),
        );
        registry.register(
            "kiln_wal_replay_dropped_stored_elsewhere",
            "Keyed WAL records dropped at recovery because a peer had stored their key meanwhile (the client resent them there while this replica was down)",
            self.replay_dropped.clone(),
        );
        registry.register(
            "kiln_wal_replay_kept_unverified",
            "Keyed WAL records replayed at recovery although a peer did not answer whether it had stored them (kept, so possibly counted twice)",
            self.replay_unverified.clone(),
        );
    }

    /// Sets the counters to the store's totals.
    pub fn set(&self, stats: &KeyStats) {
        let set = |counter: &Counter, value: u64| {
            counter
                .inner()
                .store(value, std::sync::atomic::Ordering::Relaxed);
        };
        set(
            &self.repeats.get_or_create(&[("answered_by", "replica")]),
            stats.repeats_answered_here,
        );
        set(
            &self.repeats.get_or_create(&[("answered_by", "peer")]),
            stats.repeats_answered_by_peer,
        );
        set(&self.peer_lookup_failures, stats.peer_lookup_failures);
        set(&self.replay_dropped, stats.replay_dropped_stored_elsewhere);
        set(&self.replay_unverified, stats.replay_kept_unverified);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_totals_are_exposed_as_counters() {
        let metrics = IdempotencyMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let render = || {
            let mut out = String::new();
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).unwrap();
            out
        };
        let text = render();
        assert!(
            text.contains("kiln_idempotency_repeats_total{answered_by=\"peer\"} 0\n"),
            "{text}"
        );
        metrics.set(&KeyStats {
            repeats_answered_here: 3,
            repeats_answered_by_peer: 2,
            peer_lookup_failures: 1,
            replay_dropped_stored_elsewhere: 4,
            replay_kept_unverified: 5,
        });
        let text = render();
        for line in [
            "kiln_idempotency_repeats_total{answered_by=\"replica\"} 3\n",
            "kiln_idempotency_repeats_total{answered_by=\"peer\"} 2\n",
            "kiln_idempotency_peer_lookup_failures_total 1\n",
            "kiln_wal_replay_dropped_stored_elsewhere_total 4\n",
            "kiln_wal_replay_kept_unverified_total 5\n",
            "# TYPE kiln_wal_replay_dropped_stored_elsewhere_total counter\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
