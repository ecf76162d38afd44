//! Listing the bucket into the view, so blocks written (or deleted) by
//! other replicas become visible (or disappear).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use crate::bucket::IncompleteUpload;
use crate::error::StorageError;
use crate::planner::unexplained_gaps;
use crate::store::{Store, lock, read, write};

/// Listings taken again, at most, while known blocks vanish unexplained.
const GAP_RELISTS: usize = 2;

impl Store {
    /// Lists the bucket and replaces the view's blocks with what it holds;
    /// returns the incomplete uploads found. Needs no maintenance lock: a
    /// block that reached the view while the bucket was being listed (a
    /// flush or a compaction here) is kept, or it would vanish from queries
    /// until the next listing; blocks known before the listing and missing
    /// from it are gone.
    pub(in crate::store) async fn relist(&self) -> Result<Vec<IncompleteUpload>, StorageError> {
        let shared = &self.shared;
        let _listing = shared.catalog.listing.lock().await;
        let known = read(&shared.catalog.view).blocks.clone();
        let skip: BTreeSet<String> = lock(&shared.catalog.corrupt)
            .keys()
            .filter(|id| !known.contains_key(*id))
            .cloned()
            .collect();
        let mut listing = shared
            .catalog
            .note_listing(shared.bucket.list_blocks(&known, &skip).await)?;
        // A known block missing with nothing naming it as a source may be a
        // compaction elsewhere caught half-way by a listing that is not a
        // snapshot (`unexplained_gaps`); a listing started after its sources'
        // deletion holds its output. Retention's deletions look the same:
        // each costs GAP_RELISTS extra listings, in one relist only.
        for _ in 0..GAP_RELISTS {
            let gaps = unexplained_gaps(&known, &listing.blocks);
            if gaps.is_empty() {
                break;
            }
            tracing::debug!(?gaps, "known blocks vanished unexplained; listing again");
            listing = shared
                .catalog
                .note_listing(shared.bucket.list_blocks(&known, &skip).await)?;
        }
        {
            let mut view = write(&shared.catalog.view);
            for (id, meta) in &view.blocks {
                if !known.contains_key(id) && !listing.blocks.contains_key(id) {
                    listing.blocks.insert(id.clone(), meta.clone());
                }
            }
            view.set_blocks(listing.blocks);
        }
        {
            let view = read(&shared.catalog.view);
            lock(&shared.catalog.cache).retain(|id| view.blocks.contains_key(id));
        }
        {
            let mut corrupt = lock(&shared.catalog.corrupt);
            for c in listing.corrupt {
                corrupt.entry(c.id).or_insert(c.error);
            }
        }
        shared.catalog.listings_done.fetch_add(1, Ordering::SeqCst);
        Ok(listing.incomplete)
    }

    /// How many listings have completed; see [`Store::relist_after`].
    pub(super) fn listings_done(&self) -> u64 {
        self.shared.catalog.listings_done.load(Ordering::SeqCst)
    }

    /// Lists the bucket again unless a listing completed since `seen`
    /// (another query that found a block gone did it already, or is doing
    /// it: this waits for it).
    pub(super) async fn relist_after(&self, seen: u64) -> Result<(), StorageError> {
        if self.listings_done() != seen {
            return Ok(());
        }
        {
            let _wait = self.shared.catalog.listing.lock().await;
            if self.listings_done() != seen {
                return Ok(());
            }
        }
        self.relist().await.map(drop)
    }
}
