use super::*;

#[test]
fn same_content_interns_to_same_id() {
    let mut table = SymbolTable::new();
    let a = table.intern_string("main");
    assert_eq!(table.intern_string("main"), a);
    assert_eq!(table.intern_string(""), 0);
    let f = table.intern_function(Function {
        name: a,
        system_name: a,
        filename: 0,
        start_line: 1,
    });
    let lines = [Line {
        function: f,
        line: 3,
    }];
    let l1 = table.intern_location(NO_MAPPING, 0x10, &lines);
    let l2 = table.intern_location(NO_MAPPING, 0x10, &lines);
    assert_eq!(l1, l2);
    let l3 = table.intern_location(NO_MAPPING, 0x11, &lines);
    assert_ne!(l1, l3);
    let n1 = table.intern_node(ROOT_NODE, l1);
    let n2 = table.intern_node(n1, l3);
    assert_eq!(table.intern_node(n1, l3), n2);
    let mut out = Vec::new();
    table.stack_locations(n2, &mut out);
    assert_eq!(out, vec![l3, l1]);
}

#[test]
fn interning_a_whole_stack_matches_interning_it_frame_by_frame() {
    let mut table = SymbolTable::new();
    let locs: Vec<u32> = (0..6)
        .map(|a| table.intern_location(NO_MAPPING, a, &[]))
        .collect();
    let stacks: [&[u32]; 5] = [
        &[locs[0], locs[1], locs[2]],
        &[locs[0], locs[1]],
        &[locs[0], locs[1], locs[2]],
        &[locs[3], locs[1], locs[2], locs[4], locs[5]],
        &[],
    ];
    let mut by_frame = SymbolTable::new();
    for &l in &locs {
        by_frame.intern_location(NO_MAPPING, u64::from(l), &[]);
    }
    for stack in stacks {
        let mut expected = ROOT_NODE;
        for &location in stack {
            expected = by_frame.intern_node(expected, location);
        }
        assert_eq!(table.intern_stack(stack), expected);
        let mut leaf_first = Vec::new();
        table.stack_locations(expected, &mut leaf_first);
        leaf_first.reverse();
        assert_eq!(leaf_first, stack);
    }
    assert_eq!(table.node_count(), by_frame.node_count());
    // A stack first reached node by node is found by its whole-stack lookup too.
    let node = table.intern_node(ROOT_NODE, locs[5]);
    assert_eq!(table.intern_stack(&[locs[5]]), node);
    assert_eq!(table.node_count(), by_frame.node_count() + 1);
}

#[test]
fn thousand_identical_stacks_cost_one_entry_each() {
    let mut table = SymbolTable::new();
    let mut last = 0;
    for _ in 0..1000 {
        let mut node = ROOT_NODE;
        for address in [1u64, 2, 3] {
            let loc = table.intern_location(NO_MAPPING, address, &[]);
            node = table.intern_node(node, loc);
        }
        last = node;
    }
    assert_eq!(table.locations.len(), 3);
    assert_eq!(table.node_count(), 4);
    assert_eq!(last, 3);
}
