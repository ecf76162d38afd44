//! Idempotency keys across replicas (issue 50): a profile a client resends
//! to another replica than the one that stored it is stored once, whether
//! that first replica is up (the second asks it) or was killed (the second
//! stores it, and the first drops its copy when it replays its log).
//!
//! Two real `kiln-store` processes share a bucket on SeaweedFS, a real
//! distributed object store, through its S3 gateway (`seaweedfs_` tests,
//! which `./kiln-dev test` runs once its background build of SeaweedFS is
//! done), and on a local-disk bucket. The client is tonic's WriteRaw
//! client, as the agent's, marking its resends with `kiln-retry-attempt`.
//! Every answer is a fan-out query at each replica, so a profile stored
//! twice, at either, shows.

use std::net::SocketAddr;

use kiln_api::parca::profilestore::v1alpha1::profile_store_service_client::ProfileStoreServiceClient;
use kiln_api::parca::profilestore::v1alpha1::{
    Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest,
};
use kiln_pprof::{FunctionSpec, ProfileBuilder, encode_gzip};
use kiln_testkit::clock::now_nanos;
use kiln_testkit::http::{enc, free_port, get, http};
use kiln_testkit::moto::AWS_ENV;
use kiln_testkit::seaweedfs::{SeaweedFs, start_seaweedfs};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// What one profile adds: one sample of 30 ms.
const PROFILE_TOTAL: i64 = 30_000_000;

/// Where the replicas' bucket is.
enum Bucket {
    LocalDisk(tempfile::TempDir),
    SeaweedFs(SeaweedFs),
}

impl Bucket {
    fn flags(&self) -> Vec<String> {
        match self {
            Bucket::LocalDisk(dir) => vec![
                "--bucket".into(),
                dir.path().to_str().expect("utf-8 path").into(),
            ],
            Bucket::SeaweedFs(server) => server.store_flags("kiln"),
        }
    }

    fn env(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            Bucket::LocalDisk(_) => &[],
            Bucket::SeaweedFs(_) => &AWS_ENV,
        }
    }
}

/// A bucket on a fresh SeaweedFS, or `None` (said, and failed in CI) when
/// it is not built.
fn seaweedfs() -> Option<Bucket> {
    let server = start_seaweedfs()?;
    server.create_bucket("kiln");
    Some(Bucket::SeaweedFs(server))
}

/// Two replicas that know each other. Nothing is flushed while a test
/// runs (`--flush-interval 10m`): a killed replica's profile stays in its
/// WAL, which is what its restart replays.
struct Pair {
    bucket: Bucket,
    addrs: [SocketAddr; 2],
    stores: [Option<StoreProcess>; 2],
}

impl Pair {
    fn new(bucket: Bucket) -> Self {
        let mut pair = Pair {
            bucket,
            addrs: [free_port(), free_port()],
            stores: [None, None],
        };
        for i in 0..2 {
            pair.start(i, tempfile::tempdir().expect("data dir"));
        }
        pair
    }

    fn start(&mut self, i: usize, data_dir: tempfile::TempDir) {
        let peers = format!("r0=http://{},r1=http://{}", self.addrs[0], self.addrs[1]);
        let mut args = self.bucket.flags();
        args.extend(
            [
                "--replica",
                &format!("r{i}"),
                "--peers",
                &peers,
                "--flush-interval",
                "10m",
                "--relist-interval",
                "1s",
            ]
            .map(str::to_owned),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.stores[i] = Some(StoreProcess::start_on(
            KILN_STORE,
            self.addrs[i],
            data_dir,
            &args,
            self.bucket.env(),
        ));
    }

    /// SIGKILL: no flush, the profile stays in the WAL only.
    fn kill(&mut self, i: usize) -> tempfile::TempDir {
        self.stores[i].take().expect("running").kill()
    }

    fn store(&self, i: usize) -> &StoreProcess {
        self.stores[i].as_ref().expect("running")
    }
}

fn cpu_profile(time_nanos: i64) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10_000_000)
        .time(time_nanos, 10_000_000_000);
    let main = builder.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let location = builder.location(0, 0x1000, &[(main, 1)]);
    builder.sample(&[location], &[PROFILE_TOTAL], &[]);
    encode_gzip(&builder.finish())
}

