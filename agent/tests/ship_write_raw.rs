//! Shipping over gRPC WriteRaw to a real tonic server on loopback (the
//! generated `ProfileStoreService` from kiln-api): profiles made while the
//! store is down are queued and delivered once it is up, with the series
//! labels, a valid pprof and the write token from `--store-token-file`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kiln_api::parca::profilestore::v1alpha1::profile_store_service_server::{
    ProfileStoreService, ProfileStoreServiceServer,
};
use kiln_api::parca::profilestore::v1alpha1::{WriteRawRequest, WriteRawResponse};
use kiln_pprof::DecodeLimits;
use kiln_testkit::process::KillOnDrop;

#[derive(Default, Clone)]
struct Recorder {
    requests: Arc<Mutex<Vec<(u128, WriteRawRequest)>>>,
    /// Each request's `authorization` header.
    authorizations: Arc<Mutex<Vec<Option<String>>>>,
}

#[tonic::async_trait]
impl ProfileStoreService for Recorder {
    async fn write_raw(
        &self,
        request: tonic::Request<WriteRawRequest>,
    ) -> Result<tonic::Response<WriteRawResponse>, tonic::Status> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.authorizations
            .lock()
            .expect("not poisoned")
            .push(authorization);
        self.requests
            .lock()
            .expect("not poisoned")
            .push((now, request.into_inner()));
        Ok(tonic::Response::new(WriteRawResponse::default()))
    }
}

fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the WriteRaw shipping test samples a real process and must run as root in CI");
    }
    eprintln!("skipping WriteRaw shipping test: needs root");
    false
}

#[tokio::test]
async fn profiles_made_while_the_store_is_down_are_delivered_when_it_comes_up() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("hot_ratio");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/hot_ratio.c");
    let status = Command::new("gcc")
        .args([
            "-O1",
            "-fno-omit-frame-pointer",
            "-mno-omit-leaf-frame-pointer",
            "-o",
        ])
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success());
    let workload = KillOnDrop(
        Command::new(&exe)
            .stdout(Stdio::null())
            .spawn()
            .expect("workload"),
    );
    let pid = workload.0.id().to_string();

    // Reserve a port, free it, and let the agent target it before anything listens.
    let address: SocketAddr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind probe");
        probe.local_addr().expect("probe address")
    };
    let token_file = dir.path().join("write-token");
    std::fs::write(&token_file, "kiln-write-3f9a\n").expect("write the token file");
    let agent_started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after epoch")
        .as_nanos();
    let _agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_kiln-agent"))
            .args(["--pid", &pid, "--frequency", "99", "--drain-interval", "1s"])
            .args([
                "--duration",
                "20s",
                "--metrics-addr",
                "off",
                "--node-name",
                "test-node",
            ])
            .arg("--store")
            .arg(format!("http://{address}"))
            .arg("--store-token-file")
            .arg(&token_file)
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts"),
    );

    // The store is down for the first windows.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let recorder = Recorder::default();
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .expect("bind store port");
    let server_started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after epoch")
        .as_nanos();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ProfileStoreServiceServer::new(recorder.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    // Wait (bounded) until a profile from before the server started arrives.
    let deadline = Instant::now() + Duration::from_secs(60);
    let early_profile_arrived = || {
        recorder
            .requests
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|(_, request)| {
                request
                    .series
                    .iter()
                    .flat_map(|s| &s.samples)
                    .any(|sample| {
                        kiln_pprof::decode(&sample.raw_profile, &DecodeLimits::default())
                            .is_ok_and(|p| (p.time_nanos() as u128) < server_started)
                    })
            })
    };
    while !early_profile_arrived() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.abort();

    let requests = recorder.requests.lock().expect("not poisoned").clone();
    let authorizations = recorder
        .authorizations
        .lock()
        .expect("not poisoned")
        .clone();
    assert!(
        !authorizations.is_empty()
            && authorizations
                .iter()
                .all(|a| a.as_deref() == Some("Bearer kiln-write-3f9a")),
        "every upload carries the write token: {authorizations:?}"
    );
    assert!(
        early_profile_arrived(),
        "no queued profile was delivered after the store came up"
    );
    let (_, request) = &requests[0];
    let series = &request.series[0];
    let labels: Vec<(String, String)> = series
        .labels
        .as_ref()
        .expect("series labels")
        .labels
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect();
    for expected in [("__name__", "process_cpu"), ("node", "test-node")] {
        assert!(
            labels
                .iter()
                .any(|(n, v)| n == expected.0 && v == expected.1),
            "label {expected:?} missing from {labels:?}"
        );
    }
    assert!(
        !labels.iter().any(|(n, _)| n == "pid" || n == "comm"),
        "pid and comm stay per sample, off the series, or a fork-heavy pod exhausts the store's series budget: {labels:?}"
    );
    let profile = kiln_pprof::decode(&series.samples[0].raw_profile, &DecodeLimits::default())
        .expect("a valid pprof");
    let sample_labels: Vec<(&str, &str)> = profile
        .samples()
        .iter()
        .flat_map(|s| &s.label)
        .map(|l| (profile.string(l.key), profile.string(l.str)))
        .collect();
    for expected in [("comm", "hot_ratio"), ("pid", pid.as_str())] {
        assert!(
            sample_labels.contains(&expected),
            "sample label {expected:?} missing from {sample_labels:?}"
        );
    }
    assert!((profile.time_nanos() as u128) >= agent_started - 1_000_000_000);
    let names: Vec<&str> = profile
        .functions()
        .iter()
        .map(|f| profile.string(f.name))
        .collect();
    assert!(
        requests
            .iter()
            .any(|(_, r)| r.series.iter().flat_map(|s| &s.samples).any(|s| {
                kiln_pprof::decode(&s.raw_profile, &DecodeLimits::default()).is_ok_and(|p| {
                    p.functions()
                        .iter()
                        .any(|f| p.string(f.name) == "hot_three_parts")
                })
            })),
        "no delivered profile names hot_three_parts (first one has {names:?})"
    );
}
