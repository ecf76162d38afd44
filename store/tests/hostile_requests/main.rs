//! Issue 15's hostile-input suite: the real `kiln-store`, in a memory cgroup
//! limited to its `--memory-budget`, receives one request after another
//! that once crashed or froze a store: a WAL record that fails replay (a
//! crash loop on every recovery), Push label amplification (a small upload
//! cloned into gigabytes), nested pprof amplification up to the inflate
//! cap, the multipart `prev_profile` key blowup, future times (data that
//! retention never removes), a burst of new series past the cardinality
//! limits (one tenant using up everyone's budget), 256 concurrent heavy
//! regex queries, 300 slowloris connections and an ingest flood holding
//! every ingest slot. After each (and during the slow connections): the store
//! is alive, the cgroup saw no OOM kill, its peak RSS (VmHWM) is within the
//! budget, and a well-behaved client's ingest and query each succeed within
//! a second.

mod floods;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kiln_api::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_api::types::v1::LabelPair;
use kiln_engine::model::{Label, LabelSet};
use kiln_pprof::{FunctionSpec, LabelValue, ProfileBuilder, encode_gzip};
use kiln_storage::wal::{Wal, WalRecord};
use kiln_testkit::clock::now_s;
use kiln_testkit::http::{enc, free_port, http};
use kiln_testkit::memory_cgroup::{LimitedCgroup, status_kib};
use kiln_testkit::process::KillOnDrop;
use kiln_testkit::wire::{gzip, push_varint};
use prost::Message;

const BUDGET: u64 = 192 << 20;
/// Past this, the well-behaved client counts as starved by an attack.
const STARVED: Duration = Duration::from_secs(5);

/// Nested pprof amplification: a valid header and one sample whose empty `label` repeats `labels` times.
fn nested_label_bomb(labels: usize) -> Vec<u8> {
    let mut sample = vec![0x10, 0x01];
    sample.reserve(labels * 2);
    for _ in 0..labels {
        sample.extend_from_slice(&[0x1a, 0x00]);
    }
    let mut plain = vec![0x0a, 0x04, 0x08, 0x01, 0x10, 0x02, 0x12];
    push_varint(&mut plain, sample.len());
    plain.extend_from_slice(&sample);
    for s in [&b""[..], b"cpu", b"ns"] {
        plain.push(0x32);
        plain.push(s.len() as u8);
        plain.extend_from_slice(s);
    }
    gzip(&plain)
}

/// The `prev_profile` key blowup: 4096 frames of one function with a 60 KB name, ten samples apart
/// only by a numeric label.
fn deep_heap(alloc: i64) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("alloc_space", "bytes"), ("inuse_space", "bytes")]);
    let f = builder.function(&FunctionSpec {
        name: "n".repeat(60_000),
        ..Default::default()
    });
    let loc = builder.location(0, 0x10, &[(f, 3)]);
    let stack = vec![loc; 4096];
    for num in 0..10 {
        builder.sample(
            &stack,
            &[alloc + num, 1],
            &[(
                "num",
                LabelValue::Num {
                    value: num,
                    unit: String::new(),
                },
            )],
        );
    }
    encode_gzip(&builder.finish())
}

fn multipart(parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, content) in parts {
        body.extend_from_slice(
            format!(
                "--BOUNDARY\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"--BOUNDARY--\r\n");
    body
}

fn push_body(labels: Vec<LabelPair>, samples: usize) -> Vec<u8> {
    PushRequest {
        series: vec![RawProfileSeries {
            labels,
            samples: (0..samples)
                .map(|_| RawSample {
                    raw_profile: vec![1],
                    id: String::new(),
                })
                .collect(),
        }],
    }
    .encode_to_vec()
}

fn pair(name: String, value: String) -> LabelPair {
    LabelPair { name, value }
}

/// A WAL record the engine refuses (no `__name__`), logged with the real
/// writer before the store starts: recovery must set it aside.
fn log_poison_record(data_dir: &std::path::Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (wal, _) = Wal::open(&data_dir.join("wal"), 64 << 20, |_| {}).expect("open WAL");
        wal.append(&WalRecord {
            labels: LabelSet::new(vec![Label::new("pod", "poison")]),
            time_ms: now_s() * 1000,
            duration_nanos: 0,
            pprof: deep_heap(1),
            idempotency_key: None,
        })
        .await
        .expect("append");
    });
}

