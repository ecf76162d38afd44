use super::*;

/// Appends `value` as a zig-zag variable-length integer.
fn push_vlq(bytes: &mut Vec<u8>, value: i64) {
    let mut encoded = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let more = encoded > 0x7f;
        bytes.push((encoded & 0x7f) as u8 | if more { 0x80 } else { 0 });
        encoded >>= 7;
        if !more {
            break;
        }
    }
}

/// A source position table of (code offset, statement?, position) entries,
/// encoded as V8 encodes it.
fn table(entries: &[(i64, bool, SourcePosition)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let (mut code, mut source) = (-1i64, 0i64);
    for &(offset, statement, position) in entries {
        let delta = offset - code;
        push_vlq(&mut bytes, if statement { delta } else { -delta - 1 });
        push_vlq(&mut bytes, position.0 as i64 - source);
        code = offset;
        source = position.0 as i64;
    }
    bytes
}

/// A position at script offset `offset` with inlining id `id`.
fn at(offset: u32, id: u16) -> SourcePosition {
    SourcePosition((u64::from(id) << 31) | (u64::from(offset + 1) << 1))
}

fn inlining_bytes(entries: &[(SourcePosition, i32)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for &(call_site, function) in entries {
        bytes.extend_from_slice(&call_site.0.to_le_bytes());
        bytes.extend_from_slice(&function.to_le_bytes());
        // Padding, which V8 leaves uninitialised.
        bytes.extend_from_slice(&[0xd0, 0x7f, 0, 0]);
    }
    bytes
}

#[test]
fn source_positions_decode_fields() {
    let position = at(40, 2);
    assert_eq!(position.inlining_id(), 2);
    assert_eq!(position.script_offset(), Some(40));
    assert_eq!(SourcePosition(0).script_offset(), None);
    // External positions (builtins' file and line) have no script offset.
    assert_eq!(SourcePosition(1 | (7 << 1)).script_offset(), None);
    // Node 24's Maglev code: script offset 40 in inlining 2, as read.
    assert_eq!(SourcePosition(0x1_0000_0050).inlining_id(), 2);
    assert_eq!(SourcePosition(0x1_0000_0050).script_offset(), Some(39));
}

#[test]
fn a_pc_finds_the_last_entry_at_or_before_it() {
    let bytes = table(&[
        (0, true, at(142, 0)),
        (39, false, at(91, 1)),
        (80, true, at(40, 1)),
        (287, true, at(218, 0)),
        (401, false, at(40, 2)),
        (598, true, at(164, 0)),
    ]);
    assert_eq!(position_at(&bytes, 0), Some(at(142, 0)));
    assert_eq!(position_at(&bytes, 38), Some(at(142, 0)));
    assert_eq!(position_at(&bytes, 39), Some(at(91, 1)));
    assert_eq!(position_at(&bytes, 300), Some(at(218, 0)));
    assert_eq!(position_at(&bytes, 545), Some(at(40, 2)));
    assert_eq!(position_at(&bytes, 100_000), Some(at(164, 0)));
    // Before the first entry, and an empty table: nothing.
    let late = table(&[(11, true, at(3, 0))]);
    assert_eq!(position_at(&late, 10), None);
    assert_eq!(position_at(&[], 10), None);
}

#[test]
fn the_bytes_node_24_wrote_decode() {
    // The first entries of a Maglev table read from Node 24 (V8 13.6):
    // code 11 at raw 0x11c, then code 11 again, code 32, code 39 at raw
    // 0x8000_00b6 (inlining 1).
    let bytes = [
        0x19, 0xb8, 0x04, 0x01, 0x00, 0x2b, 0x00, 0x0f, 0xb4, 0xfe, 0xff, 0xff, 0x0f,
    ];
    assert_eq!(position_at(&bytes, 11), Some(SourcePosition(0x11c)));
    assert_eq!(position_at(&bytes, 38), Some(SourcePosition(0x11c)));
    assert_eq!(position_at(&bytes, 39), Some(SourcePosition(0x8000_00b6)));
}

#[test]
fn malformed_tables_end_without_a_position_past_them() {
    // A continuation byte with nothing after it.
    assert_eq!(position_at(&[0x80], 5), None);
    // Eleven continuation bytes: more than 64 bits.
    let long = [0xffu8; 11];
    assert_eq!(position_at(&long, 5), None);
    // A good entry, then a truncated one: the good one is not trusted
    // either, as the table is not V8's.
    let mut bytes = table(&[(0, true, at(1, 0))]);
    bytes.push(0x80);
    assert_eq!(position_at(&bytes, 5), None);
}

#[test]
fn inlining_chains_are_innermost_first_and_bounded() {
    // Function 3 inlined into function 1 (inlining 2), itself inlined into
    // the optimized function (inlining 1).
    let inlinings = parse_inlining_positions(&inlining_bytes(&[(at(218, 0), 1), (at(30, 1), 3)]));
    assert_eq!(inlinings.len(), 2);
    assert_eq!(inlinings[1].function, 3);
    assert_eq!(inlined_functions(at(40, 2), &inlinings), Some(vec![3, 1]));
    assert_eq!(inlined_functions(at(40, 1), &inlinings), Some(vec![1]));
    assert_eq!(inlined_functions(at(40, 0), &inlinings), Some(vec![]));
    // An id past the table, an unknown function, a loop, a cycle upward.
    assert_eq!(inlined_functions(at(40, 3), &inlinings), None);
    let unknown = parse_inlining_positions(&inlining_bytes(&[(at(1, 0), -1)]));
    assert_eq!(inlined_functions(at(40, 1), &unknown), None);
    let looping = parse_inlining_positions(&inlining_bytes(&[(at(1, 1), 0)]));
    assert_eq!(inlined_functions(at(40, 1), &looping), None);
    let upward = parse_inlining_positions(&inlining_bytes(&[(at(1, 2), 0), (at(1, 1), 0)]));
    assert_eq!(inlined_functions(at(40, 2), &upward), None);
    // A trailing partial entry is ignored.
    let mut bytes = inlining_bytes(&[(at(1, 0), 0)]);
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(parse_inlining_positions(&bytes).len(), 1);
}

#[test]
fn a_chain_deeper_than_the_cap_is_refused() {
    let entries: Vec<(SourcePosition, i32)> = (0..=MAX_INLINING_DEPTH as u16)
        .map(|id| (at(1, id), 0))
        .collect();
    let inlinings = parse_inlining_positions(&inlining_bytes(&entries));
    let deepest = at(1, MAX_INLINING_DEPTH as u16 + 1);
    assert_eq!(inlined_functions(deepest, &inlinings), None);
    let within = at(1, MAX_INLINING_DEPTH as u16);
    assert_eq!(
        inlined_functions(within, &inlinings).map(|chain| chain.len()),
        Some(MAX_INLINING_DEPTH)
    );
}

#[test]
fn several_names_go_in_at_one_frame() {
    let native = [0x10, 0x20, 0x30, 0x40];
    let (a, b, c, d) = (1 << 62, (1 << 62) | 1, (1 << 62) | 2, (1 << 62) | 3);
    let woven = weave(
        &native,
        &[
            (0, CodeKind::Jit, a),
            (0, CodeKind::Jit, b),
            (2, CodeKind::Builtin, c),
            (3, CodeKind::Jit, d),
        ],
    );
    assert_eq!(woven, vec![a, b, 0x20, c, 0x30, d]);
}
