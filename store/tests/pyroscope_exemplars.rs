//! SelectSeries exemplars and `profile_id_selector` against a real
//! `kiln-store`: each point names its heaviest single profile, and that id,
//! handed back in either Connect codec, opens exactly that profile in
//! SelectMergeStacktraces, SelectMergeProfile and Diff.

use kiln_api::querier::v1 as q;
use kiln_testkit::clock::now_ms;
use kiln_testkit::http::{
    Connect, enc, http, json_int64, querier_call, querier_json, stored_profile_type,
};
use kiln_testkit::store_process::StoreProcess;
use prost::Message;
use serde_json::{Value, json};

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

/// One sample at 100 Hz, in nanoseconds.
const SAMPLE_NS: i64 = 10_000_000;

/// Uploads a folded profile of `checkout{env}` taken at `from_s`.
fn ingest(store: &StoreProcess, env: &str, body: &str, from_s: i64) {
    let name = enc(&format!("checkout.cpu{{env={env}}}"));
    let until_s = from_s + 10;
    let target =
        format!("/ingest?name={name}&from={from_s}&until={until_s}&sampleRate=100&format=folded");
    let response = http(store.addr, "POST", &target, &[], body.as_bytes()).expect("POST /ingest");
    assert_eq!(response.status, 200, "{}", response.text());
}

/// Every exemplar of a JSON SelectSeries reply, as (point value,
/// exemplar) pairs.
fn exemplars(reply: &Value) -> Vec<(i64, Value)> {
    let mut out = Vec::new();
    for series in reply["series"].as_array().expect("series") {
        for point in series["points"].as_array().expect("points") {
            let value = point["value"].as_f64().expect("value") as i64;
            for exemplar in point["exemplars"].as_array().into_iter().flatten() {
                out.push((value, exemplar.clone()));
            }
        }
    }
    out
}

