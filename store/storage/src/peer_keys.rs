//! Idempotency keys across replicas: asking the peers whether they stored
//! a key.
//!
//! A replica remembers only the keys of what it stored itself
//! (`store::ingest::idempotency`). Agents send every retry to the replica
//! that took the first try, so it usually knows the key; but when that
//! replica is down past the agent's failover, the retry reaches another
//! one, and a profile the first replica stored without answering would be
//! stored twice. So:
//!
//! - a client marks a resend as such (gRPC metadata
//!   [`RETRY_ATTEMPT_METADATA`]); a keyed profile of a marked request whose
//!   key this replica does not know is looked up at the peers, in one
//!   query per request, before it is stored. First sends (the common path)
//!   never pay the round trip.
//! - at open, a replica asks the peers about the keys of the records its
//!   WAL replays: one a live peer has stored meanwhile (the client retried
//!   there while this replica was down) is dropped, not replayed.
//!
//! A peer answers only once it is open: while it recovers it has not yet
//! dropped what it will drop, so it answers nothing rather than claim a
//! key whose record it may not keep. Two replicas restarting together thus
//! cannot each drop their copy on the other's word; at worst both keep it.
//!
//! This module is the contract: the query, the answer and their bytes on
//! the wire, what a set of answers says about each key ([`KeysAtPeers`]),
//! and [`PeerKeySource`], the transport the server provides.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::peers::UnansweredPeer;
use crate::store::check_profile_key;

/// The gRPC metadata with which a client marks a request as a resend of
/// one it sent before: the attempt number, `1` for the first resend. Only
/// a positive decimal number marks a resend; anything else reads as a
/// first send.
pub const RETRY_ATTEMPT_METADATA: &str = "kiln-retry-attempt";

/// How long a resent request waits for the peers' answer about its keys:
/// the connect's own timeout (`--peer-connect-timeout`, 2 s by default)
/// and a round trip. A peer that has not answered by then is counted and
/// the profile stored (see `Store::keys_at_peers`).
pub const RESEND_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// How long opening a store waits for the peers' answer about the keys of
/// the records it replays. Readiness waits for it, so it is short; a peer
/// that has not answered by then is counted and the records kept.
pub const REPLAY_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Most keys in one query: a request's profiles (1024 at most) fit in one;
/// a replay's keys are asked in several.
pub const MAX_KEYS_PER_QUERY: usize = 4096;

/// Largest query body: [`MAX_KEYS_PER_QUERY`] keys of the longest kind,
/// quoted and escaped, with room to spare.
pub const MAX_KEY_QUERY_BYTES: usize = 4 << 20;

/// Largest answer body: the replica's name and two lists of indices.
pub const MAX_KEY_ANSWER_BYTES: usize = 256 << 10;

/// What a replica asks its peers: did you store these keys?
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyQuery {
    /// Stored keys (a client's key, or `<key>/<index>` for a profile of a
    /// series of several), each as `check_profile_key` accepts.
    pub keys: Vec<String>,
}

/// One peer's answer: which of the asked keys it stored, and which it is
/// storing right now, by their index in the query. Indices, not keys, so
/// the answer never echoes client text and is small.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyAnswer {
    /// The answering replica's name.
    pub replica: String,
    /// Keys it stored within its window, by index, ascending.
    pub stored: Vec<u32>,
    /// Keys a request is storing there now, by index, ascending.
    pub in_flight: Vec<u32>,
}