/// One keyed profile of `pod`, as the agent sends it.
fn keyed(pod: &str, key: &str, time_nanos: i64) -> WriteRawRequest {
    WriteRawRequest {
        series: vec![RawProfileSeries {
            labels: Some(LabelSet {
                labels: [("__name__", "process_cpu"), ("pod", pod)]
                    .map(|(name, value)| Label {
                        name: name.into(),
                        value: value.into(),
                    })
                    .to_vec(),
            }),
            samples: vec![RawSample {
                raw_profile: cpu_profile(time_nanos),
                executable_info: vec![],
            }],
        }],
        kiln_idempotency_keys: vec![key.into()],
        ..Default::default()
    }
}

/// Sends `request` to the replica at `addr`, marked as resend `attempt`
/// (none: a first send), and asserts it was answered as stored.
async fn send(addr: SocketAddr, request: WriteRawRequest, attempt: Option<u32>) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid url")
        .connect()
        .await
        .expect("connect over h2c");
    let mut client = ProfileStoreServiceClient::new(channel);
    let mut request = tonic::Request::new(request);
    request
        .metadata_mut()
        .insert("kiln-series-status", "1".parse().expect("ascii"));
    if let Some(attempt) = attempt {
        request
            .metadata_mut()
            .insert("kiln-retry-attempt", attempt.into());
    }
    let response = client.write_raw(request).await.expect("WriteRaw answered");
    assert!(
        response.get_ref().kiln_series_status.is_empty(),
        "not stored: {:?}",
        response.get_ref().kiln_series_status
    );
}

