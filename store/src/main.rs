//! The `kiln-store` binary: configuration, storage, serving, shutdown.

use anyhow::Context as _;
use clap::CommandFactory as _;
use kiln_storage::bucket::{Bucket, BucketConfig};
use kiln_storage::{Store, StoreConfig};
use kiln_store::config::{BucketSettings, Config, ObjectStoreKind, StoreSettings};
use kiln_store::server;
use kiln_store::state::AppState;
use tokio::sync::watch;

/// How long in-flight requests may run after a stop signal.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

fn main() -> anyhow::Result<()> {
    let config = Config::load(&StoreSettings::command().get_matches())?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&config.log)
                .with_context(|| format!("invalid log filter {:?}", config.log))?,
        )
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(config.limits.blocking_threads())
        .build()
        .context("starting the async runtime")?
        .block_on(run(config))
}

async fn run(config: Config) -> anyhow::Result<()> {
    let state = AppState::new(&config);
    let listener = server::bind(config.listen).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(wait_for_signal(stop_tx.clone()));
    tracing::info!(listen = %config.listen, replica = %config.replica, "kiln-store listening");

    let main_server = tokio::spawn(server::serve(
        listener,
        server::router(state.clone()),
        config.connections,
        state.metrics().connections(),
        stopped(stop_rx.clone()),
    ));
    if let Some(addr) = config.metrics_listen {
        let metrics_listener = server::bind(addr).await?;
        tokio::spawn(server::serve(
            metrics_listener,
            server::metrics_router(state.clone()),
            config.connections,
            state.metrics().connections(),
            stopped(stop_rx.clone()),
        ));
    }

    // Recovery runs while the port is already up: /healthz answers and
    // /readyz says 503 until the WAL is replayed and the bucket listed.
    let bucket = bucket(&config)?;
    let store_config = store_config(&config)?;
    // Before opening: replay asks the peers which of its keyed records
    // they stored while this replica was down.
    let peers = kiln_store::query::peers::client(
        &config.peers,
        state.read_tokens().first().cloned(),
        config.peer_connect_timeout,
    );
    let peer_keys = peers
        .as_ref()
        .map(kiln_store::ingest::peer_keys::key_source);
    let store = tokio::select! {
        opened = Store::open_among_peers(store_config, bucket, peer_keys) => {
            opened.context("opening the store")?
        }
        _ = stopped(stop_rx.clone()) => {
            tracing::info!("stopped during recovery");
            return Ok(());
        }
    };
    if let Some(peers) = peers {
        tracing::info!(
            peers = config.peers.len(),
            "queries ask the other replicas for their unflushed data, resent requests for their keys"
        );
        store.connect_peers(peers);
    }
    state.set_store(store.clone());
    let cache_keeper = tokio::spawn(
        state
            .symbolizer()
            .clone()
            .keep_cache(store.clone(), stop_rx.clone()),
    );
    tracing::info!(
        blocks = store.blocks().len(),
        "store ready (recovery finished)"
    );

    // Wait for the stop signal, then give in-flight requests a bounded time
    // to finish (a stuck client must not keep the head from being flushed;
    // anything acknowledged is in the WAL either way).
    stopped(stop_rx.clone()).await;
    let served = match tokio::time::timeout(DRAIN_TIMEOUT, main_server).await {
        Ok(joined) => joined.context("server task failed")?,
        Err(_) => {
            tracing::warn!("requests still running after {DRAIN_TIMEOUT:?}; flushing anyway");
            Ok(())
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, cache_keeper)
        .await
        .is_err()
    {
        tracing::warn!("the symbol cache was not written before exit");
    }
    tracing::info!("flushing the head before exit");
    let flushed = store.shutdown().await;
    served.context("serving failed")?;
    flushed.context("flushing the head at shutdown")?;
    tracing::info!("shut down cleanly");
    Ok(())
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn wait_for_signal(stop: watch::Sender<bool>) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGTERM; only ctrl-c stops the store");
                    let _ = ctrl_c.await;
                    let _ = stop.send(true);
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
    let _ = stop.send(true);
}

fn store_config(config: &Config) -> anyhow::Result<StoreConfig> {
    let mut store = StoreConfig::new(&config.data_dir, &config.replica);
    store.store_name = config.store_name.clone();
    store.flush_interval = config.flush_interval;
    store.relist_interval = config.relist_interval;
    store.retention = config.retention;
    store.query_timeout = config.query_timeout;
    store.accepted_times = kiln_storage::AcceptedTimes::Recent {
        max_future_skew: config.max_future_skew,
    };
    store.max_total_bytes = config.retention_bytes;
    store.apply_memory_budget(config.memory_budget);
    store.compaction_interval = config.compaction_interval;
    if let Some(shards) = config.head_shards {
        store.head_shards = shards;
    }
    if let Some(workers) = config.ingest_workers {
        store.ingest_workers = workers;
    }
    store.decode_limits = kiln_store::state::decode_limits(&config.limits);
    store.ingest_limits.max_labels_per_series = config.limits.max_labels_per_series;
    store.ingest_limits.max_label_name_bytes = config.limits.max_label_bytes;
    store.ingest_limits.max_label_value_bytes = config.limits.max_label_bytes;
    store.ingest_limits.max_series_per_profile_name = config.limits.max_series_per_profile_name;
    store.ingest_limits.max_series_per_namespace = config.limits.max_series_per_namespace;
    store.ingest_limits.max_series = config.limits.max_series;
    store.ingest_limits.max_samples_per_profile = config.limits.max_samples_per_profile;
    store.max_inflight_ingests = config.limits.max_inflight;
    // One query memory: the bodies of queries in flight share it at the
    // server, and each running query holds at most its share of it in
    // the store.
    store.query_memory_bytes = config.limits.query_memory_bytes as u64;
    store.recording_rules = std::sync::Arc::new(
        kiln_store::config::compile_rules(&config.recording.rules)
            .context("compiling recording rules")?,
    );
    store.recorded_retention = config.recording.retention;
    Ok(store)
}

fn bucket(config: &Config) -> anyhow::Result<Bucket> {
    bucket_config(&config.bucket)?
        .open(config.bucket.prefix.as_deref())
        .context("configuring object storage")
}

fn bucket_config(bucket: &BucketSettings) -> anyhow::Result<BucketConfig> {
    let missing_feature = |kind: &str, feature: &str| {
        anyhow::anyhow!("object store {kind} needs kiln-store built with the `{feature}` feature")
    };
    Ok(match bucket.kind {
        ObjectStoreKind::Local => BucketConfig::Local {
            dir: bucket.name.clone().into(),
        },
        #[cfg(feature = "aws")]
        ObjectStoreKind::S3 => BucketConfig::S3 {
            bucket: bucket.name.clone(),
            region: bucket.region.clone(),
            endpoint: bucket.endpoint.clone(),
            access_key_id: None,
            secret_access_key: None,
            allow_http: bucket.allow_http,
        },
        #[cfg(not(feature = "aws"))]
        ObjectStoreKind::S3 => return Err(missing_feature("s3", "aws")),
        #[cfg(feature = "gcp")]
        ObjectStoreKind::Gcs => BucketConfig::Gcs {
            bucket: bucket.name.clone(),
        },
        #[cfg(not(feature = "gcp"))]
        ObjectStoreKind::Gcs => return Err(missing_feature("gcs", "gcp")),
        #[cfg(feature = "azure")]
        ObjectStoreKind::Azure => BucketConfig::Azure {
            account: bucket.azure_account.clone().unwrap_or_default(),
            container: bucket.name.clone(),
        },
        #[cfg(not(feature = "azure"))]
        ObjectStoreKind::Azure => return Err(missing_feature("azure", "azure")),
    })
}