/// Why a key query or answer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyWireError {
    /// Not the JSON of a query or an answer.
    #[error("a key {what} is not valid: {source}")]
    Json {
        /// `query` or `answer`.
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// More bytes than a query or answer may have.
    #[error("a key {what} of {len} bytes is past its limit of {limit}")]
    TooLarge {
        /// `query` or `answer`.
        what: &'static str,
        /// Its bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A query of no keys, or of more than [`MAX_KEYS_PER_QUERY`].
    #[error("a key query must hold 1 to {MAX_KEYS_PER_QUERY} keys, not {count}")]
    KeyCount {
        /// Keys in the query.
        count: usize,
    },
    /// A key no replica could have stored.
    #[error("key {index} of the query is not a stored key: {message}")]
    BadKey {
        /// Its index in the query.
        index: usize,
        /// What is wrong with it.
        message: String,
    },
    /// An answer names a key the query did not hold, or one twice.
    #[error("a key answer names index {index} of a query of {asked} keys, or names it twice")]
    BadIndex {
        /// The index named.
        index: u32,
        /// Keys asked.
        asked: usize,
    },
}

impl KeyWireError {
    /// A short, fixed name for metrics and logs, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Json { .. } => "key_wire_json",
            Self::TooLarge { .. } => "key_wire_too_large",
            Self::KeyCount { .. } => "key_wire_key_count",
            Self::BadKey { .. } => "key_wire_bad_key",
            Self::BadIndex { .. } => "key_wire_bad_index",
        }
    }
}

impl KeyQuery {
    /// The query's bytes on the wire (JSON).
    pub fn encode(&self) -> Vec<u8> {
        // A list of strings always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a query, checking its size, its key count and every key.
    pub fn decode(bytes: &[u8]) -> Result<Self, KeyWireError> {
        if bytes.len() > MAX_KEY_QUERY_BYTES {
            return Err(KeyWireError::TooLarge {
                what: "query",
                len: bytes.len(),
                limit: MAX_KEY_QUERY_BYTES,
            });
        }
        let query: Self = serde_json::from_slice(bytes).map_err(|source| KeyWireError::Json {
            what: "query",
            source,
        })?;
        if query.keys.is_empty() || query.keys.len() > MAX_KEYS_PER_QUERY {
            return Err(KeyWireError::KeyCount {
                count: query.keys.len(),
            });
        }
        for (index, key) in query.keys.iter().enumerate() {
            check_profile_key(key).map_err(|message| KeyWireError::BadKey { index, message })?;
        }
        Ok(query)
    }
}

impl KeyAnswer {
    /// The answer's bytes on the wire (JSON).
    pub fn encode(&self) -> Vec<u8> {
        // A name and two lists of numbers always serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads an answer to a query of `asked` keys; every index must be one
    /// of them, and no key may be both stored and in flight.
    pub fn decode(bytes: &[u8], asked: usize) -> Result<Self, KeyWireError> {
        if bytes.len() > MAX_KEY_ANSWER_BYTES {
            return Err(KeyWireError::TooLarge {
                what: "answer",
                len: bytes.len(),
                limit: MAX_KEY_ANSWER_BYTES,
            });
        }
        let answer: Self = serde_json::from_slice(bytes).map_err(|source| KeyWireError::Json {
            what: "answer",
            source,
        })?;
        let mut named = vec![false; asked];
        for &index in answer.stored.iter().chain(&answer.in_flight) {
            let slot = usize::try_from(index)
                .ok()
                .and_then(|i| named.get_mut(i))
                .filter(|seen| !**seen)
                .ok_or(KeyWireError::BadIndex { index, asked })?;
            *slot = true;
        }
        Ok(answer)
    }
}

/// Every peer's answer to one key query.
#[derive(Debug, Default)]
pub struct KeyAnswers {
    pub answers: Vec<KeyAnswer>,
    pub unanswered: Vec<UnansweredPeer>,
}

/// The transport to the peers, provided by the server.
pub trait PeerKeySource: Send + Sync + Debug {
    /// Asks every peer about `query`'s keys, giving up on each at
    /// `deadline`.
    fn ask_keys(
        &self,
        query: KeyQuery,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = KeyAnswers> + Send + '_>>;
}

/// What the peers said about one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtPeers {
    /// A peer stored it: answer as stored, store nothing.
    Stored {
        /// The first replica that said so.
        replica: String,
    },
    /// A peer is storing it right now (the client sent it there too): the
    /// client should retry, by which time that peer has stored it or not.
    InFlight {
        /// The replica storing it.
        replica: String,
    },
    /// No peer that answered has it: store it. Some peers may not have
    /// answered ([`KeysAtPeers::unanswered`]); then it may be stored there
    /// too, and is stored here all the same (availability first).
    Unknown,
}

/// What the peers said about a set of keys.
#[derive(Debug, Default)]
pub struct KeysAtPeers {
    found: HashMap<String, AtPeers>,
    /// Peers that gave no usable answer, with why.
    pub unanswered: Vec<UnansweredPeer>,
}

impl KeysAtPeers {
    /// Reads the answers to one query of `keys` (answers decoded against
    /// it). A key one peer stored is stored, whatever another says; one a
    /// peer stores right now and none stored is in flight.
    pub fn gather(keys: &[String], answers: KeyAnswers) -> Self {
        let mut found: HashMap<String, AtPeers> = HashMap::new();
        for answer in &answers.answers {
            for &index in &answer.in_flight {
                if let Some(key) = usize::try_from(index).ok().and_then(|i| keys.get(i)) {
                    found
                        .entry(key.clone())
                        .or_insert_with(|| AtPeers::InFlight {
                            replica: answer.replica.clone(),
                        });
                }
            }
        }
        for answer in &answers.answers {
            for &index in &answer.stored {
                if let Some(key) = usize::try_from(index).ok().and_then(|i| keys.get(i)) {
                    let stored = AtPeers::Stored {
                        replica: answer.replica.clone(),
                    };
                    match found.get_mut(key) {
                        Some(at @ AtPeers::InFlight { .. }) => *at = stored,
                        Some(_) => {}
                        None => {
                            found.insert(key.clone(), stored);
                        }
                    }
                }
            }
        }
        Self {
            found,
            unanswered: answers.unanswered,
        }
    }