/// A replica's fan-out total for `pod`, and its `Kiln-Partial` header.
fn pod_total(addr: SocketAddr, pod: &str) -> (i64, Option<String>) {
    let query = enc(&format!(r#"process_cpu{{pod="{pod}"}}"#));
    let response = http(
        addr,
        "GET",
        &format!("/api/v1/flamegraph?query={query}&from=now-1h"),
        &[],
        b"",
    )
    .expect("query");
    assert_eq!(response.status, 200, "{}", response.text());
    let partial = response.header("kiln-partial").map(str::to_owned);
    (response.json()["total"].as_i64().unwrap_or(0), partial)
}

/// The value of the sample `line` (name and labels) on a replica's
/// `/metrics`.
fn metric(addr: SocketAddr, line: &str) -> u64 {
    let text = get(addr, "/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{line} not on /metrics:\n{text}"))
}

const REPEATS_BY_PEER: &str = r#"kiln_idempotency_repeats_total{answered_by="peer"}"#;
const REPEATS_HERE: &str = r#"kiln_idempotency_repeats_total{answered_by="replica"}"#;
const LOOKUP_FAILURES: &str = "kiln_idempotency_peer_lookup_failures_total";
const REPLAY_DROPPED: &str = "kiln_wal_replay_dropped_stored_elsewhere_total";
const REPLAY_UNVERIFIED: &str = "kiln_wal_replay_kept_unverified_total";

/// The client's first try reached r0, which stored it and was killed
/// before the answer left; the client resends it to r1, which cannot ask
/// r0 and stores it; r0 comes back, finds the key at r1 while replaying
/// and drops its copy. Every replica then counts the profile once.
async fn killed_replica_drops_what_the_retry_stored_elsewhere(bucket: Bucket) {
    let mut pair = Pair::new(bucket);
    let now = now_nanos();
    let profile = keyed("killed", "agent-a/w1", now);
    send(pair.addrs[0], profile.clone(), None).await;
    assert_eq!(pod_total(pair.addrs[1], "killed"), (PROFILE_TOTAL, None));
    let r0_disk = pair.kill(0);

    send(pair.addrs[1], profile.clone(), Some(1)).await;
    assert_eq!(
        metric(pair.addrs[1], LOOKUP_FAILURES),
        1,
        "r0 could not be asked"
    );
    assert_eq!(metric(pair.addrs[1], REPEATS_BY_PEER), 0);
    let (total, partial) = pod_total(pair.addrs[1], "killed");
    assert_eq!(total, PROFILE_TOTAL, "r1 stored the resend");
    assert!(
        partial.is_some_and(|p| p.contains("peers_unanswered=r0")),
        "r0's copy is out of sight while it is down"
    );

    pair.start(0, r0_disk);
    for &addr in &pair.addrs {
        assert_eq!(
            pod_total(addr, "killed"),
            (PROFILE_TOTAL, None),
            "replica at {addr}: the profile once"
        );
    }
    assert_eq!(
        metric(pair.addrs[0], REPLAY_DROPPED),
        1,
        "{}",
        pair.store(0).log()
    );
    assert_eq!(metric(pair.addrs[0], REPLAY_UNVERIFIED), 0);

    // r0 no longer claims the key (it dropped its copy), so a resend to
    // it is answered from r1, and still stored once.
    send(pair.addrs[0], profile, Some(2)).await;
    assert_eq!(metric(pair.addrs[0], REPEATS_BY_PEER), 1);
    assert_eq!(metric(pair.addrs[0], REPEATS_HERE), 0);
    for &addr in &pair.addrs {
        assert_eq!(pod_total(addr, "killed"), (PROFILE_TOTAL, None), "{addr}");
    }
}

/// r0 stored the first try and stays up; the resend reaches r1, which
/// asks r0 and stores nothing. A resend to r0 itself is answered from its
/// own keys, without asking anyone.
async fn a_resend_to_another_live_replica_is_answered_by_the_one_that_stored_it(bucket: Bucket) {
    let pair = Pair::new(bucket);
    let now = now_nanos();
    let profile = keyed("live", "agent-b/w1", now);
    send(pair.addrs[0], profile.clone(), None).await;
    send(pair.addrs[1], profile.clone(), Some(1)).await;
    for &addr in &pair.addrs {
        assert_eq!(pod_total(addr, "live"), (PROFILE_TOTAL, None), "{addr}");
    }
    assert_eq!(metric(pair.addrs[1], REPEATS_BY_PEER), 1);
    assert_eq!(metric(pair.addrs[1], LOOKUP_FAILURES), 0);
    send(pair.addrs[0], profile.clone(), Some(2)).await;
    assert_eq!(metric(pair.addrs[0], REPEATS_HERE), 1);
    assert_eq!(metric(pair.addrs[0], REPEATS_BY_PEER), 0);
    for &addr in &pair.addrs {
        assert_eq!(pod_total(addr, "live"), (PROFILE_TOTAL, None), "{addr}");
    }
    // A first send of a new key is stored where it lands, without asking.
    send(pair.addrs[1], keyed("live", "agent-b/w2", now), None).await;
    for &addr in &pair.addrs {
        assert_eq!(pod_total(addr, "live"), (2 * PROFILE_TOTAL, None), "{addr}");
    }
}

/// r0 stored a profile and was killed; while it is down, r1 is stopped
/// too, so r0's replay can ask no one: it keeps the record (a record is
/// never dropped on a guess), and counts it.
async fn a_replay_no_peer_answers_keeps_its_records_and_counts_them(bucket: Bucket) {
    let mut pair = Pair::new(bucket);
    send(
        pair.addrs[0],
        keyed("alone", "agent-c/w1", now_nanos()),
        None,
    )
    .await;
    let r0_disk = pair.kill(0);
    drop(pair.kill(1));
    pair.start(0, r0_disk);
    assert_eq!(metric(pair.addrs[0], REPLAY_UNVERIFIED), 1);
    assert_eq!(metric(pair.addrs[0], REPLAY_DROPPED), 0);
    let (total, partial) = pod_total(pair.addrs[0], "alone");
    assert_eq!(total, PROFILE_TOTAL);
    assert!(partial.is_some_and(|p| p.contains("peers_unanswered=r1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seaweedfs_a_killed_replica_drops_the_profile_a_retry_stored_at_another() {
    let Some(bucket) = seaweedfs() else {
        return;
    };
    killed_replica_drops_what_the_retry_stored_elsewhere(bucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seaweedfs_a_retry_at_another_live_replica_is_answered_by_the_peer() {
    let Some(bucket) = seaweedfs() else {
        return;
    };
    a_resend_to_another_live_replica_is_answered_by_the_one_that_stored_it(bucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_drops_the_profile_a_retry_stored_at_another() {
    let bucket = Bucket::LocalDisk(tempfile::tempdir().expect("bucket dir"));
    killed_replica_drops_what_the_retry_stored_elsewhere(bucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_no_peer_answers_keeps_its_keyed_records() {
    let bucket = Bucket::LocalDisk(tempfile::tempdir().expect("bucket dir"));
    a_replay_no_peer_answers_keeps_its_records_and_counts_them(bucket).await;
}
