//! The store's side of idempotency keys across replicas (the contract and
//! why are in [`crate::peer_keys`]): looking a resent request's keys up at
//! the peers, answering a peer's lookup, deciding which replayed records
//! a peer stored meanwhile, and the counts of all three.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kiln_engine::IngestStats;

use super::idempotency::{Begin, check_profile_key};
use crate::error::StorageError;
use crate::peer_keys::{
    AtPeers, KeyAnswer, KeyQuery, KeysAtPeers, MAX_KEYS_PER_QUERY, PeerKeySource,
    REPLAY_LOOKUP_TIMEOUT, RESEND_LOOKUP_TIMEOUT,
};
use crate::store::{Store, lock, now_ms};

/// The peers keys are looked up at, and what the lookups found.
#[derive(Debug, Default)]
pub(in crate::store) struct PeerKeys {
    source: Option<Arc<dyn PeerKeySource>>,
    counters: KeyCounters,
}

#[derive(Debug, Default)]
struct KeyCounters {
    answered_here: AtomicU64,
    answered_by_peer: AtomicU64,
    lookup_failures: AtomicU64,
    replay_dropped: AtomicU64,
    replay_unverified: AtomicU64,
}

/// What idempotency keys did since the store opened, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// Keyed profiles answered as stored from this replica's own keys.
    pub repeats_answered_here: u64,
    /// Resent keyed profiles answered as stored because a peer stored them.
    pub repeats_answered_by_peer: u64,
    /// Peers that gave no usable answer to a resent request's lookup in
    /// time, one per peer and request; each request's unknown keys were
    /// stored anyway.
    pub peer_lookup_failures: u64,
    /// Keyed WAL records replay dropped at open because a peer had stored
    /// their key meanwhile.
    pub replay_dropped_stored_elsewhere: u64,
    /// Keyed WAL records replayed at open without every peer's word that
    /// it had not stored them (a peer did not answer in time).
    pub replay_kept_unverified: u64,
}

impl PeerKeys {
    /// Keys looked up at `source`, or nowhere (a store alone).
    pub(in crate::store) fn new(
        source: Option<Arc<dyn PeerKeySource>>,
        replayed: &ReplayedKeys,
    ) -> Self {
        let keys = Self {
            source,
            counters: KeyCounters::default(),
        };
        keys.counters
            .replay_dropped
            .store(replayed.dropped.len() as u64, Ordering::Relaxed);
        keys.counters
            .replay_unverified
            .store(replayed.kept_unverified, Ordering::Relaxed);
        keys
    }
}

/// What the peers said, at open, about the keys of the records to replay;
/// the default, nothing asked, keeps every record.
#[derive(Debug, Default)]
pub(in crate::store) struct ReplayKeys {
    stored_elsewhere: HashSet<String>,
    /// Some peer did not answer about some key.
    incomplete: bool,
}

/// What to do with one keyed record at replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum ReplayKey {
    /// A peer stored it: drop it, the peer's copy counts.
    Drop,
    /// No peer has it, and every peer said so.
    Keep,
    /// No peer that answered has it, but some did not answer: keep it
    /// (a record is never dropped on a guess), and count it.
    KeepUnverified,
}

impl ReplayKeys {
    /// What to do with a replayed record keyed `key`.
    pub(in crate::store) fn decide(&self, key: &str) -> ReplayKey {
        if self.stored_elsewhere.contains(key) {
            ReplayKey::Drop
        } else if self.incomplete {
            ReplayKey::KeepUnverified
        } else {
            ReplayKey::Keep
        }
    }
}

/// What replay did with keyed records.
#[derive(Debug, Default)]
pub(in crate::store) struct ReplayedKeys {
    /// Keys of the records dropped as stored elsewhere.
    pub(in crate::store) dropped: Vec<String>,
    /// Keyed records kept without every peer's answer.
    pub(in crate::store) kept_unverified: u64,
}