    /// Adds what another query (of other keys) found.
    pub fn extend(&mut self, other: KeysAtPeers) {
        for (key, at) in other.found {
            self.found.entry(key).or_insert(at);
        }
        for peer in other.unanswered {
            if !self.unanswered.iter().any(|p| p.peer == peer.peer) {
                self.unanswered.push(peer);
            }
        }
    }

    /// What the peers said about `key` (`Unknown` for a key not asked).
    pub fn at_peers(&self, key: &str) -> AtPeers {
        self.found.get(key).cloned().unwrap_or(AtPeers::Unknown)
    }

    /// The keys some peer stored.
    pub fn stored(&self) -> impl Iterator<Item = &str> {
        self.found
            .iter()
            .filter(|(_, at)| matches!(at, AtPeers::Stored { .. }))
            .map(|(key, _)| key.as_str())
    }

    /// Whether every peer answered: a key none stored is then stored
    /// nowhere else.
    pub fn complete(&self) -> bool {
        self.unanswered.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| (*k).to_owned()).collect()
    }

    fn answer(replica: &str, stored: &[u32], in_flight: &[u32]) -> KeyAnswer {
        KeyAnswer {
            replica: replica.into(),
            stored: stored.to_vec(),
            in_flight: in_flight.to_vec(),
        }
    }

    #[test]
    fn a_query_and_an_answer_read_back_as_written() {
        let query = KeyQuery {
            keys: keys(&["agent-1/w1", "agent-1/w2/0", "日本語"]),
        };
        assert_eq!(KeyQuery::decode(&query.encode()).unwrap(), query);
        let answer = answer("kiln-1", &[0, 2], &[1]);
        assert_eq!(KeyAnswer::decode(&answer.encode(), 3).unwrap(), answer);
    }

