//! Pyroscope's querier over Connect, which reads are open to by default:
//! bodies that decode into far more memory than they take on the wire, and
//! requests whose lists each cost a query.

use std::net::SocketAddr;

use kiln_testkit::clock::now_s;
use kiln_testkit::http::http;
use kiln_testkit::wire::gzip;

use super::{Attack, Expect, Hostile, last_hour_ms};

/// Values in the JSON list: 32 MB of `0,`, under the 32 MiB request cap
/// once inflated; a generic JSON value costs 32 bytes for each.
const JSON_VALUES: usize = 16_000_000;
/// Empty `matchers` entries (`0a 00`) that fill a 32 MiB protobuf body;
/// each decodes into a `String`.
const PROTO_MATCHERS: usize = (32 << 20) / 2 - 32;
/// Copies of the JSON body sent at once, each holding a query slot.
const PARALLEL_COPIES: usize = 4;
/// `groupBy` entries in one `SelectSeries`: a key that long for every series.
const GROUP_BY_ENTRIES: usize = 1_000_000;
/// Series the grouping attack spreads over (one per pod).
const PODS: usize = 100;
/// Selectors in one matcher list, each a full query; under 1 MiB of JSON,
/// so that the list itself, not the body's size, has to be refused.
const MATCHER_ENTRIES: usize = 50_000;

fn querier_method(
    what: String,
    addr: SocketAddr,
    method: &str,
    content_type: &str,
    gzipped: bool,
    body: &[u8],
) -> Hostile {
    let mut headers = vec![("Content-Type", content_type)];
    if gzipped {
        headers.push(("Content-Encoding", "gzip"));
    }
    Hostile::http(
        what,
        Expect::Refused,
        addr,
        "POST",
        &format!("/querier.v1.QuerierService/{method}"),
        &headers,
        body,
    )
}

#[test]
fn querier_json_body_of_16m_values_gzipped_4_at_once() {
    let Some(attack) = Attack::start("querier_json_body_of_16m_values_x4") else {
        return;
    };
    let mut plain = b"{\"x\":[".to_vec();
    plain.extend_from_slice(&b"0,".repeat(JSON_VALUES));
    plain.extend_from_slice(b"0]}");
    let body = gzip(&plain);
    drop(plain);
    eprintln!("JSON body: {} bytes gzipped", body.len());
    attack.run(|addr| {
        std::thread::scope(|scope| {
            let copies: Vec<_> = (0..PARALLEL_COPIES)
                .map(|i| {
                    let body = &body;
                    scope.spawn(move || {
                        querier_method(
                            format!("LabelNames with a gzipped JSON list of 16M zeros, copy {i}"),
                            addr,
                            "LabelNames",
                            "application/json",
                            true,
                            body,
                        )
                    })
                })
                .collect();
            copies
                .into_iter()
                .map(|copy| copy.join().expect("hostile client"))
                .collect()
        })
    });
}

#[test]
fn querier_proto_body_of_16m_empty_matchers_gzipped() {
    let Some(attack) = Attack::start("querier_proto_body_of_16m_matchers") else {
        return;
    };
    let body = gzip(&[0x0a, 0x00].repeat(PROTO_MATCHERS));
    attack.run(|addr| {
        vec![querier_method(
            format!("LabelNames with {PROTO_MATCHERS} empty matchers in gzipped protobuf"),
            addr,
            "LabelNames",
            "application/proto",
            true,
            &body,
        )]
    });
}

/// One profile for each of [`PODS`] pods, so that every group has series;
/// returns their profile type's id, as `ProfileTypes` names it.
fn ingest_pods(addr: SocketAddr) -> String {
    for pod in 0..PODS {
        let target = format!(
            "/ingest?name={}&format=folded&from={}&until={}",
            kiln_testkit::http::enc(&format!("fanout.cpu{{pod=pod-{pod}}}")),
            now_s() - 10,
            now_s()
        );
        let response = http(addr, "POST", &target, &[], b"main;work 1\n").expect("ingest");
        assert_eq!(response.status, 200, "pod-{pod}: {}", response.text());
    }
    let types = http(addr, "GET", "/api/v1/profile-types", &[], b"").expect("profile types");
    types.json()["profile_types"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no stored profile type: {}", types.text()))
        .to_owned()
}

#[test]
fn select_series_grouped_by_a_million_labels() {
    let Some(attack) = Attack::start("select_series_grouped_by_1m_labels") else {
        return;
    };
    let profile_type = ingest_pods(attack.addr());
    let (start, end) = last_hour_ms();
    let group_by = vec!["\"pod\""; GROUP_BY_ENTRIES].join(",");
    let body = format!(
        r#"{{"profileTypeID":"{profile_type}","labelSelector":"{{service_name=\"fanout\"}}","start":{start},"end":{end},"step":15,"groupBy":[{group_by}]}}"#
    );
    attack.run(|addr| {
        vec![querier_method(
            format!(
                "SelectSeries grouped by \"pod\" x {GROUP_BY_ENTRIES} ({} bytes of JSON)",
                body.len()
            ),
            addr,
            "SelectSeries",
            "application/json",
            false,
            body.as_bytes(),
        )]
    });
}

#[test]
fn querier_matcher_lists_of_50k_selectors() {
    let Some(attack) = Attack::start("querier_matcher_lists_of_50k_selectors") else {
        return;
    };
    ingest_pods(attack.addr());
    let (start, end) = last_hour_ms();
    let matchers = vec![r#""{pod=~\"pod-.+\"}""#; MATCHER_ENTRIES].join(",");
    let bodies = [
        (
            "LabelNames",
            format!(r#"{{"matchers":[{matchers}],"start":{start},"end":{end}}}"#),
        ),
        (
            "LabelValues",
            format!(r#"{{"name":"pod","matchers":[{matchers}],"start":{start},"end":{end}}}"#),
        ),
        (
            "Series",
            format!(
                r#"{{"matchers":[{matchers}],"labelNames":["pod"],"start":{start},"end":{end}}}"#
            ),
        ),
    ];
    attack.run(|addr| {
        bodies
            .iter()
            .map(|(method, body)| {
                querier_method(
                    format!(
                        "{method} with {MATCHER_ENTRIES} matchers ({} bytes of JSON)",
                        body.len()
                    ),
                    addr,
                    method,
                    "application/json",
                    false,
                    body.as_bytes(),
                )
            })
            .collect()
    });
}
