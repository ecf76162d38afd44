//! Replicas of one store answer every query with every replica's
//! acknowledged data, their unflushed heads included: three `kiln-store`
//! processes share a bucket, each takes its own writer, and a query at any
//! of them counts exactly what the three acknowledged, while they write,
//! flush every second and list the bucket only once a minute (so blocks
//! the others just uploaded reach a query through their answers, not a
//! listing). A replica that is killed makes the others' answers say
//! `Kiln-Partial`, never pass a short answer off as whole, and once it is
//! back on its disk the answers are exact again.
//!
//! The same runs on a local-disk bucket and on SeaweedFS, a real
//! distributed object store, through its S3 gateway (`seaweedfs_` tests,
//! which `./kiln-dev test` runs once its background build of SeaweedFS is
//! done).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use kiln_testkit::http::{enc, free_port, http};
use kiln_testkit::moto::AWS_ENV;
use kiln_testkit::seaweedfs::{SeaweedFs, start_seaweedfs};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// What one profile adds: 7 samples at 100 Hz, in ns.
const PROFILE_TOTAL: i64 = 70_000_000;

const REPLICAS: usize = 3;

/// Sent and acknowledged totals of all writers.
#[derive(Default)]
struct Ledger {
    sent: AtomicI64,
    acked: AtomicI64,
}

/// Where the replicas' bucket is.
enum Bucket {
    LocalDisk(tempfile::TempDir),
    SeaweedFs(SeaweedFs),
}

impl Bucket {
    fn local() -> Self {
        Bucket::LocalDisk(tempfile::tempdir().expect("bucket dir"))
    }

    /// A bucket on a fresh SeaweedFS, or `None` (said, and failed in CI)
    /// when it is not built.
    fn seaweedfs() -> Option<Self> {
        let server = start_seaweedfs()?;
        server.create_bucket("kiln");
        Some(Bucket::SeaweedFs(server))
    }

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

struct Cluster {
    relist_interval: &'static str,
    bucket: Bucket,
    addrs: Vec<SocketAddr>,
    stores: Vec<Option<StoreProcess>>,
}

impl Cluster {
    fn new(relist_interval: &'static str, bucket: Bucket) -> Self {
        let mut cluster = Cluster {
            relist_interval,
            bucket,
            addrs: (0..REPLICAS).map(|_| free_port()).collect(),
            stores: (0..REPLICAS).map(|_| None).collect(),
        };
        for i in 0..REPLICAS {
            cluster.start(i, tempfile::tempdir().expect("data dir"));
        }
        cluster
    }