/// Asks the peers, at open, which of `keys` (those of the records in the
/// WAL) they stored, within [`REPLAY_LOOKUP_TIMEOUT`] in all. Without
/// peers there is nothing to ask and every record is kept as verified.
pub(in crate::store) async fn replay_keys(
    source: Option<&Arc<dyn PeerKeySource>>,
    keys: Vec<String>,
) -> ReplayKeys {
    let Some(source) = source else {
        return ReplayKeys::default();
    };
    let keys: Vec<String> = keys
        .into_iter()
        .collect::<HashSet<_>>()
        .into_iter()
        .filter(|key| check_profile_key(key).is_ok())
        .collect();
    if keys.is_empty() {
        return ReplayKeys::default();
    }
    let started = Instant::now();
    let found = ask(source.as_ref(), &keys, started + REPLAY_LOOKUP_TIMEOUT).await;
    let stored_elsewhere: HashSet<String> = found.stored().map(str::to_owned).collect();
    for peer in &found.unanswered {
        tracing::warn!(
            peer = %peer.peer,
            error = %peer.error,
            "peer did not answer which replayed keys it stored; keeping the records it may hold too"
        );
    }
    tracing::info!(
        keys = keys.len(),
        stored_elsewhere = stored_elsewhere.len(),
        unanswered_peers = found.unanswered.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "asked the peers about the keys of the WAL's records"
    );
    ReplayKeys {
        stored_elsewhere,
        incomplete: !found.complete(),
    }
}

/// Asks every peer about `keys`, [`MAX_KEYS_PER_QUERY`] at a time, all
/// before `deadline`.
async fn ask(source: &dyn PeerKeySource, keys: &[String], deadline: Instant) -> KeysAtPeers {
    let mut found = KeysAtPeers::default();
    for chunk in keys.chunks(MAX_KEYS_PER_QUERY) {
        let query = KeyQuery {
            keys: chunk.to_vec(),
        };
        let answers = source.ask_keys(query, deadline).await;
        found.extend(KeysAtPeers::gather(chunk, answers));
    }
    found
}

impl Store {
    /// What idempotency keys did since the store opened.
    pub fn key_stats(&self) -> KeyStats {
        let counters = &self.shared.ingest.peer_keys.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        KeyStats {
            repeats_answered_here: get(&counters.answered_here),
            repeats_answered_by_peer: get(&counters.answered_by_peer),
            peer_lookup_failures: get(&counters.lookup_failures),
            replay_dropped_stored_elsewhere: get(&counters.replay_dropped),
            replay_kept_unverified: get(&counters.replay_unverified),
        }
    }

    /// For a request the client marked as a resend: asks the peers about
    /// its `keys` that this replica neither stored nor is storing, in one
    /// query, and returns what they said, to hand to
    /// [`Store::ingest_resent`] for each profile. `None` when there is
    /// nothing to ask (no peers, or every key known here).
    ///
    /// A peer that does not answer within [`RESEND_LOOKUP_TIMEOUT`]
    /// (down, restarting, still recovering, refusing) does not hold the
    /// request up: the keys no answering peer stored are stored here,
    /// availability first, and each such peer is counted
    /// ([`KeyStats::peer_lookup_failures`]). The profile may then be stored
    /// twice, once here and once at the silent peer; if that peer was down
    /// with the record in its WAL, its replay drops its copy on this
    /// replica's word (see [`crate::peer_keys`]).
    pub async fn keys_at_peers(&self, keys: Vec<String>) -> Option<KeysAtPeers> {
        let peer_keys = &self.shared.ingest.peer_keys;
        let source = peer_keys.source.as_ref()?;
        let now = now_ms();
        let unknown: Vec<String> = {
            let mut recent = lock(&self.shared.ingest.recent_keys);
            let mut seen = HashSet::new();
            keys.into_iter()
                .filter(|key| {
                    check_profile_key(key).is_ok()
                        && recent.peek(key, now) == Begin::New
                        && seen.insert(key.clone())
                })
                .collect()
        };
        if unknown.is_empty() {
            return None;
        }
        let found = ask(
            source.as_ref(),
            &unknown,
            Instant::now() + RESEND_LOOKUP_TIMEOUT,
        )
        .await;
        for peer in &found.unanswered {
            tracing::warn!(
                peer = %peer.peer,
                error = %peer.error,
                keys = unknown.len(),
                "peer did not answer a resent request's key lookup; storing what it may hold"
            );
        }
        peer_keys
            .counters
            .lookup_failures
            .fetch_add(found.unanswered.len() as u64, Ordering::Relaxed);
        Some(found)
    }