pub(crate) struct Suite {
    store: KillOnDrop,
    cgroup: LimitedCgroup,
    pub(crate) addr: SocketAddr,
    pid: u32,
    pub(crate) good_ingests: u32,
}

impl Suite {
    /// Alive, never OOM-killed, peak RSS within the budget, and a
    /// well-behaved client is served, not starved. Returns VmHWM in MiB.
    #[track_caller]
    pub(crate) fn check_after(&mut self, what: &str) -> u64 {
        if let Ok(Some(status)) = self.store.0.try_wait() {
            panic!("kiln-store died after {what}: {status}");
        }
        assert_eq!(self.cgroup.oom_kills(), 0, "OOM kill after {what}");
        let hwm_kib = status_kib(self.pid, "VmHWM:").expect("VmHWM of a live store");
        assert!(
            hwm_kib * 1024 <= BUDGET,
            "peak RSS {} MiB over the {} MiB budget after {what}",
            hwm_kib >> 10,
            BUDGET >> 20
        );
        let started = Instant::now();
        let target = format!(
            "/ingest?name=good.cpu&format=folded&from={}&until={}",
            now_s() - 10,
            now_s()
        );
        let response = http(self.addr, "POST", &target, &[], b"main;work 7\n").expect("ingest");
        assert_eq!(response.status, 200, "after {what}: {}", response.text());
        let ingest_time = started.elapsed();
        self.good_ingests += 1;
        let started = Instant::now();
        let query = format!(
            "/api/v1/flamegraph?query={}&from=now-1h",
            enc("process_cpu{service_name=\"good\"}")
        );
        let response = http(self.addr, "GET", &query, &[], b"").expect("query");
        assert_eq!(response.status, 200, "after {what}: {}", response.text());
        let query_time = started.elapsed();
        assert_eq!(
            response.json()["total"].as_i64(),
            // 7 samples at the default 100 Hz are 70 ms of CPU.
            Some(70_000_000 * i64::from(self.good_ingests)),
            "after {what}: every acknowledged write is there: {}",
            response.text()
        );
        // A starvation bound, not a speed target (those live in
        // docs/benchmarks/log/2026-11-25-store-hostile-requests.md, which
        // records the 1-73 ms these take): well
        // under the 10 s header and 60 s body timeouts a client stuck
        // behind the attack would wait out, and far over a loaded CI VM's
        // scheduling noise.
        assert!(
            ingest_time < STARVED && query_time < STARVED,
            "after {what}: ingest {ingest_time:?}, query {query_time:?}"
        );
        eprintln!(
            "after {what}: alive, no OOM kill, VmHWM {} MiB (budget {} MiB), good ingest {ingest_time:?}, query {query_time:?}",
            hwm_kib >> 10,
            BUDGET >> 20
        );
        hwm_kib >> 10
    }

    #[track_caller]
    pub(crate) fn post(
        &self,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        let response = http(self.addr, "POST", target, headers, body).expect("post");
        (response.status, response.text())
    }
}