    fn peers(&self) -> String {
        self.addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| format!("r{i}=http://{addr}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn start(&mut self, i: usize, data_dir: tempfile::TempDir) {
        let mut args = self.bucket.flags();
        args.extend(
            [
                "--replica",
                &format!("r{i}"),
                "--peers",
                &self.peers(),
                "--flush-interval",
                "1s",
                "--relist-interval",
                self.relist_interval,
            ]
            .map(str::to_owned),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let store = StoreProcess::start_on(
            KILN_STORE,
            self.addrs[i],
            data_dir,
            &args,
            self.bucket.env(),
        );
        self.stores[i] = Some(store);
    }
}

fn write_until(store: SocketAddr, app: String, stop: Arc<AtomicBool>, ledger: Arc<Ledger>) {
    while !stop.load(Ordering::SeqCst) {
        ledger.sent.fetch_add(PROFILE_TOTAL, Ordering::SeqCst);
        let target = format!("/ingest?name={app}.cpu&from=now-10s&until=now&sampleRate=100");
        match http(store, "POST", &target, &[], b"main;replicated_work 7") {
            Ok(response) if response.status == 200 => {
                ledger.acked.fetch_add(PROFILE_TOTAL, Ordering::SeqCst);
            }
            // Not acknowledged: may or may not be stored, and the bounds
            // below allow either.
            Ok(_) | Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(40));
    }
}

/// A replica's total for every writer over the last hour, and its
/// `Kiln-Partial` header.
fn total_at(store: SocketAddr) -> (i64, Option<String>) {
    let query = enc(r#"process_cpu{service_name=~"writer-.*"}"#);
    let response = http(
        store,
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

/// Listing once a minute, a query learns of the others' new blocks from
/// their answers alone.
#[test]
fn every_replica_answers_with_every_replicas_acknowledged_data_at_all_times() {
    let cluster = write_and_check(Cluster::new("60s", Bucket::local()));
    kill_and_restart_one(cluster);
}

/// The same on SeaweedFS's S3 gateway: real listings, real conditional
/// puts for the leases, real latency on every upload.
#[test]
fn seaweedfs_every_replica_answers_with_every_replicas_acknowledged_data() {
    let Some(bucket) = Bucket::seaweedfs() else {
        return;
    };
    let cluster = write_and_check(Cluster::new("60s", bucket));
    kill_and_restart_one(cluster);
}

#[test]
fn seaweedfs_a_pending_head_the_query_has_listed_already_is_counted_once() {
    let Some(bucket) = Bucket::seaweedfs() else {
        return;
    };
    write_and_check(Cluster::new("1s", bucket));
}

/// Listing every second, a query often lists a block a peer still answers
/// for as pending: it must count it once.
#[test]
fn a_pending_head_the_query_has_listed_already_is_counted_once() {
    write_and_check(Cluster::new("1s", Bucket::local()));
}

/// Three writers, one per replica, for 12 s; returns the cluster at rest.
fn write_and_check(cluster: Cluster) -> (Cluster, i64) {
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = cluster
        .addrs
        .iter()
        .enumerate()
        .map(|(i, &addr)| {
            let (stop, ledger) = (Arc::clone(&stop), Arc::clone(&ledger));
            std::thread::spawn(move || write_until(addr, format!("writer-{i}"), stop, ledger))
        })
        .collect();

    // Until something is stored, a query names a profile type none has.
    let first = Instant::now() + Duration::from_secs(30);
    while ledger.acked.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < first, "no write was acknowledged");
        std::thread::sleep(Duration::from_millis(10));
    }

    // While the three write and flush, every answer at every replica lies
    // between what was acknowledged before it was asked and what was sent
    // by the time it came: a profile missed or counted twice falls out.
    let until = Instant::now() + Duration::from_secs(12);
    let mut checks = 0;
    while Instant::now() < until {
        for &addr in &cluster.addrs {
            let acked_before = ledger.acked.load(Ordering::SeqCst);
            let (total, partial) = total_at(addr);
            let sent_after = ledger.sent.load(Ordering::SeqCst);
            assert_eq!(partial, None, "replica at {addr}");
            assert!(
                acked_before <= total && total <= sent_after,
                "replica at {addr} answered {total}, acknowledged {acked_before}, sent {sent_after}"
            );
            checks += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.join().expect("writer");
    }
    let acked = ledger.acked.load(Ordering::SeqCst);
    assert_eq!(
        ledger.sent.load(Ordering::SeqCst),
        acked,
        "every write was acknowledged"
    );
    assert!(acked >= 100 * PROFILE_TOTAL, "only {acked} written");
    for &addr in &cluster.addrs {
        assert_eq!(total_at(addr), (acked, None), "replica at {addr}, at rest");
    }
    eprintln!("{checks} answers checked while writing");
    (cluster, acked)
}

fn kill_and_restart_one((mut cluster, acked): (Cluster, i64)) {
    // A replica killed with unflushed data: the others say their answers
    // lack it, by name.
    let writer_2 = cluster.addrs[2];
    http(
        writer_2,
        "POST",
        "/ingest?name=writer-2.cpu&from=now-10s&until=now&sampleRate=100",
        &[],
        b"main;replicated_work 7",
    )
    .expect("ingest");
    let killed = cluster.stores[2].take().expect("r2").kill();
    for &addr in &cluster.addrs[..2] {
        let (total, partial) = total_at(addr);
        let partial = partial.unwrap_or_else(|| {
            panic!("replica at {addr} claimed a whole answer of {total} with r2 down")
        });
        assert!(partial.contains("peers_unanswered=r2"), "{partial}");
        assert!(total <= acked + PROFILE_TOTAL, "{total}");
    }

    // Back on its disk, r2 replays its log: every answer is whole and
    // exact again, the last profile counted once.
    cluster.start(2, killed);
    let whole = acked + PROFILE_TOTAL;
    for &addr in &cluster.addrs {
        assert_eq!(
            total_at(addr),
            (whole, None),
            "replica at {addr}, after r2 came back"
        );
    }
}
