//! The UI's unit tests read `tests/fixtures/*.json`; this test makes sure
//! those are exactly what the real `kiln-store` answers today. It starts the
//! store, ingests small folded profiles whose shapes the unit tests rely on
//! (a trimmed `(other)` node, a diff with a gain and a loss, two groups),
//! asks `/api/v1/` for each fixture, checks the answer decodes as the
//! `kiln-contract` type the CLI reads, and fails on any difference.
//!
//! Two things vary between runs of the same store and are normalized before
//! comparing, nothing else: times depend on when the test runs, so
//! `from_ms`/`to_ms`/`start_ms` are shifted to a fixed base; and the store
//! numbers frame names (and so orders siblings of equal value) in hash
//! order, so names are renumbered in tree order and equal siblings sorted
//! by name.
//! Regenerate with `KILN_BLESS=1 cargo test -p kiln-ui --test api_fixtures`.

use std::path::Path;

use kiln_contract::query_json::{
    DiffResponse, ErrorResponse, FlameGraphResponse, LabelValues, TopResponse,
};
use kiln_testkit::binaries::built_binary;
use kiln_testkit::clock::now_s;
use kiln_testkit::http::{http_get, http_post};
use kiln_testkit::store_process::StoreProcess;
use serde_json::Value;

/// Where the shifted range of every fixture starts (2025-11-22T02:00:00Z).
const FIXED_FROM_MS: i64 = 1_763_776_800_000;

/// `(app_name labels, folded stacks)` ingested before the fixtures are
/// taken; Pyroscope's `name` takes label values without quotes.
const PROFILES: &[(&str, &str)] = &[
    (
        "fixture=flame",
        "main.main 100\nmain.main;main.work 400\nmain.main;main.work;runtime.mallocgc 200\n\
         main.main;main.idle 200\nmain.helper 60\nmain.report 40\n",
    ),
    (
        "fixture=diff-base",
        "main.main;main.work 50\nmain.main;main.idle 50\n",
    ),
    (
        "fixture=diff-compare",
        "main.main;main.work 100\nmain.main;main.newpath 100\n",
    ),
    (
        "fixture=grouped,pod=checkout-1",
        "main.main;main.checkout;crypto.hash 300\nmain.main;main.audit;crypto.hash 100\n",
    ),
    (
        "fixture=grouped,pod=search-1",
        "main.main;main.search;crypto.hash 200\nmain.main;main.search;sort.Ints 200\n",
    ),
];

/// Percent-encodes a query parameter value.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Shifts every time field by the same amount so the fixture does not change
/// with the clock.
fn shift_times(value: &mut Value, shift_ms: i64) {
    match value {
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                if matches!(key.as_str(), "from_ms" | "to_ms" | "start_ms") {
                    if let Some(ms) = field.as_i64() {
                        *field = Value::from(ms - shift_ms);
                    }
                } else {
                    shift_times(field, shift_ms);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| shift_times(v, shift_ms)),
        _ => {}
    }
}

/// The total a sibling is ordered by: a flame graph node's `total`, a diff
/// node's two totals.
fn node_weight(node: &Value) -> i64 {
    match node.get("total") {
        Some(total) => total.as_i64().unwrap_or(0),
        None => ["base_total", "compare_total"]
            .iter()
            .filter_map(|k| node.get(*k).and_then(Value::as_i64))
            .sum(),
    }
}

/// Renumbers the `names` of a tree (`{"names", "root"}`) in depth-first
/// order of first use, unused names after them sorted, and orders siblings
/// by weight, then name.
fn canonical_names(graph: &mut Value) {
    let Some(old_names) = graph.get("names").and_then(Value::as_array).cloned() else {
        return;
    };
    let name_of = |node: &Value| -> String {
        let index = node.get("name").and_then(Value::as_u64).unwrap_or(0) as usize;
        old_names
            .get(index)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let mut order: Vec<String> = Vec::new();
    let Some(root) = graph.get_mut("root") else {
        return;
    };
    let mut pending: Vec<&mut Value> = vec![root];
    while let Some(node) = pending.pop() {
        let name = name_of(node);
        let index = match order.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                order.push(name);
                order.len() - 1
            }
        };
        node["name"] = Value::from(index);
        if let Some(children) = node.get_mut("children").and_then(Value::as_array_mut) {
            children.sort_by(|a, b| {
                node_weight(b)
                    .cmp(&node_weight(a))
                    .then_with(|| name_of(a).cmp(&name_of(b)))
            });
            // Numbered left to right: push right to left.
            pending.extend(children.iter_mut().rev());
        }
    }
    let mut unused: Vec<String> = old_names
        .iter()
        .filter_map(Value::as_str)
        .filter(|n| !order.iter().any(|o| o == n))
        .map(str::to_owned)
        .collect();
    unused.sort();
    order.extend(unused);
    graph["names"] = Value::from(order);
}

