//! A profile stamped far in the future would never age out, and would keep
//! every block compacted with it past retention too. So a profile time
//! outside [now - retention, now + max future skew] is refused with the reason, on HTTP (`/ingest`) and gRPC
//! (WriteRaw), and the env variable sets the skew like the flag does.

use kiln_api::parca::profilestore::v1alpha1::profile_store_service_client::ProfileStoreServiceClient;
use kiln_api::parca::profilestore::v1alpha1::{
    Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest,
};
use kiln_pprof::{FunctionSpec, ProfileBuilder, encode_gzip};
use kiln_testkit::clock::now_s;
use kiln_testkit::http::http;
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

fn folded_ingest(store: &StoreProcess, from_s: i64) -> (u16, String) {
    let target = format!(
        "/ingest?name=clock.cpu&format=folded&from={from_s}&until={}",
        from_s + 10
    );
    let response = http(store.addr, "POST", &target, &[], b"main;work 5\n").expect("http");
    (response.status, response.text())
}

fn pprof_at(time_nanos: i64) -> Vec<u8> {
    let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")]);
    builder
        .period("cpu", "nanoseconds", 10_000_000)
        .time(time_nanos, 10_000_000_000);
    let main = builder.function(&FunctionSpec {
        name: "main".into(),
        ..Default::default()
    });
    let location = builder.location(0, 0x1000, &[(main, 1)]);
    builder.sample(&[location], &[10_000_000], &[]);
    encode_gzip(&builder.finish())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_outside_retention_and_skew_are_refused_with_a_reason() {
    let store = StoreProcess::start_with_env(
        KILN_STORE,
        tempfile::tempdir().expect("temp dir"),
        &["--retention", "1d"],
        &[("KILN_MAX_FUTURE_SKEW", "2m")],
    );
    let now = now_s();
    assert_eq!(folded_ingest(&store, now - 60).0, 200);
    let (status, text) = folded_ingest(&store, now + 3600);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("in the future"), "{text}");
    let (status, text) = folded_ingest(&store, now - 2 * 86_400);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("older than retention"), "{text}");
    // Far outside the old clamp's reach too.
    let (status, text) = folded_ingest(&store, 9_000_000_000);
    assert_eq!(status, 400, "{text}");

    let channel = tonic::transport::Endpoint::from_shared(store.url())
        .expect("valid url")
        .connect()
        .await
        .expect("connect over h2c");
    let mut client = ProfileStoreServiceClient::new(channel);
    let write = |time_nanos: i64| WriteRawRequest {
        series: vec![RawProfileSeries {
            labels: Some(LabelSet {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                }],
            }),
            samples: vec![RawSample {
                raw_profile: pprof_at(time_nanos),
                executable_info: vec![],
            }],
        }],
        ..Default::default()
    };
    let status = client
        .write_raw(write((now + 3600) * 1_000_000_000))
        .await
        .expect_err("a profile an hour ahead is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("in the future"), "{status:?}");
    client
        .write_raw(write(now * 1_000_000_000))
        .await
        .expect("a profile of now is accepted");
}
