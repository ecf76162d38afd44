//! Both sides of a query across replicas (see [`crate::peers`]): answering
//! a peer with this replica's selected unflushed data, and choosing, from
//! the peers' answers, what a query here reads besides its own view.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kiln_engine::model::{BlockMeta, Matcher, PROFILE_TYPE_LABEL, Selector, TimeRange};
use kiln_engine::{
    Block, CompiledMatcher, CompiledSelector, LabelSet, MergedProfile, ProfileType, QueryError,
    Queryable, StepExemplars, Timeline, compile_matchers, encode_selection,
};

use super::View;
use crate::error::StorageError;
use crate::peers::{PeerAnswers, PeerBlock, PeerHead, PeerScope, UnansweredPeer};
use crate::store::{Store, read};

/// The matchers a peer is asked with for `selector`: its own plus its
/// profile type, as [`CompiledSelector`] evaluates it.
pub(super) fn selector_matchers(selector: &Selector) -> Vec<Matcher> {
    let mut matchers = selector.matchers.clone();
    matchers.push(Matcher {
        name: PROFILE_TYPE_LABEL.to_owned(),
        op: kiln_engine::MatchOp::Equal,
        value: selector.profile_type.to_string(),
    });
    matchers
}

impl Store {
    /// Connects the other replicas: from now on every query also reads
    /// their unflushed data. Set once; a second call is ignored.
    pub fn connect_peers(&self, peers: Arc<dyn crate::peers::PeerSource>) {
        let _ = self.shared.catalog.peers.set(peers);
    }

    /// This replica's answer to a peer's query: its live head's and its
    /// pending heads' data selected by `scope`, and the blocks it uploaded
    /// recently, taken in one snapshot (under every shard's read lock and
    /// the view's, as a query's own read is).
    ///
    /// Runs in the peer pool, never the query pool, and refuses an answer
    /// past `max_bytes` rather than hold it.
    pub async fn peer_head(
        &self,
        scope: PeerScope,
        max_bytes: usize,
    ) -> Result<PeerHead, StorageError> {
        let shared = Arc::clone(&self.shared);
        let turn = Arc::clone(&shared.catalog.peer_runners)
            .acquire_owned()
            .await
            .map_err(|_closed| StorageError::ShuttingDown)?;
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let matchers = compile_matchers(&scope.matchers)
                .map_err(|source| StorageError::Query { source })?;
            let range = scope.range();
            let replica = shared.config.replica.clone();
            let mut answer = PeerHead {
                replica: replica.clone(),
                ..PeerHead::default()
            };
            let mut held = 0usize;
            let mut add = |pending: Option<String>, heads: &[&kiln_engine::Head]| {
                let id = ulid::Ulid::new().to_string();
                let encoded =
                    encode_selection(heads, &matchers, range, scope.stacks, (&id, &replica))
                        .map_err(|source| StorageError::Block {
                            id: id.clone(),
                            source,
                        })?;
                if let Some((_, bytes)) = encoded {
                    held += bytes.len();
                    if held > max_bytes {
                        return Err(StorageError::PeerAnswerTooLarge { max_bytes });
                    }
                    answer.blocks.push(PeerBlock {
                        pending,
                        bytes: Bytes::from(bytes),
                    });
                }
                Ok(())
            };
            let frozen = {
                let shards = shared.ingest.head.read_all();
                let view = read(&shared.catalog.view);
                let frozen = view.frozen.clone();
                let uploaded = view.recent_uploads();
                drop(view);
                // Each shard is released once encoded, so ingest into it
                // goes on while the others are.
                for shard in shards {
                    add(None, &[&*shard])?;
                }
                answer.uploaded = uploaded;
                frozen
            };
            for pending in &frozen {
                let heads: Vec<&kiln_engine::Head> = pending.heads.iter().collect();
                add(Some(pending.id.clone()), &heads)?;
            }
            Ok(answer)
        })
        .await
        .map_err(|e| StorageError::task("peer answer", e))?
    }
}

