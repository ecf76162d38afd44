//! The background tasks: the flush loop, the maintenance loop (re-listing,
//! compaction, retention) and the lease heartbeat, each until shutdown.

use crate::store::{Store, lock, now_ms};

/// Starts the flush loop, the maintenance loop and the lease heartbeat.
pub(in crate::store) fn spawn_loops(store: &Store) {
    let flush = tokio::spawn(flush_loop(store.clone()));
    let maintain = tokio::spawn(maintenance_loop(store.clone()));
    let heartbeat = tokio::spawn(lease_loop(store.clone()));
    lock(&store.shared.upkeep.tasks).extend([flush, maintain, heartbeat]);
}

/// Renews the leases every third of their time, so a store waiting for
/// this replica name sees it live, and a lease survives a missed renewal.
async fn lease_loop(store: Store) {
    let mut shutdown = store.shared.upkeep.shutdown_tx.subscribe();
    let mut tick = tokio::time::interval(store.shared.config.lease_ttl / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        store.renew_leases().await;
    }
}

async fn flush_loop(store: Store) {
    let mut shutdown = store.shared.upkeep.shutdown_tx.subscribe();
    let mut tick = tokio::time::interval(store.shared.config.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
            () = store.shared.upkeep.flush_now.notified() => {}
        }
        if let Err(err) = store.flush().await {
            tracing::warn!(error = %err, reason = err.reason(), "flush failed; retrying next interval");
        }
    }
}

async fn maintenance_loop(store: Store) {
    let config = &store.shared.config;
    let mut shutdown = store.shared.upkeep.shutdown_tx.subscribe();
    let mut tick = tokio::time::interval(config.relist_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last_compaction = tokio::time::Instant::now();
    let mut last_retention: Option<tokio::time::Instant> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        if let Err(err) = store.refresh_blocks().await {
            tracing::warn!(error = %err, "re-listing the bucket failed");
        }
        if last_compaction.elapsed() >= config.compaction_interval {
            last_compaction = tokio::time::Instant::now();
            if let Err(err) = store.compact(now_ms()).await {
                tracing::warn!(error = %err, "compaction failed");
            }
            if let Err(err) = store.maintain_recorded(now_ms()).await {
                tracing::warn!(error = %err, "merging recorded series failed");
            }
        }
        if last_retention.is_none_or(|t| t.elapsed() >= config.retention_interval) {
            last_retention = Some(tokio::time::Instant::now());
            if let Err(err) = store.enforce_retention(now_ms()).await {
                tracing::warn!(error = %err, "retention failed");
            }
        }
    }
}
