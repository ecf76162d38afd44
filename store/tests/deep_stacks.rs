//! A stack over a thousand frames deep (real ones come from deep recursion,
//! and a peer agent's OTLP export once carried 1,042 `[unknown]` frames)
//! is stored whole and comes back whole in the flame graph's nested JSON,
//! which a JSON reader with a depth limit of 128 would refuse.

use kiln_testkit::clock::now_s;
use kiln_testkit::http::{enc, get, http};
use kiln_testkit::store_process::StoreProcess;

/// The store binary cargo built for these tests.
const KILN_STORE: &str = env!("CARGO_BIN_EXE_kiln-store");

const FRAMES: usize = 1_500;

#[test]
fn a_stack_of_1500_frames_comes_back_whole_in_the_flame_graph() {
    let store = StoreProcess::start(KILN_STORE, &[]);
    let stack: Vec<String> = (0..FRAMES).map(|i| format!("frame_{i}")).collect();
    let body = format!("{} 7\nshallow;leaf 3\n", stack.join(";"));
    let now = now_s();
    let target = format!(
        "/ingest?name=deep.cpu&format=folded&from={}&until={now}",
        now - 10
    );
    let response = http(store.addr, "POST", &target, &[], body.as_bytes()).expect("ingest");
    assert_eq!(response.status, 200, "{}", response.text());

    let query = format!(
        "/api/v1/flamegraph?query={}&from=now-1h",
        enc("process_cpu{service_name=\"deep\"}")
    );
    let response = get(store.addr, &query);
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    // Folded counts are samples; the flame graph's values are CPU time,
    // one sample period each.
    let total = json["total"].as_i64().expect("total");
    assert!(total > 0 && total % 10 == 0, "total {total}");
    let deep = Some(total / 10 * 7);
    let names: Vec<&str> = json["flamegraph"]["names"]
        .as_array()
        .expect("names")
        .iter()
        .map(|n| n.as_str().expect("a name is a string"))
        .collect();
    // Walk the deep branch without recursion: each level has the next
    // frame as a child, with the deep stack's whole value.
    let mut node = &json["flamegraph"]["root"];
    let mut depth = 0;
    loop {
        let next = node["children"]
            .as_array()
            .expect("children")
            .iter()
            .find(|child| {
                names[child["name"].as_u64().expect("name index") as usize]
                    == format!("frame_{depth}")
            });
        let Some(child) = next else { break };
        assert_eq!(child["total"].as_i64(), deep, "frame_{depth}");
        node = child;
        depth += 1;
    }
    assert_eq!(depth, FRAMES, "the deep branch ends early");
    assert_eq!(node["self"].as_i64(), deep, "the leaf holds the value");
}