#[test]
fn exemplars_name_each_points_heaviest_profile_and_open_it_by_id() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    // Two steps of two minutes: prod (40 samples) and dev (5) in the
    // first, prod again (10) in the second.
    let t1 = now_ms() / 1000 - 400;
    let t2 = t1 + 120;
    ingest(&store, "prod", "main;work 30\nmain;idle 10", t1);
    ingest(&store, "dev", "main;work 5", t1);
    ingest(&store, "prod", "main;work 10", t2);
    let type_id = stored_profile_type(store.addr, "");
    let selector = "{service_name=\"checkout\"}";
    let (start, end) = ((t1 - 60) * 1000, (t1 + 180) * 1000);
    // `option` is one more request field: the exemplars, or an aggregation.
    let series_with = |group_by: &[&str], option: (&str, &str)| {
        let mut request = json!({
            "profileTypeID": type_id, "labelSelector": selector,
            "start": start.to_string(), "end": end.to_string(), "step": 120,
            "groupBy": group_by,
        });
        request[option.0] = json!(option.1);
        let (status, reply) = querier_json(store.addr, "SelectSeries", &request);
        assert_eq!(status, 200, "{reply}");
        reply
    };
    let select_series =
        |group_by: &[&str]| series_with(group_by, ("exemplarType", "EXEMPLAR_TYPE_INDIVIDUAL"));

    // Averaged, each step is its mean upload: (40 + 5) / 2 samples in the
    // first, 10 in the second; grouped by env, prod's and dev's own.
    let averages = |group_by: &[&str]| {
        let reply = series_with(
            group_by,
            ("aggregation", "TIME_SERIES_AGGREGATION_TYPE_AVERAGE"),
        );
        reply["series"]
            .as_array()
            .expect("series")
            .iter()
            .map(|s| {
                s["points"]
                    .as_array()
                    .expect("points")
                    .iter()
                    .map(|p| p["value"].as_f64().expect("value"))
                    .collect::<Vec<f64>>()
            })
            .collect::<Vec<_>>()
    };
    let sample = SAMPLE_NS as f64;
    assert_eq!(averages(&[]), vec![vec![22.5 * sample, 10.0 * sample]]);
    assert_eq!(
        averages(&["env"]),
        vec![vec![5.0 * sample], vec![40.0 * sample, 10.0 * sample]]
    );

    let reply = select_series(&[]);
    let found = exemplars(&reply);
    let summary: Vec<(i64, i64)> = found
        .iter()
        .map(|(p, e)| (*p, json_int64(&e["value"])))
        .collect();
    assert_eq!(
        summary,
        vec![
            (45 * SAMPLE_NS, 40 * SAMPLE_NS),
            (10 * SAMPLE_NS, 10 * SAMPLE_NS)
        ],
        "{reply}"
    );
    let prod_first = &found[0].1;
    let prod_id = prod_first["profileId"].as_str().expect("an id").to_owned();
    let time = json_int64(&prod_first["timestamp"]);
    assert!(
        (t1 * 1000..=(t1 + 10) * 1000).contains(&time),
        "{time} not within the upload's {t1} s + 10 s"
    );
    let labels = prod_first["labels"].as_array().expect("labels");
    assert!(
        labels.contains(&json!({"name": "env", "value": "prod"})),
        "{prod_first}"
    );
    assert!(
        !labels.iter().any(|l| l["name"] == "__profile_type__"),
        "{prod_first}"
    );
    assert_ne!(found[1].1["profileId"], prod_first["profileId"]);

    // Grouped, each series has its own exemplar: dev's is its one upload.
    let grouped = select_series(&["env"]);
    let dev_id = grouped["series"]
        .as_array()
        .expect("series")
        .iter()
        .find(|s| s["labels"] == json!([{"name": "env", "value": "dev"}]))
        .and_then(|s| s["points"][0]["exemplars"][0]["profileId"].as_str())
        .unwrap_or_else(|| panic!("no dev exemplar: {grouped}"))
        .to_owned();

    let stacktraces_total = |ids: &[&str], label_selector: &str, range: (i64, i64)| {
        let (status, reply) = querier_json(
            store.addr,
            "SelectMergeStacktraces",
            &json!({
                "profileTypeID": type_id, "labelSelector": label_selector,
                "start": range.0.to_string(), "end": range.1.to_string(),
                "profileIdSelector": ids,
            }),
        );
        assert_eq!(status, 200, "{reply}");
        json_int64(&reply["flamegraph"]["total"])
    };
    let whole = (start, end);
    assert_eq!(
        stacktraces_total(&[&prod_id], selector, whole),
        40 * SAMPLE_NS
    );
    assert_eq!(
        stacktraces_total(&[&dev_id], selector, whole),
        5 * SAMPLE_NS
    );
    assert_eq!(
        stacktraces_total(&[&prod_id, &dev_id, &prod_id], selector, whole),
        45 * SAMPLE_NS,
        "two profiles, a repeat counted once"
    );
    // Within the selection and range only, as any other narrowing.
    assert_eq!(stacktraces_total(&[&prod_id], "{env=\"dev\"}", whole), 0);
    assert_eq!(
        stacktraces_total(&[&prod_id], selector, (t2 * 1000, end)),
        0
    );

    // Binary: SelectMergeProfile by the same id.
    let request = q::SelectMergeProfileRequest {
        profile_type_id: type_id.clone(),
        label_selector: selector.to_owned(),
        start,
        end,
        profile_id_selector: vec![prod_id.clone()],
        ..Default::default()
    };
    let response = querier_call(
        store.addr,
        "SelectMergeProfile",
        Connect::Proto,
        &request.encode_to_vec(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let pprof = kiln_pprof::proto::Profile::decode(response.body.as_slice()).expect("pprof");
    let total: i64 = pprof.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 40 * SAMPLE_NS);

    // Binary SelectSeries carries the same exemplars.
    let request = q::SelectSeriesRequest {
        profile_type_id: type_id.clone(),
        label_selector: selector.to_owned(),
        start,
        end,
        step: 120.0,
        exemplar_type: kiln_api::types::v1::ExemplarType::Individual as i32,
        ..Default::default()
    };
    let response = querier_call(
        store.addr,
        "SelectSeries",
        Connect::Proto,
        &request.encode_to_vec(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let binary = q::SelectSeriesResponse::decode(response.body.as_slice()).expect("reply");
    let ids: Vec<&str> = binary
        .series
        .iter()
        .flat_map(|s| &s.points)
        .flat_map(|p| &p.exemplars)
        .map(|e| e.profile_id.as_str())
        .collect();
    assert_eq!(ids.first(), Some(&prod_id.as_str()), "{binary:?}");

    // Diff of one profile against another.
    let side = |id: &str| {
        json!({"profileTypeID": type_id, "labelSelector": selector,
            "start": start.to_string(), "end": end.to_string(), "profileIdSelector": [id]})
    };
    let (status, diff) = querier_json(
        store.addr,
        "Diff",
        &json!({"left": side(&dev_id), "right": side(&prod_id)}),
    );
    assert_eq!(status, 200, "{diff}");
    assert_eq!(json_int64(&diff["flamegraph"]["leftTicks"]), 5 * SAMPLE_NS);
    assert_eq!(
        json_int64(&diff["flamegraph"]["rightTicks"]),
        40 * SAMPLE_NS
    );

    // Text that is no id is refused, named.
    let (status, reply) = querier_json(
        store.addr,
        "SelectMergeStacktraces",
        &json!({"profileTypeID": type_id, "profileIdSelector": ["not-an-id"]}),
    );
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["message"].to_string().contains("is not a UUID"),
        "{reply}"
    );
}
