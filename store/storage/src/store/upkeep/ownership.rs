//! Who may do what in a shared bucket: one process per replica name
//! (cleaning up and compacting that replica's blocks), one process of all
//! replicas for retention. Both through [`crate::lease::Lease`]. Two
//! processes under one name would compact the same sources into two blocks
//! and count their data twice, and replicas applying their own retention
//! (different during a rollout) would delete data the others keep.
//!
//! A process's holder id is kept in its data directory (`store-id`), so a
//! store restarted on the same disk after a crash takes its name back at
//! once; a store on another disk waits for the lease to lapse, or refuses
//! to start when the holder is seen renewing it. The data directory itself
//! is locked (`flock` on `<data dir>/lock`), so two processes never share
//! one WAL.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use crate::error::StorageError;
use crate::lease::{Lease, LeaseState};

use crate::store::{Store, StoreConfig};

const HOLDER_FILE: &str = "store-id";
const LOCK_FILE: &str = "lock";

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |source| StorageError::Wal { op, path, source }
}

/// Locks the data directory for this process; the lock lasts as long as the
/// returned file is open.
pub(in crate::store) fn lock_data_dir(config: &StoreConfig) -> Result<fs::File, StorageError> {
    let dir = &config.data_dir;
    fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    let path = dir.join(LOCK_FILE);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err("open lock", &path))?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        return Err(StorageError::Config {
            message: format!(
                "data directory {} is in use by another kiln-store process",
                dir.display()
            ),
        });
    }
    Ok(file)
}