    /// [`Store::ingest_once`] for a profile of a resent request, given what
    /// the peers said of its key ([`Store::keys_at_peers`]): a key a peer
    /// stored is answered as stored and nothing is stored here; one a peer
    /// is storing right now is refused as in flight, to be retried.
    pub async fn ingest_resent(
        &self,
        request: crate::store::IngestRequest,
        key: &str,
        at_peers: Option<&KeysAtPeers>,
    ) -> Result<IngestStats, StorageError> {
        self.ingest_keyed(request, key, at_peers).await
    }

    /// Counts a keyed profile answered as stored from this replica's keys.
    pub(in crate::store) fn count_repeat_here(&self) {
        self.shared
            .ingest
            .peer_keys
            .counters
            .answered_here
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The answer for `key`, claimed here as new, when the peers settle it
    /// (stored there, or being stored there); `None` when it is to be
    /// stored here. The caller releases its claim on `key` when settled.
    pub(in crate::store) fn settled_at_peers(
        &self,
        key: &str,
        at_peers: &KeysAtPeers,
    ) -> Option<Result<IngestStats, StorageError>> {
        match at_peers.at_peers(key) {
            AtPeers::Stored { replica } => {
                tracing::debug!(key, %replica, "a resent profile is stored at a peer");
                self.shared
                    .ingest
                    .peer_keys
                    .counters
                    .answered_by_peer
                    .fetch_add(1, Ordering::Relaxed);
                Some(Ok(IngestStats::default()))
            }
            AtPeers::InFlight { .. } => Some(Err(StorageError::IdempotencyKeyInFlight {
                key: key.to_owned(),
            })),
            AtPeers::Unknown => None,
        }
    }

    /// This replica's answer to a peer's key query: which keys it stored
    /// (and still holds: keys its replay dropped are forgotten), and which
    /// it is storing now. Claims nothing.
    pub fn answer_key_query(&self, query: &KeyQuery) -> KeyAnswer {
        let now = now_ms();
        let mut answer = KeyAnswer {
            replica: self.shared.config.replica.clone(),
            ..KeyAnswer::default()
        };
        let mut recent = lock(&self.shared.ingest.recent_keys);
        for (index, key) in query.keys.iter().enumerate() {
            // At most MAX_KEYS_PER_QUERY keys: the index fits.
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            match recent.peek(key, now) {
                Begin::Stored => answer.stored.push(index),
                Begin::InFlight => answer.in_flight.push(index),
                Begin::New => {}
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_drops_only_what_a_peer_stored_and_counts_what_no_peer_vouched_for() {
        let answered = ReplayKeys {
            stored_elsewhere: HashSet::from(["retried".to_owned()]),
            incomplete: false,
        };
        assert_eq!(answered.decide("retried"), ReplayKey::Drop);
        assert_eq!(answered.decide("only-here"), ReplayKey::Keep);
        let partly = ReplayKeys {
            stored_elsewhere: HashSet::from(["retried".to_owned()]),
            incomplete: true,
        };
        assert_eq!(partly.decide("retried"), ReplayKey::Drop);
        assert_eq!(partly.decide("only-here"), ReplayKey::KeepUnverified);
    }

    #[derive(Debug)]
    struct Silent;

    impl PeerKeySource for Silent {
        fn ask_keys(
            &self,
            _query: KeyQuery,
            _deadline: Instant,
        ) -> std::pin::Pin<Box<dyn Future<Output = crate::peer_keys::KeyAnswers> + Send + '_>>
        {
            Box::pin(async {
                crate::peer_keys::KeyAnswers {
                    answers: vec![],
                    unanswered: vec![crate::peers::UnansweredPeer {
                        peer: "r1".into(),
                        error: "refused".into(),
                    }],
                }
            })
        }
    }

    #[tokio::test]
    async fn without_peers_replay_keeps_everything_as_verified_and_a_silent_peer_verifies_nothing()
    {
        let alone = replay_keys(None, vec!["a".into()]).await;
        assert_eq!(alone.decide("a"), ReplayKey::Keep);
        let source: Arc<dyn PeerKeySource> = Arc::new(Silent);
        let silent = replay_keys(Some(&source), vec!["a".into(), "a".into()]).await;
        assert_eq!(silent.decide("a"), ReplayKey::KeepUnverified);
        let nothing_keyed = replay_keys(Some(&source), vec![]).await;
        assert_eq!(nothing_keyed.decide("a"), ReplayKey::Keep);
    }
}
