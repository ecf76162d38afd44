//! The `_Py_DebugOffsets` reader against the tables of Debian's real
//! CPython 3.13, 3.14 and 3.15 (copied from the start of `_PyRuntime` in
//! each `python3.x` of Debian forky), a future release, and forged tables.

use super::*;
use crate::python::offsets::for_minor;

/// Debian forky's python3.13: the table's words after the cookie.
const DEBIAN_3_13: [u64; 72] = [
    51187696, 0, 283408, 608, 632, 194984, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752, 0,
    7768, 7760, 312, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112, 120, 128,
    136, 68, 52, 96, 104, 200, 16, 8, 416, 24, 88, 168, 32, 24, 16, 40, 24, 16, 48, 32, 40, 24, 16,
    32, 16, 24, 40, 16, 32, 64, 32, 16, 40, 240, 200,
];
/// Debian forky's python3.14: the table's words after the cookie.
const DEBIAN_3_14: [u64; 93] = [
    51251440, 0, 316616, 784, 808, 225864, 7280, 7272, 7344, 7360, 7408, 7688, 7672, 7680, 16,
    7784, 0, 7800, 7792, 7992, 0, 832, 0, 8, 16, 72, 152, 160, 232, 32, 88, 8, 0, 56, 80, 74, 64,
    0, 216, 112, 120, 128, 136, 68, 52, 96, 104, 208, 0, 16, 8, 416, 24, 88, 168, 40, 32, 16, 40,
    24, 16, 200, 24, 40, 32, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16, 32, 64, 32, 16, 40, 264, 192,
    160, 24, 72, 67, 0, 8, 24, 304, 8076, 0, 4,
];
/// Debian forky's python3.15: the table's words after the cookie.
const DEBIAN_3_15: [u64; 93] = [
    51314928, 0, 346568, 912, 936, 226240, 7272, 7264, 7336, 7352, 7400, 7592, 7576, 7584, 16,
    7736, 0, 7752, 7744, 7944, 0, 888, 0, 8, 16, 72, 80, 88, 96, 176, 184, 256, 32, 36, 40, 136,
    288, 0, 88, 8, 0, 56, 80, 74, 64, 0, 216, 112, 120, 128, 136, 68, 52, 96, 104, 208, 0, 16, 8,
    424, 24, 88, 168, 32, 288, 944, 888, 40, 32, 16, 40, 24, 16, 200, 24, 40, 32, 48, 32, 40, 24,
    16, 32, 16, 24, 40, 16, 32, 64, 32, 16, 40, 56,
];