    #[test]
    fn a_query_of_keys_no_replica_stores_is_refused_whole() {
        let bad = |keys: Vec<String>| KeyQuery::decode(&KeyQuery { keys }.encode()).unwrap_err();
        assert!(matches!(bad(vec![]), KeyWireError::KeyCount { count: 0 }));
        let many = vec!["k".to_owned(); MAX_KEYS_PER_QUERY + 1];
        assert!(matches!(bad(many), KeyWireError::KeyCount { .. }));
        let error = bad(keys(&["fine", "new\nline"]));
        assert!(
            matches!(error, KeyWireError::BadKey { index: 1, .. }),
            "{error}"
        );
        let long = "k".repeat(300);
        assert!(matches!(
            bad(vec![long]),
            KeyWireError::BadKey { index: 0, .. }
        ));
        for junk in [&b"{\"keys\":[\"a\"],\"more\":1}"[..], b"[]", b"", b"\xff"] {
            assert!(
                matches!(KeyQuery::decode(junk), Err(KeyWireError::Json { .. })),
                "{junk:?}"
            );
        }
        let huge = vec![b' '; MAX_KEY_QUERY_BYTES + 1];
        assert!(matches!(
            KeyQuery::decode(&huge),
            Err(KeyWireError::TooLarge { .. })
        ));
    }

    /// An answer about keys the query did not hold, or about one key twice,
    /// could say a key is stored that was never asked: it is refused, and
    /// the peer counts as unanswered.
    #[test]
    fn an_answer_naming_keys_outside_the_query_is_refused() {
        let bad = |a: KeyAnswer, asked| KeyAnswer::decode(&a.encode(), asked).unwrap_err();
        let error = bad(answer("p", &[2], &[]), 2);
        assert!(matches!(
            error,
            KeyWireError::BadIndex { index: 2, asked: 2 }
        ));
        assert!(matches!(
            bad(answer("p", &[0, 0], &[]), 2),
            KeyWireError::BadIndex { index: 0, .. }
        ));
        assert!(matches!(
            bad(answer("p", &[1], &[1]), 2),
            KeyWireError::BadIndex { index: 1, .. }
        ));
        assert!(matches!(
            bad(answer("p", &[u32::MAX], &[]), 2),
            KeyWireError::BadIndex { .. }
        ));
        let huge = vec![b' '; MAX_KEY_ANSWER_BYTES + 1];
        assert!(matches!(
            KeyAnswer::decode(&huge, 1),
            Err(KeyWireError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_key_one_peer_stored_is_stored_whatever_the_others_say() {
        let asked = keys(&["a", "b", "c", "d"]);
        let found = KeysAtPeers::gather(
            &asked,
            KeyAnswers {
                answers: vec![answer("r1", &[], &[0, 1]), answer("r2", &[1, 2], &[])],
                unanswered: vec![],
            },
        );
        assert_eq!(
            found.at_peers("a"),
            AtPeers::InFlight {
                replica: "r1".into()
            }
        );
        assert_eq!(
            found.at_peers("b"),
            AtPeers::Stored {
                replica: "r2".into()
            }
        );
        assert_eq!(
            found.at_peers("c"),
            AtPeers::Stored {
                replica: "r2".into()
            }
        );
        assert_eq!(found.at_peers("d"), AtPeers::Unknown);
        assert_eq!(found.at_peers("never asked"), AtPeers::Unknown);
        assert!(found.complete());
        let mut stored: Vec<&str> = found.stored().collect();
        stored.sort_unstable();
        assert_eq!(stored, ["b", "c"]);
    }

    #[test]
    fn an_unanswered_peer_leaves_the_answer_incomplete_and_is_listed_once() {
        let unanswered = |peer: &str| UnansweredPeer {
            peer: peer.into(),
            error: "refused".into(),
        };
        let mut found = KeysAtPeers::gather(
            &keys(&["a"]),
            KeyAnswers {
                answers: vec![answer("r1", &[], &[])],
                unanswered: vec![unanswered("r2")],
            },
        );
        assert_eq!(found.at_peers("a"), AtPeers::Unknown);
        assert!(!found.complete());
        found.extend(KeysAtPeers::gather(
            &keys(&["b"]),
            KeyAnswers {
                answers: vec![answer("r1", &[0], &[])],
                unanswered: vec![unanswered("r2")],
            },
        ));
        assert_eq!(found.unanswered.len(), 1);
        assert_eq!(
            found.at_peers("b"),
            AtPeers::Stored {
                replica: "r1".into()
            }
        );
    }
}
