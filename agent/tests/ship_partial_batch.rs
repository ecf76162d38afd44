//! A WriteRaw batch the store stores only in part. Such a batch is not atomic, so a retry of
//! the whole batch would double what was stored and a drop would lose the rest. The agent's
//! shipper, against a real tonic server on loopback that answers per-series
//! statuses, drops the profile the store refused, sends the one it could not
//! store again alone, and never sends a stored profile twice.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_agent::metrics::AgentMetrics;
use kiln_agent::ship::{ShipItem, ShipQueue, Sink, run_shipper};
use kiln_api::parca::profilestore::v1alpha1::profile_store_service_server::{
    ProfileStoreService, ProfileStoreServiceServer,
};
use kiln_api::parca::profilestore::v1alpha1::{
    KilnSeriesStatus, WriteRawRequest, WriteRawResponse,
};

/// What one request carried: the `pod` label of each series, whether it
/// asked for per-series statuses, and its idempotency keys.
type Received = (Vec<String>, bool, Vec<String>);

/// Answers the first request with series 1 refused and series 2 not
/// stored (the store was shutting down), later ones with everything stored.
#[derive(Default, Clone)]
struct PartialStore {
    requests: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl ProfileStoreService for PartialStore {
    async fn write_raw(
        &self,
        request: tonic::Request<WriteRawRequest>,
    ) -> Result<tonic::Response<WriteRawResponse>, tonic::Status> {
        let asked = request
            .metadata()
            .get("kiln-series-status")
            .is_some_and(|v| v.as_bytes() == b"1");
        let request = request.into_inner();
        let keys = request.kiln_idempotency_keys.clone();
        let pods: Vec<String> = request
            .series
            .iter()
            .map(|s| {
                s.labels
                    .as_ref()
                    .and_then(|l| l.labels.iter().find(|l| l.name == "pod"))
                    .map_or_else(String::new, |l| l.value.clone())
            })
            .collect();
        let mut requests = self.requests.lock().expect("not poisoned");
        let first = requests.is_empty();
        requests.push((pods, asked, keys));
        let status = |series, code: tonic::Code, reason: &str| KilnSeriesStatus {
            series,
            stored_profiles: 0,
            code: code as i32,
            reason: reason.into(),
            message: format!("series {series}: {reason}"),
        };
        Ok(tonic::Response::new(WriteRawResponse {
            kiln_series_status: if first {
                vec![
                    status(1, tonic::Code::InvalidArgument, "label_too_long"),
                    status(2, tonic::Code::Unavailable, "shutting_down"),
                ]
            } else {
                Vec::new()
            },
        }))
    }
}

fn item(pod: &str) -> ShipItem {
    ShipItem {
        labels: vec![
            ("__name__".into(), "process_cpu".into()),
            ("pod".into(), pod.into()),
        ],
        pprof_gzip: vec![0x1f, 0x8b, 0x08],
        file_stem: pod.into(),
    }
}

#[tokio::test]
async fn a_partly_stored_batch_resends_only_what_was_not_stored() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let store = PartialStore::default();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ProfileStoreServiceServer::new(store.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let metrics = Arc::new(AgentMetrics::default());
    let queue = ShipQueue::new(16, Arc::clone(&metrics));
    for pod in ["stored", "refused", "unavailable"] {
        queue.push(item(pod));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shipper = tokio::spawn(run_shipper(
        Sink::Store {
            endpoint: format!("http://{address}"),
            replicas: None,
            token: None,
        },
        queue.clone(),
        Arc::clone(&metrics),
        stopped,
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.requests.lock().expect("not poisoned").len() < 2 {
        assert!(Instant::now() < deadline, "the retry never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send_replace(true);
    shipper.await.expect("shipper ends");
    server.abort();

    let requests = store.requests.lock().expect("not poisoned").clone();
    let sent: Vec<(Vec<String>, bool)> = requests
        .iter()
        .map(|(pods, asked, _)| (pods.clone(), *asked))
        .collect();
    assert_eq!(
        sent,
        vec![
            (
                vec!["stored".into(), "refused".into(), "unavailable".into()],
                true
            ),
            (vec!["unavailable".into()], true),
        ],
        "only the profile not stored is sent again"
    );
    // With the key it had the first time, so a store that did store it
    // after all keeps one copy.
    assert_eq!(requests[0].2.len(), 3);
    assert_eq!(requests[1].2, vec![requests[0].2[2].clone()]);
    assert_eq!(metrics.profiles_shipped.get(), 2);
    assert_eq!(metrics.drops("rejected"), 1);
    assert!(queue.is_empty());
}