impl View {
    /// Every block id the view lists or knows a listed compaction
    /// replaced: what a peer's pending head or upload may already be.
    pub(super) fn known_ids(&self) -> BTreeSet<String> {
        self.blocks
            .keys()
            .chain(self.hidden.iter())
            .cloned()
            .collect()
    }
}

/// What a query reads from its peers, chosen against its own view.
#[derive(Default)]
pub(super) struct FromPeers {
    /// Peers' live data and the pending heads whose blocks the view does
    /// not hold.
    pub(super) blocks: Vec<PeerData>,
    /// Blocks the peers uploaded that the view had not listed.
    pub(super) unlisted: Vec<BlockMeta>,
    pub(super) unanswered: Vec<UnansweredPeer>,
}

impl FromPeers {
    /// Chooses from `answers`, given the ids of the blocks the query's own
    /// view lists or knows replaced (`known`): a pending head
    /// whose block the view lists, or a listed compaction replaced, is in
    /// the bucket already and skipped; an upload the view has not listed
    /// is read from the bucket. Each block is decoded here (on the query's
    /// blocking thread); one that does not decode makes its peer
    /// unanswered.
    pub(super) fn choose(answers: PeerAnswers, known: &BTreeSet<String>) -> Self {
        let mut chosen = FromPeers {
            unanswered: answers.unanswered,
            ..FromPeers::default()
        };
        let mut unlisted: BTreeMap<String, BlockMeta> = BTreeMap::new();
        for head in &answers.heads {
            for meta in &head.uploaded {
                if !known.contains(&meta.id) {
                    unlisted.insert(meta.id.clone(), meta.clone());
                }
            }
        }
        for head in answers.heads {
            let mut decoded = Vec::new();
            let mut failed = None;
            for block in head.blocks {
                if let Some(id) = &block.pending
                    && (known.contains(id) || unlisted.contains_key(id))
                {
                    continue;
                }
                match Block::decode_shared(block.bytes) {
                    Ok(data) => decoded.push(PeerData(data)),
                    Err(err) => {
                        failed = Some(err.to_string());
                        break;
                    }
                }
            }
            match failed {
                None => chosen.blocks.extend(decoded),
                Some(error) => chosen.unanswered.push(UnansweredPeer {
                    peer: head.replica,
                    error: format!("its answer did not decode: {error}"),
                }),
            }
        }
        chosen.unlisted = unlisted.into_values().collect();
        chosen
    }
}

/// A peer's unflushed data: queried like a block, but never cached (it is
/// not one: the next query's answer differs), so [`Queryable::as_block`]
/// stays `None`.
pub(super) struct PeerData(Block);

impl Queryable for PeerData {
    fn profile_types(&self, range: TimeRange) -> Vec<ProfileType> {
        self.0.profile_types(range)
    }
    fn label_names(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<String>, QueryError> {
        self.0.label_names(matchers, range)
    }
    fn label_values(
        &self,
        name: &str,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<String>, QueryError> {
        self.0.label_values(name, matchers, range)
    }
    fn series(
        &self,
        matchers: &[CompiledMatcher],
        range: TimeRange,
    ) -> Result<Vec<LabelSet>, QueryError> {
        self.0.series(matchers, range)
    }
    fn merge_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut MergedProfile,
    ) -> Result<(), QueryError> {
        self.0.merge_into(selector, range, into)
    }
    fn timeline_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut Timeline,
    ) -> Result<(), QueryError> {
        self.0.timeline_into(selector, range, into)
    }
    fn exemplars_into(
        &self,
        selector: &CompiledSelector,
        range: TimeRange,
        into: &mut StepExemplars,
    ) -> Result<(), QueryError> {
        self.0.exemplars_into(selector, range, into)
    }
}

/// Asks the connected peers, if any, for `scope` on the calling (blocking)
/// thread, giving them until `deadline`.
pub(super) fn ask_peers(
    peers: Option<&Arc<dyn crate::peers::PeerSource>>,
    runtime: &tokio::runtime::Handle,
    scope: &PeerScope,
    deadline: Instant,
) -> PeerAnswers {
    match peers {
        Some(peers) => runtime.block_on(peers.ask(scope.clone(), deadline)),
        None => PeerAnswers::default(),
    }
}
