//! Which store a bucket prefix belongs to. Replicas of one store share a
//! prefix; two stores must not, or each would answer queries with the
//! other's profiles and apply its own retention to the other's blocks.
//!
//! A store with a name (`StoreConfig::store_name`; the operator gives each
//! `ProfileStore` its namespace and name) claims its prefix by creating
//! `kiln-store.json` there with `PutMode::Create`, so of two stores racing
//! for an empty prefix exactly one wins. Every later open, and the first
//! upload or lease after an open that could not reach the bucket, reads it
//! back: a prefix claimed under another name is refused, before anything
//! is written to it or deleted from it. A store without a name claims
//! nothing and checks nothing, as before this claim existed.

use std::sync::Mutex;

use object_store::ObjectStoreExt;
use object_store::path::Path;

use crate::bucket::Bucket;
use crate::error::StorageError;
use crate::store::{Store, StoreConfig, lock, now_ms};

/// The claim's object, at the root of the store's prefix.
pub const CLAIM_FILE: &str = "kiln-store.json";

/// The claim, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BucketClaimRecord {
    /// The store whose replicas use this prefix.
    pub store: String,
    /// The replica that claimed it, for people reading the bucket.
    pub claimed_by_replica: String,
    /// When, by that replica's clock, for people reading the bucket.
    pub claimed_at_ms: i64,
}

/// What this process knows of its claim on the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) enum ClaimState {
    /// The store has no name: nothing is claimed or checked.
    Unnamed,
    /// The prefix is this store's.
    Confirmed,
    /// The bucket did not answer yet; nothing is written to it or deleted
    /// from it until it does.
    Pending,
}

/// The claim state a store keeps.
#[derive(Debug)]
pub(in crate::store) struct BucketClaim {
    state: Mutex<ClaimState>,
}

impl BucketClaim {
    pub(in crate::store) fn new(state: ClaimState) -> Self {
        Self {
            state: Mutex::new(state),
        }
    }
}

/// Whether a prefix claimed by `owner` may be used by store `name`. Pure.
pub fn may_use(owner: &BucketClaimRecord, name: &str) -> bool {
    owner.store == name
}

fn claim_path() -> Path {
    Path::from(CLAIM_FILE)
}

fn claim_err(message: String) -> StorageError {
    StorageError::Lease {
        path: CLAIM_FILE.to_owned(),
        message,
    }
}

/// Reads the prefix's claim, creating it for `name` when there is none.
/// `Ok(false)` when the bucket did not answer.
async fn read_or_create(
    bucket: &Bucket,
    config: &StoreConfig,
    name: &str,
) -> Result<bool, StorageError> {
    let store = bucket.object_store();
    let path = claim_path();
    // One retry: a claim created between our read and our create is read
    // back the second time.
    for _ in 0..2 {
        match store.get(&path).await {
            Ok(found) => {
                let bytes = match found.bytes().await {
                    Ok(bytes) => bytes,
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot read the bucket's store claim");
                        return Ok(false);
                    }
                };
                let owner: BucketClaimRecord = serde_json::from_slice(&bytes)
                    .map_err(|source| claim_err(format!("unreadable store claim: {source}")))?;
                if may_use(&owner, name) {
                    return Ok(true);
                }
                return Err(StorageError::BucketClaimedByAnotherStore {
                    store: name.to_owned(),
                    owner: owner.store,
                });
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the bucket's store claim");
                return Ok(false);
            }
        }
        let record = BucketClaimRecord {
            store: name.to_owned(),
            claimed_by_replica: config.replica.clone(),
            claimed_at_ms: now_ms(),
        };
        let json = serde_json::to_vec(&record).map_err(|source| claim_err(source.to_string()))?;
        let put = crate::lease::create_object(store.as_ref(), &path, json).await;
        match put {
            Ok(()) => {
                tracing::info!(store = name, "claimed the bucket prefix for this store");
                return Ok(true);
            }
            Err(object_store::Error::AlreadyExists { .. }) => continue,
            Err(err) => {
                tracing::warn!(error = %err, "cannot write the bucket's store claim");
                return Ok(false);
            }
        }
    }
    Err(claim_err("the claim was created, then vanished".to_owned()))
}

/// The claim at open: refused when another store claimed the prefix,
/// pending when the bucket did not answer.
pub(in crate::store) async fn claim_at_open(
    bucket: &Bucket,
    config: &StoreConfig,
) -> Result<ClaimState, StorageError> {
    let Some(name) = config.store_name.as_deref() else {
        return Ok(ClaimState::Unnamed);
    };
    let timeout = config.open_listing_timeout;
    match tokio::time::timeout(timeout, read_or_create(bucket, config, name)).await {
        Ok(Ok(true)) => Ok(ClaimState::Confirmed),
        Ok(Ok(false)) | Err(_) => {
            tracing::warn!(
                store = name,
                "opening before the bucket's store claim could be checked; no upload or cleanup until it is"
            );
            Ok(ClaimState::Pending)
        }
        Ok(Err(err)) => Err(err),
    }
}

impl Store {
    /// True once this store may write to and delete from its prefix:
    /// unnamed, or its claim confirmed (checked again while pending).
    /// A prefix another store claimed is an error, logged each time.
    pub(in crate::store) async fn bucket_is_ours(&self) -> Result<bool, StorageError> {
        let claim = &self.shared.upkeep.bucket_claim;
        if *lock(&claim.state) != ClaimState::Pending {
            return Ok(true);
        }
        let config = &self.shared.config;
        let Some(name) = config.store_name.as_deref() else {
            return Ok(true);
        };
        match read_or_create(&self.shared.bucket, config, name).await {
            Ok(true) => {
                *lock(&claim.state) = ClaimState::Confirmed;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(err) => {
                tracing::error!(error = %err, "this store's bucket prefix belongs to another store; nothing is uploaded or deleted");
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_serves_the_store_that_claimed_it_only() {
        let owner = BucketClaimRecord {
            store: "profiling/kiln".into(),
            claimed_by_replica: "kiln-0".into(),
            claimed_at_ms: 1,
        };
        assert!(may_use(&owner, "profiling/kiln"));
        assert!(!may_use(&owner, "staging/kiln"));
        assert!(!may_use(&owner, "profiling/kiln2"));
    }
}
