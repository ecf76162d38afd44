//! What a query could not read, handed back beside its answer so the server
//! can mark the answer partial instead of passing off missing data as
//! complete (a 200 with data silently missing is worse than an error):
//! blocks skipped as unreadable, a bucket never listed, WAL ranges held
//! back until the bucket answers.
//!
//! The store's query methods keep their plain return types; a caller that
//! wants to know wraps its work in [`record_incomplete`], and every query
//! run inside it (on the same task) adds what it missed.

use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::bucket::CorruptBlock;
use crate::peers::UnansweredPeer;
use crate::store::lock;

/// Why an answer may lack data. Empty (`is_complete`) when nothing was
/// missed.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Incomplete {
    /// Blocks in the query's range that could not be read (corrupt, or the
    /// bucket failed to return them), by id, each with why.
    pub skipped_blocks: Vec<CorruptBlock>,
    /// The bucket has not been listed since the store opened, so no block
    /// was read at all.
    pub bucket_not_listed: bool,
    /// WAL ranges held back until the bucket says whether their block was
    /// uploaded: their data is in neither the heads nor a visible block.
    pub held_wal_ranges: usize,
    /// Peers that did not answer for their unflushed data in time (or
    /// whose answer was unusable): what they acknowledged since their last
    /// flush is missing.
    pub unanswered_peers: Vec<UnansweredPeer>,
    /// Build ids whose debug info was still being fetched or read when the
    /// answer was due: their frames are named by module and offset.
    pub symbols_pending: usize,
}

impl Incomplete {
    /// True when the answer holds everything the store has for the query.
    pub fn is_complete(&self) -> bool {
        self.skipped_blocks.is_empty()
            && !self.bucket_not_listed
            && self.held_wal_ranges == 0
            && self.unanswered_peers.is_empty()
            && self.symbols_pending == 0
    }

    pub(super) fn add(&mut self, other: Incomplete) {
        for block in other.skipped_blocks {
            if !self.skipped_blocks.iter().any(|b| b.id == block.id) {
                self.skipped_blocks.push(block);
            }
        }
        self.bucket_not_listed |= other.bucket_not_listed;
        self.held_wal_ranges = self.held_wal_ranges.max(other.held_wal_ranges);
        self.symbols_pending = self.symbols_pending.max(other.symbols_pending);
        for peer in other.unanswered_peers {
            if !self.unanswered_peers.iter().any(|p| p.peer == peer.peer) {
                self.unanswered_peers.push(peer);
            }
        }
    }
}

tokio::task_local! {
    static RECORDER: Arc<Mutex<Incomplete>>;
}

/// Runs `work` and returns its output with everything the store's queries
/// run inside it could not read.
pub async fn record_incomplete<F: Future>(work: F) -> (F::Output, Incomplete) {
    let recorder = Arc::new(Mutex::new(Incomplete::default()));
    let output = RECORDER.scope(Arc::clone(&recorder), work).await;
    let incomplete = std::mem::take(&mut *lock(&recorder));
    (output, incomplete)
}

/// Adds what one query missed to the enclosing [`record_incomplete`], if
/// any (a caller that did not ask is not told).
pub(super) fn note(missed: Incomplete) {
    if missed.is_complete() {
        return;
    }
    let _ = RECORDER.try_with(|recorder| lock(recorder).add(missed));
}

/// Passes `missed` on to the enclosing [`record_incomplete`], if any: for
/// a caller that recorded one step apart, to act on what that step missed,
/// and whose answer still lacks it.
pub fn note_incomplete(missed: Incomplete) {
    note(missed);
}

/// Notes, for the enclosing [`record_incomplete`], that `build_ids` build
/// ids of the answer's frames were not symbolized in time: the server's
/// symbolizer calls it, the store's own queries never do.
pub fn note_symbols_pending(build_ids: usize) {
    note(Incomplete {
        symbols_pending: build_ids,
        ..Incomplete::default()
    });
}