#[test]
fn ui_fixtures_are_what_the_real_store_answers() {
    let Some(binary) = built_binary("kiln-store", "KILN_STORE_BIN") else {
        return;
    };
    let store = StoreProcess::start(&binary, &[]);
    let now = now_s();
    for (labels, folded) in PROFILES {
        let name = encode(&format!("process_cpu{{{labels}}}"));
        let path = format!(
            "/ingest?format=folded&name={name}&from={}&until={}",
            now - 120,
            now - 110
        );
        let answer = http_post(store.port(), &path, folded.as_bytes());
        assert!(
            matches!(answer, Some((200, _))),
            "ingest of {labels} failed: {answer:?}\n{}",
            store.log()
        );
    }
    let from_ms = (now - 600) * 1000;
    let to_ms = now * 1000;
    let range = format!("from={from_ms}&to={to_ms}");
    let q = |labels: &str| encode(&format!("process_cpu{{{labels}}}"));
    let fixtures: Vec<(&str, String)> = vec![
        (
            "flamegraph.json",
            format!(
                "/api/v1/flamegraph?query={}&{range}&max_nodes=6",
                q("fixture=\"flame\"")
            ),
        ),
        (
            "diff.json",
            format!(
                "/api/v1/diff?left_query={}&right_query={}&left_from={from_ms}&left_to={to_ms}",
                q("fixture=\"diff-base\""),
                q("fixture=\"diff-compare\"")
            ),
        ),
        (
            "grouped.json",
            format!(
                "/api/v1/flamegraph?query={}&{range}&group_by=pod",
                q("fixture=\"grouped\"")
            ),
        ),
        (
            "top.json",
            format!(
                "/api/v1/top?query={}&{range}&limit=10",
                q("fixture=\"grouped\"")
            ),
        ),
        (
            "label_values.json",
            format!(
                "/api/v1/labels/pod/values?query={}&{range}",
                encode("{fixture=\"grouped\"}")
            ),
        ),
        (
            "error.json",
            format!(
                "/api/v1/flamegraph?query={}&{range}",
                encode("process_cpu{pod=}")
            ),
        ),
    ];
    let bless = std::env::var_os("KILN_BLESS").is_some();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut stale = Vec::new();
    for (file, path) in &fixtures {
        let (status, body) = http_get(store.port(), path)
            .unwrap_or_else(|| panic!("{path} got no answer\n{}", store.log()));
        let expected_status = if *file == "error.json" { 400 } else { 200 };
        assert_eq!(
            status,
            expected_status,
            "{path} answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
        check_contract(file, &body);
        let mut value: Value = serde_json::from_slice(&body).expect("the store answers JSON");
        shift_times(&mut value, from_ms - FIXED_FROM_MS);
        for tree in ["flamegraph", "diff"] {
            if let Some(graph) = value.get_mut(tree) {
                canonical_names(graph);
            }
        }
        let mut text = serde_json::to_string_pretty(&value).expect("JSON encodes");
        text.push('\n');
        let target = dir.join(file);
        if bless {
            std::fs::write(&target, &text).expect("fixture is writable");
        } else if std::fs::read_to_string(&target).ok().as_deref() != Some(text.as_str()) {
            stale.push(format!("{file}:\n{text}"));
        }
    }
    assert!(
        stale.is_empty(),
        "the store's answers differ from the UI's fixtures; if the change is meant, run \
         KILN_BLESS=1 cargo test -p kiln-ui --test api_fixtures, rerun the UI unit tests and \
         commit the fixtures. Answers now:\n{}",
        stale.join("\n")
    );
}

/// The answer decodes as the shared contract type, as the CLI reads it.
fn check_contract(file: &str, body: &[u8]) {
    let decoded = match file {
        "flamegraph.json" | "grouped.json" => {
            serde_json::from_slice::<FlameGraphResponse>(body).map(drop)
        }
        "diff.json" => serde_json::from_slice::<DiffResponse>(body).map(drop),
        "top.json" => serde_json::from_slice::<TopResponse>(body).map(drop),
        "label_values.json" => serde_json::from_slice::<LabelValues>(body).map(drop),
        "error.json" => serde_json::from_slice::<ErrorResponse>(body).map(drop),
        other => panic!("no contract type for {other}"),
    };
    if let Err(err) = decoded {
        panic!(
            "{file}: the store's answer does not fit kiln-contract: {err}\n{}",
            String::from_utf8_lossy(body)
        );
    }
}
