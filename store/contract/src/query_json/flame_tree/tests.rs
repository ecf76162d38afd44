use super::*;

fn node(name: u32, total: i64, self_value: i64, children: Range<u32>) -> FlameNode {
    FlameNode {
        name,
        total,
        self_value,
        first_child: children.start,
        child_count: children.end - children.start,
    }
}

#[test]
fn a_flat_tree_writes_the_nested_json_and_reads_back() {
    // total(10) -> a(6) -> c(5); total -> b(4).
    let graph = FlameGraph {
        names: vec!["total".into(), "a".into(), "b".into(), "c".into()],
        nodes: vec![
            node(0, 10, 0, 1..3),
            node(1, 6, 1, 3..4),
            node(2, 4, 4, 4..4),
            node(3, 5, 5, 4..4),
        ],
    };
    let text = serde_json::to_string(&graph).expect("encodes");
    assert_eq!(
        text,
        concat!(
            r#"{"names":["total","a","b","c"],"root":{"name":0,"total":10,"self":0,"children":["#,
            r#"{"name":1,"total":6,"self":1,"children":[{"name":3,"total":5,"self":5,"children":[]}]},"#,
            r#"{"name":2,"total":4,"self":4,"children":[]}]},"node_count":4}"#
        )
    );
    let back: FlameGraph = serde_json::from_str(&text).expect("decodes");
    assert_eq!(back, graph);
    assert_eq!(back.children(back.root()).len(), 2);
    let miscounted = text.replace(r#""node_count":4"#, r#""node_count":5"#);
    assert!(serde_json::from_str::<FlameGraph>(&miscounted).is_err());
}

/// A chain a million levels deep is written and dropped on a thread
/// with 256 KiB of stack, so nothing in either recurses per level.
#[test]
fn a_million_level_chain_serializes_and_drops_on_a_small_stack() {
    let worker = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let depth = 1_000_000u32;
            let nodes = (0..depth)
                .map(|i| node(1, 1, i64::from(i + 1 == depth), i + 1..(i + 2).min(depth)))
                .collect();
            let graph = FlameGraph {
                names: vec!["total".into(), "f".into()],
                nodes,
            };
            let text = serde_json::to_vec(&graph).expect("encodes");
            let opening = br#"{"name":1,"total":1,"self":0,"children":["#;
            let levels = text
                .windows(opening.len())
                .filter(|w| *w == opening)
                .count();
            (text.len(), levels)
        })
        .expect("thread starts");
    let (bytes, levels) = worker.join().expect("no stack overflow");
    println!("a million-level chain is {bytes} bytes of JSON");
    assert_eq!(levels, 999_999);
}

#[test]
fn a_diff_tree_round_trips_and_an_empty_one_still_has_a_root() {
    let graph = DiffFlameGraph {
        names: vec!["total".into(), "a".into()],
        nodes: vec![
            DiffNode {
                name: 0,
                base_total: 3,
                compare_total: 5,
                first_child: 1,
                child_count: 1,
                ..DiffNode::default()
            },
            DiffNode {
                name: 1,
                base_total: 3,
                base_self: 3,
                compare_total: 5,
                compare_self: 5,
                first_child: 2,
                child_count: 0,
            },
        ],
    };
    let text = serde_json::to_string(&graph).expect("encodes");
    let back: DiffFlameGraph = serde_json::from_str(&text).expect("decodes");
    assert_eq!(back, graph);
    let empty = serde_json::to_string(&DiffFlameGraph::default()).expect("encodes");
    let back: DiffFlameGraph = serde_json::from_str(&empty).expect("decodes");
    assert_eq!(back.node_count(), 1);
}