/// This process's holder id: read from the data directory, or drawn and
/// stored there durably on first start.
pub(in crate::store) fn holder_id(config: &StoreConfig) -> Result<String, StorageError> {
    let path = config.data_dir.join(HOLDER_FILE);
    match fs::read_to_string(&path) {
        Ok(text) if ulid::Ulid::from_string(text.trim()).is_ok() => {
            return Ok(text.trim().to_string());
        }
        Ok(_) => tracing::warn!(path = %path.display(), "replacing an unreadable store id"),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_err("read store id", &path)(err)),
    }
    let id = ulid::Ulid::new().to_string();
    let tmp = path.with_extension("tmp");
    let mut file = fs::File::create(&tmp).map_err(io_err("create store id", &tmp))?;
    file.write_all(id.as_bytes())
        .map_err(io_err("write store id", &tmp))?;
    file.sync_all().map_err(io_err("fsync store id", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("rename store id", &path))?;
    fs::File::open(&config.data_dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", &config.data_dir))?;
    Ok(id)
}

/// The lease of one replica name.
pub(in crate::store) fn replica_lease(
    bucket: &crate::bucket::Bucket,
    config: &StoreConfig,
    holder: &str,
) -> Lease {
    Lease::new(
        bucket.object_store(),
        &format!("replica/{}", config.replica),
        holder,
        &config.replica,
        config.lease_ttl,
    )
}

/// The lease of retention, shared by every replica.
pub(in crate::store) fn retention_lease(
    bucket: &crate::bucket::Bucket,
    config: &StoreConfig,
    holder: &str,
) -> Lease {
    Lease::new(
        bucket.object_store(),
        "retention",
        holder,
        &config.replica,
        config.lease_ttl,
    )
}

/// Takes the replica name's lease before the store opens. Another process
/// holding it is waited for: if its lease lapses, the name is taken over
/// (that process is gone); if it is renewed meanwhile, that process is live
/// and the store refuses to open. A bucket that cannot be read does not stop
/// the store from opening (its WAL and uploads need no lease); the
/// maintenance loop takes the lease later, and nothing destructive happens
/// before it does.
pub(in crate::store) async fn claim_replica_name(
    lease: &Lease,
    config: &StoreConfig,
) -> Result<(), StorageError> {
    let mut first_seen: Option<u64> = None;
    loop {
        match lease.acquire().await {
            Ok(LeaseState::Held { .. }) => return Ok(()),
            Ok(LeaseState::HeldByOther { generation, record }) => {
                match first_seen {
                    None => {
                        tracing::warn!(
                            replica = %config.replica,
                            holder = %record.holder,
                            "another store holds this replica name; waiting to see whether it is live"
                        );
                        first_seen = Some(generation);
                    }
                    Some(seen) if generation > seen => {
                        return Err(StorageError::ReplicaNameInUse {
                            replica: config.replica.clone(),
                            holder: record.holder,
                        });
                    }
                    Some(_) => {}
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err) => {
                tracing::warn!(
                    replica = %config.replica,
                    error = %err,
                    "cannot read the replica lease; opening without it (no cleanup or compaction until it is held)"
                );
                return Ok(());
            }
        }
    }
}

impl Store {
    /// True when this process holds its replica name's lease with at least
    /// half its time left, renewing it first if needed: the check before
    /// anything that deletes or compacts this replica's blocks.
    pub(in crate::store) async fn hold_replica_lease(&self) -> bool {
        if !self.bucket_is_ours().await.unwrap_or(false) {
            return false;
        }
        hold(
            &self.shared.upkeep.replica_lease,
            &self.shared.config,
            "replica",
        )
        .await
    }

    /// Like [`Store::hold_replica_lease`] for the retention lease, which any
    /// replica may take once it lapses.
    pub(in crate::store) async fn hold_retention_lease(&self) -> bool {
        if !self.bucket_is_ours().await.unwrap_or(false) {
            return false;
        }
        hold(
            &self.shared.upkeep.retention_lease,
            &self.shared.config,
            "retention",
        )
        .await
    }

    /// [`Store::hold_replica_lease`], confirmed by the bucket: before
    /// uploading a compacted block or deleting its sources.
    pub(in crate::store) async fn confirm_replica_lease(&self) -> bool {
        self.hold_replica_lease().await
            && confirm(&self.shared.upkeep.replica_lease, "replica").await
    }

    /// [`Store::hold_retention_lease`], confirmed by the bucket: before
    /// deleting what retention expired.
    pub(in crate::store) async fn confirm_retention_lease(&self) -> bool {
        self.hold_retention_lease().await
            && confirm(&self.shared.upkeep.retention_lease, "retention").await
    }

    /// Renews the leases this process holds (the replica lease always, so a
    /// name lost during an outage is taken back once nobody else has it).
    pub(in crate::store) async fn renew_leases(&self) {
        let shared = &self.shared;
        renew(&shared.upkeep.replica_lease, "replica").await;
        if shared.upkeep.retention_lease.is_held(Duration::ZERO) {
            renew(&shared.upkeep.retention_lease, "retention").await;
        }
    }

    /// Gives both leases up, at shutdown, so the next holder need not wait.
    pub(in crate::store) async fn release_leases(&self) {
        for lease in [
            &self.shared.upkeep.replica_lease,
            &self.shared.upkeep.retention_lease,
        ] {
            if let Err(err) = lease.release().await {
                tracing::warn!(error = %err, "cannot release a lease; it will lapse");
            }
        }
    }
}

async fn hold(lease: &Lease, config: &StoreConfig, what: &str) -> bool {
    if lease.is_held(config.lease_ttl / 2) {
        return true;
    }
    renew(lease, what).await
}

/// Writes the lease's next generation if this process may; true when it
/// holds the lease afterwards.
async fn renew(lease: &Lease, what: &str) -> bool {
    match lease.acquire().await {
        Ok(LeaseState::Held { .. }) => true,
        Ok(LeaseState::HeldByOther { record, .. }) => {
            if what == "replica" {
                // Another process took this name over (this one could not
                // renew in time): it alone compacts and cleans up now.
                tracing::error!(holder = %record.holder, "this replica name's lease is held by another store; no cleanup or compaction here until it is released");
            } else {
                tracing::debug!(lease = what, holder = %record.holder, replica = %record.replica, "lease held by another store");
            }
            false
        }
        Err(err) => {
            tracing::warn!(lease = what, error = %err, "cannot renew lease");
            lease.is_held(Duration::ZERO)
        }
    }
}

/// The bucket's word that the generation held is still the newest: after
/// [`hold`], the check before a step that must not be done twice.
async fn confirm(lease: &Lease, what: &str) -> bool {
    match lease.confirm().await {
        Ok(true) => true,
        Ok(false) => {
            tracing::error!(
                lease = what,
                "the lease this store held was taken by another store; not acting on it"
            );
            false
        }
        Err(err) => {
            tracing::warn!(lease = what, error = %err, "cannot confirm the lease; not acting on it now");
            false
        }
    }
}
