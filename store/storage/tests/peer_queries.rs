//! A query at one replica counts every other replica's data exactly once,
//! whichever step of its way to the bucket that data is on: in a peer's
//! live head, in a head it cut and is still uploading (which the querier
//! may already list, as a slow put lands before it answers), or in a
//! block it uploaded that the querier has not listed yet. Real stores on
//! one bucket; only the HTTP hop between them (store/tests/replica_queries.rs
//! covers it) is a direct call here, so the races can be held open.

use std::pin::Pin;
use std::time::{Duration, Instant};

use kiln_storage::peers::{PeerAnswers, PeerScope, PeerSource, UnansweredPeer};
use kiln_storage::store::record_incomplete;
use kiln_storage::{Store, StoreConfig};
use kiln_testkit::buckets::faulty::FaultyBucket;
use kiln_testkit::profiles::*;

/// The other replicas, asked by calling them.
#[derive(Debug)]
struct DirectPeers(Vec<Store>);

impl PeerSource for DirectPeers {
    fn ask(
        &self,
        scope: PeerScope,
        _deadline: Instant,
    ) -> Pin<Box<dyn std::future::Future<Output = PeerAnswers> + Send + '_>> {
        Box::pin(async move {
            let mut answers = PeerAnswers::default();
            for peer in &self.0 {
                match peer.peer_head(scope.clone(), 1 << 30).await {
                    Ok(head) => answers.heads.push(head),
                    Err(err) => answers.unanswered.push(UnansweredPeer {
                        peer: "peer".into(),
                        error: err.to_string(),
                    }),
                }
            }
            answers
        })
    }
}

/// A peer that never answers.
#[derive(Debug)]
struct SilentPeer;

impl PeerSource for SilentPeer {
    fn ask(
        &self,
        _scope: PeerScope,
        _deadline: Instant,
    ) -> Pin<Box<dyn std::future::Future<Output = PeerAnswers> + Send + '_>> {
        Box::pin(async {
            PeerAnswers {
                heads: Vec::new(),
                unanswered: vec![UnansweredPeer {
                    peer: "b".into(),
                    error: "no answer by the query's deadline".into(),
                }],
            }
        })
    }
}

/// Never lists on its own in these tests: each listing is the test's.
fn rarely_listing(mut config: StoreConfig) -> StoreConfig {
    config.relist_interval = Duration::from_secs(3600);
    config.flush_interval = Duration::from_secs(3600);
    config
}

async fn total_at(store: &Store) -> i64 {
    let (total, incomplete) = record_incomplete(total(store, &all_selector(), everything())).await;
    assert!(incomplete.is_complete(), "{incomplete:?}");
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_data_is_counted_once_at_every_step_of_its_way_to_the_bucket() {
    let root = tempfile::tempdir().expect("tempdir");
    let bucket = local_bucket(&root.path().join("bucket"));
    let faulty = FaultyBucket::new(bucket.clone());
    let writer = Store::open(
        rarely_listing(config(&root.path().join("b"), "b")),
        faulty.clone() as std::sync::Arc<dyn object_store::ObjectStore>,
    )
    .await
    .expect("b opens");
    let querier = Store::open(rarely_listing(config(&root.path().join("a"), "a")), bucket)
        .await
        .expect("a opens");
    querier.connect_peers(std::sync::Arc::new(DirectPeers(vec![writer.clone()])));

    // In the peer's live head.
    let (p, expected) = cpu_profile(1, 20);
    writer
        .ingest(request("pod-b", BASE_MS, p))
        .await
        .expect("ingest");
    assert_eq!(total_at(&querier).await, expected, "live in the peer");

    // Cut and being uploaded: the block lands in the bucket at once, but
    // its put answers 3 s later, so the peer still holds it as pending.
    faulty.slow_puts_of("meta.json", Duration::from_secs(3));
    let flush = {
        let writer = writer.clone();
        tokio::spawn(async move { writer.flush().await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(writer.blocks().len(), 0, "the upload has not answered yet");
    assert_eq!(total_at(&querier).await, expected, "pending, unlisted");
    querier.refresh_blocks().await.expect("relist");
    assert_eq!(querier.blocks().len(), 1, "the querier lists the block");
    assert_eq!(
        total_at(&querier).await,
        expected,
        "pending at the peer and listed here: once"
    );
    flush.await.expect("join").expect("flush");

    // Uploaded, in a block the querier has not listed.
    let (p, more) = cpu_profile(2, 20);
    writer
        .ingest(request("pod-b", BASE_MS + 60_000, p))
        .await
        .expect("ingest");
    writer.flush().await.expect("flush");
    assert_eq!(querier.blocks().len(), 1, "not listed yet");
    assert_eq!(
        total_at(&querier).await,
        expected + more,
        "uploaded by the peer, unlisted here"
    );
    querier.refresh_blocks().await.expect("relist");
    assert_eq!(total_at(&querier).await, expected + more, "listed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_peer_makes_the_answer_partial() {
    let root = tempfile::tempdir().expect("tempdir");
    let querier = Store::open(
        config(&root.path().join("a"), "a"),
        local_bucket(&root.path().join("bucket")),
    )
    .await
    .expect("a opens");
    querier.connect_peers(std::sync::Arc::new(SilentPeer));
    let (p, _) = cpu_profile(1, 20);
    querier
        .ingest(request("pod-a", BASE_MS, p))
        .await
        .expect("ingest");
    let (_, incomplete) = record_incomplete(total(&querier, &all_selector(), everything())).await;
    assert_eq!(incomplete.unanswered_peers.len(), 1, "{incomplete:?}");
    assert_eq!(incomplete.unanswered_peers[0].peer, "b");
    assert!(!incomplete.is_complete());
}
