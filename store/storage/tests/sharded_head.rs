//! The live head's shards (issue 13): pods spread over several shards are
//! answered, flushed into one block per cut and replayed exactly like one
//! head, and a query racing cuts and parallel ingests never sees a value
//! twice or loses an acknowledged one.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use kiln_storage::Store;
use kiln_testkit::profiles::*;

async fn open_sharded(root: &Path, shards: usize) -> Store {
    open_with(root, shards, 4).await
}

async fn open_with(root: &Path, shards: usize, ingest_workers: usize) -> Store {
    let mut config = config(&root.join("data"), "r1");
    config.head_shards = shards;
    config.ingest_workers = ingest_workers;
    Store::open(config, local_bucket(&root.join("bucket")))
        .await
        .expect("open store")
}

/// [`request`] with each pod a workload of its own (its `service_name`):
/// the live head shards by workload, so replicas of one would share a shard.
fn spread_request(pod: &str, time_ms: i64, pprof: Vec<u8>) -> kiln_storage::IngestRequest {
    let mut request = request(pod, time_ms, pprof);
    let mut labels: Vec<_> = request.labels.iter().cloned().collect();
    labels.push(kiln_engine::model::Label::new("service_name", pod));
    request.labels = kiln_engine::model::LabelSet::new(labels);
    request
}

fn pod(i: usize) -> String {
    format!("pod-{i:02}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_over_four_shards_flush_into_one_block_and_replay_exactly() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = open_sharded(root.path(), 4).await;
    let mut sent = vec![0i64; 24];
    let mut ingests = Vec::new();
    for round in 0..3u64 {
        for (i, pod_total) in sent.iter_mut().enumerate() {
            let (pprof, total) = cpu_profile(round * 100 + i as u64, 20 + i);
            *pod_total += total;
            let store = store.clone();
            let request = spread_request(&pod(i), BASE_MS + round as i64 * 10_000, pprof);
            ingests.push(tokio::spawn(async move { store.ingest(request).await }));
        }
    }
    for ingest in ingests {
        ingest.await.expect("task").expect("ingest");
    }
    let all: i64 = sent.iter().sum();
    let check = |store: Store, what: &'static str| {
        let sent = sent.clone();
        async move {
            assert_eq!(
                total(&store, &all_selector(), everything()).await,
                all,
                "{what}"
            );
            for (i, &expected) in sent.iter().enumerate() {
                let got = total(&store, &pod_selector(&pod(i)), everything()).await;
                assert_eq!(got, expected, "{what}: {}", pod(i));
            }
            let pods = store
                .label_values("pod", &[], everything())
                .await
                .expect("label values");
            assert_eq!(pods.len(), sent.len(), "{what}");
        }
    };
    check(store.clone(), "live shards").await;
    assert!(store.stats().head_profiles == 72);

    store.flush().await.expect("flush");
    let blocks = store.blocks();
    assert_eq!(blocks.len(), 1, "one block per cut, whatever the shards");
    assert_eq!(blocks[0].profiles, 72);
    assert_eq!(store.stats().head_bytes, 0);
    check(store.clone(), "flushed block").await;

    // A fourth round stays in the WAL; the store dies without a flush and
    // reopens with another shard count.
    let mut extra = 0;
    for i in 0..sent.len() {
        let (pprof, total) = cpu_profile(900 + i as u64, 10);
        extra += total;
        store
            .ingest(spread_request(&pod(i), BASE_MS + 40_000, pprof))
            .await
            .expect("ingest");
    }
    drop(store);
    let store = open_sharded(root.path(), 3).await;
    assert_eq!(store.replay_report().records, sent.len() as u64);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        all + extra
    );
    store.flush().await.expect("flush");
    assert_eq!(store.blocks().len(), 2);
    assert_eq!(
        total(&store, &all_selector(), everything()).await,
        all + extra
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queries_racing_cuts_and_parallel_ingest_count_each_value_once() {
    let root = tempfile::tempdir().expect("tempdir");
    race_queries_cuts_and_ingests(open_sharded(root.path(), 4).await).await;
}

/// One ingest turn for four writers: each write's decode and apply wait for
/// it in turn, and none of them can hold it while waiting for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_ingest_turn_serves_parallel_writers_racing_cuts() {
    let root = tempfile::tempdir().expect("tempdir");
    race_queries_cuts_and_ingests(open_with(root.path(), 4, 1).await).await;
}

async fn race_queries_cuts_and_ingests(store: Store) {
    // What every writer has been told is stored, and what it has sent.
    let acked = Arc::new(AtomicI64::new(0));
    let sent = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..4u64 {
        let (store, acked, sent) = (store.clone(), Arc::clone(&acked), Arc::clone(&sent));
        writers.push(tokio::spawn(async move {
            for n in 0..30u64 {
                let (pprof, total) = cpu_profile(writer * 1000 + n, 15);
                sent.fetch_add(total, Ordering::SeqCst);
                let pod = format!("writer-{writer}-{}", n % 5);
                let time = BASE_MS + n as i64 * 1_000;
                store
                    .ingest(spread_request(&pod, time, pprof))
                    .await
                    .expect("ingest");
                acked.fetch_add(total, Ordering::SeqCst);
            }
        }));
    }
    let flusher = {
        let (store, done) = (store.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut flushes = 0;
            while !done.load(Ordering::SeqCst) {
                store.flush().await.expect("flush");
                flushes += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            flushes
        })
    };
    let mut queries = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        let floor = acked.load(Ordering::SeqCst);
        let got = total(&store, &all_selector(), everything()).await;
        let ceiling = sent.load(Ordering::SeqCst);
        assert!(
            floor <= got && got <= ceiling,
            "query saw {got}: acknowledged before it {floor}, sent after it {ceiling}"
        );
        queries += 1;
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    done.store(true, Ordering::SeqCst);
    let flushes = flusher.await.expect("flusher");
    let all = acked.load(Ordering::SeqCst);
    assert_eq!(total(&store, &all_selector(), everything()).await, all);
    store.flush().await.expect("flush");
    assert_eq!(total(&store, &all_selector(), everything()).await, all);
    assert!(
        queries > 5 && flushes > 2,
        "{queries} queries, {flushes} flushes"
    );
}