#[test]
fn the_audits_reproductions_leave_the_store_alive_within_its_budget_and_serving() {
    let Some(cgroup) = LimitedCgroup::create_or_skip(BUDGET) else {
        return;
    };
    let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    log_poison_record(data_dir.path());
    let addr: SocketAddr = free_port();
    let mut child = cgroup
        .command(env!("CARGO_BIN_EXE_kiln-store"))
        .arg(format!("--listen={addr}"))
        .arg(format!("--data-dir={}", data_dir.path().display()))
        .arg(format!("--memory-budget={BUDGET}"))
        .arg("--flush-interval=1h")
        .arg(format!(
            "--max-series-per-namespace={}",
            floods::SERIES_PER_NAMESPACE
        ))
        .arg(format!("--max-series={}", floods::SERIES_IN_ALL))
        .env("KILN_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn kiln-store in the limited cgroup");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = loop {
        if let Ok(response) = http(addr, "GET", "/readyz", &[], b"")
            && response.status == 200
        {
            break response.text();
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("kiln-store exited during recovery: {status}");
        }
        assert!(Instant::now() < deadline, "kiln-store not ready in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut suite = Suite {
        store: KillOnDrop(child),
        cgroup,
        addr,
        pid,
        good_ingests: 0,
    };
    // A WAL record that fails replay: the poison record is set aside and counted; the store serves.
    assert!(
        ready.contains("wal_quarantined_records 1"),
        "readyz: {ready}"
    );
    suite.check_after("a WAL record that fails replay");

    // Label amplification: 48 labels of 2 KiB and 100k one-byte samples (was 19 GiB).
    let mut labels = vec![pair("__name__".into(), "process_cpu".into())];
    labels.extend((0..47).map(|i| pair(format!("l{i}"), "v".repeat(2048))));
    let (status, text) = suite.post(
        "/push.v1.PusherService/Push",
        &[("Content-Type", "application/proto")],
        &push_body(labels, 100_000),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("more than 1024 profiles"), "{text}");
    suite.check_after("label amplification: Push with 100k samples under 94 KiB of labels");
    // Label amplification: a million distinct label names (was a quadratic check).
    let labels = (0..1_000_000)
        .map(|i| pair(format!("l{i}"), String::new()))
        .collect();
    let (status, text) = suite.post(
        "/push.v1.PusherService/Push",
        &[("Content-Type", "application/proto")],
        &push_body(labels, 1),
    );
    assert_eq!(status, 400, "{text}");
    suite.check_after("label amplification: Push with a million label names");

    // Nested amplification: 16M empty labels on one sample (32 KB gzip): inflated (32 MiB fits
    // the 48 MiB ingest budget), then refused by the wire pre-scan. Up to the
    // inflate cap (33M labels, 66 MB): refused before inflating, since the
    // gzip trailer announces more than the ingest budget.
    for (labels, refusal) in [
        (16 << 20, "labels in one sample"),
        (33_000_000, "ingest memory budget"),
    ] {
        let (status, text) = suite.post(
            "/ingest?name=bomb&format=pprof",
            &[],
            &nested_label_bomb(labels),
        );
        assert!(status == 400 || status == 422, "{status}: {text}");
        assert!(text.contains(refusal), "{text}");
        suite.check_after(&format!(
            "nested amplification: one sample with {labels} empty labels"
        ));
    }

    // The prev_profile key blowup (was 2.7 GB from a 20 KB upload); now stored.
    let body = multipart(&[
        ("profile", &deep_heap(1000)),
        ("prev_profile", &deep_heap(600)),
    ]);
    let (status, text) = suite.post(
        &format!("/ingest?name={}&spyName=gospy", enc("deep")),
        &[("Content-Type", "multipart/form-data; boundary=BOUNDARY")],
        &body,
    );
    assert_eq!(status, 200, "{text}");
    suite.check_after("key blowup: multipart prev_profile with 4096 frames of 60 KB names");

    // Future times: a time a century ahead is refused; retention would never reach it.
    let (status, text) = suite.post(
        &format!(
            "/ingest?name=future.cpu&format=folded&from={}&until={}",
            now_s() + 100 * 365 * 86_400,
            now_s() + 100 * 365 * 86_400 + 10
        ),
        &[],
        b"main 1\n",
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("in the future"), "{text}");
    suite.check_after("future times: a profile 100 years ahead");

    floods::cardinality_burst(&mut suite);
    floods::heavy_regex_queries(&mut suite);
    floods::slowloris(&mut suite);
    floods::ingest_flood_leaves_queries_alone(&mut suite);
}