/// A table as read from `_PyRuntime`: the cookie, `words`, then zeros up to
/// [`TABLE_BYTES`] (the rest of `_PyRuntimeState`).
fn table(words: &[u64]) -> Vec<u8> {
    let mut bytes = COOKIE.to_vec();
    for word in words {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes.resize(TABLE_BYTES.max(bytes.len()), 0);
    bytes
}

/// Sets word `index` (counted from the cookie) of a table.
fn with_word(mut bytes: Vec<u8>, index: usize, value: u64) -> Vec<u8> {
    bytes[index * 8..index * 8 + 8].copy_from_slice(&value.to_le_bytes());
    bytes
}

#[test]
fn the_3_13_table_gives_the_agents_own_3_13_offsets() {
    let parsed = parse(&table(&DEBIAN_3_13)).expect("Debian's 3.13 table");
    let own = for_minor(13).expect("3.13 row");
    // The table's interpreters.head is at 632; main follows it.
    assert_eq!(parsed.frames.runtime_interpreters_main, 640);
    assert_eq!(parsed, *own);
}

#[test]
fn the_3_14_table_tags_the_code_pointer_and_moves_the_thread_state() {
    let parsed = parse(&table(&DEBIAN_3_14)).expect("Debian's 3.14 table");
    assert_eq!(parsed.minor, 14);
    let f = &parsed.frames;
    assert_eq!(f.code_tag_mask, STACK_REF_TAG_MASK);
    assert_eq!(
        (f.runtime_interpreters_main, f.interp_threads_head),
        (816, 7344)
    );
    assert_eq!(
        (f.tstate_next, f.tstate_frame, f.tstate_thread_id),
        (8, 72, 152)
    );
    assert_eq!(
        (
            f.frame_previous,
            f.frame_code,
            f.frame_position,
            f.frame_entry
        ),
        (8, 0, 56, 74)
    );
    assert_eq!(
        (
            parsed.code_name,
            parsed.code_filename,
            parsed.code_linetable,
            parsed.code_firstlineno,
            parsed.code_adaptive
        ),
        (128, 112, 136, 68, 208)
    );
    assert_eq!(
        (parsed.unicode_ascii_data, parsed.unicode_compact_data),
        (40, 56)
    );
}

#[test]
fn the_3_15_table_moves_thread_id_and_sizes_compact_strings_itself() {
    let parsed = parse(&table(&DEBIAN_3_15)).expect("Debian's 3.15 table");
    assert_eq!(parsed.minor, 15);
    assert_eq!(parsed.frames.tstate_thread_id, 176);
    assert_eq!(parsed.frames.runtime_interpreters_main, 944);
    assert_eq!(parsed.frames.frame_entry, 74);
    assert_eq!(parsed.code_adaptive, 208);
    assert_eq!(parsed.unicode_compact_data, 56);
    assert_eq!(parsed.frames.code_tag_mask, STACK_REF_TAG_MASK);
}

#[test]
fn a_newer_release_that_keeps_the_fields_places_is_read() {
    // 3.16.0a1, with 3.15's table.
    let mut words = DEBIAN_3_15;
    words[0] = 0x0310_00a1;
    let parsed = parse(&table(&words)).expect("a future table");
    assert_eq!(parsed.minor, 16);
    let current = parse(&table(&DEBIAN_3_15)).expect("3.15");
    assert_eq!(
        parsed,
        VersionOffsets {
            minor: 16,
            ..current
        }
    );
}

#[test]
fn forged_or_foreign_tables_are_refused_with_a_reason() {
    let good = table(&DEBIAN_3_14);
    assert!(matches!(
        parse(&good[..100]),
        Err(DebugOffsetsError::Short { len: 100 })
    ));
    let mut no_cookie = good.clone();
    no_cookie[0] = b'X';
    assert!(matches!(
        parse(&no_cookie),
        Err(DebugOffsetsError::NoCookie { .. })
    ));
    for version in [0x030c_00f0, 0x020e_00f0, 0x0364_0000, u64::MAX] {
        assert_eq!(
            parse(&with_word(good.clone(), 1, version)),
            Err(DebugOffsetsError::BadVersion { version })
        );
    }
    // The thread state's size (word 22 in 3.14) zero, or absurd.
    for size in [0, MAX_STRUCT_SIZE + 1] {
        assert!(matches!(
            parse(&with_word(good.clone(), 22, size)),
            Err(DebugOffsetsError::BadSize {
                section: TSTATE,
                ..
            })
        ));
    }
    // thread_id (word 27) past the thread state, past 16 bits, misaligned.
    for offset in [832, 900, 70_000, 153, u64::MAX] {
        assert!(
            matches!(
                parse(&with_word(good.clone(), 27, offset)),
                Err(DebugOffsetsError::BadOffset {
                    field: "thread_id",
                    ..
                })
            ),
            "{offset}"
        );
    }
    // A bigger struct lets a far offset through only within 16 bits.
    let big = with_word(good.clone(), 22, 1 << 20);
    assert!(parse(&with_word(big.clone(), 27, 60_000)).is_ok());
    assert!(parse(&with_word(big, 27, 65_536)).is_err());
    // A string header of an odd size.
    assert!(matches!(
        parse(&with_word(good, 80, 41)),
        Err(DebugOffsetsError::BadSize { .. })
    ));
}

#[test]
fn arbitrary_tables_never_panic() {
    // A small xorshift, so the run is the same every time.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut accepted = 0;
    for round in 0..20_000 {
        let mut words = DEBIAN_3_15;
        // Change a few words to anything, or to small numbers.
        for _ in 0..(1 + round % 4) {
            let index = (next() % words.len() as u64) as usize;
            words[index] = if round % 2 == 0 {
                next()
            } else {
                next() % 1024
            };
        }
        if let Ok(offsets) = parse(&table(&words)) {
            accepted += 1;
            assert!(offsets.minor >= FIRST_MINOR);
        }
    }
    assert!(accepted > 0, "unchanged words still parse");
}
