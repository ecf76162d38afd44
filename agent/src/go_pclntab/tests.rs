//! Tests of the table reader on tables written as Go's linker lays them out.

use super::*;

fn functions(table: &Pclntab, mut section: &[u8]) -> Vec<GoFunction> {
    let mut all = Vec::new();
    table.each_function(&mut section, |_, function| all.push(function));
    all
}

/// A table of two functions at 0x401000 and 0x401040 (the first a
/// root), ending at 0x401080, in `layout`, as Go's linker lays it out.
fn table(layout: PclntabLayout) -> Vec<u8> {
    let mut section = vec![0u8; 0x200];
    let magic: u32 = match layout {
        PclntabLayout::Go116 => 0xffff_fffa,
        PclntabLayout::Go118 => 0xffff_fff0,
        PclntabLayout::Go120 => 0xffff_fff1,
    };
    section[..4].copy_from_slice(&magic.to_le_bytes());
    section[6] = 1; // quantum
    section[7] = 8; // pointer size
    // nfunc, nfiles, [textStart,] funcname, cu, filetab, pctab, pcln
    let words: Vec<u64> = match layout {
        PclntabLayout::Go116 => vec![2, 0, 0x60, 0x70, 0x70, 0x80, 0x100],
        _ => vec![2, 0, 0x401000, 0x60, 0x70, 0x70, 0x80, 0x100],
    };
    for (i, word) in words.iter().enumerate() {
        section[8 + i * 8..16 + i * 8].copy_from_slice(&word.to_le_bytes());
    }
    section[0x60..0x6a].copy_from_slice(b"main.root\0");
    section[0x6a..0x70].copy_from_slice(b"main.\0");
    // pcsp of the second function: 0 for 4 bytes, 24 for 0x38, 0 to the end.
    // Value deltas are zig-zag: +1 from -1 is 2, +24 is 48, -24 is 47.
    section[0x80..0x86].copy_from_slice(&[2, 4, 48, 0x38, 47, 4]);
    // The function table, (entry, funcoff) x 3, then the _func records
    // at 0x140 and 0x170 (offsets from the table): the name offset, the
    // pcsp offset (0 for both) and the flag where the layout puts them.
    let entries = [(0x401000u64, 0x40u64), (0x401040, 0x70), (0x401080, 0)];
    let (fields, flag) = match layout {
        PclntabLayout::Go116 => {
            for (i, (entry, func)) in entries.iter().enumerate() {
                section[0x100 + i * 16..0x108 + i * 16].copy_from_slice(&entry.to_le_bytes());
                section[0x108 + i * 16..0x110 + i * 16].copy_from_slice(&func.to_le_bytes());
            }
            (8, 41)
        }
        PclntabLayout::Go118 | PclntabLayout::Go120 => {
            for (i, (entry, func)) in entries.iter().enumerate() {
                let entry = (entry - 0x401000) as u32;
                let func = *func as u32;
                section[0x100 + i * 8..0x104 + i * 8].copy_from_slice(&entry.to_le_bytes());
                section[0x104 + i * 8..0x108 + i * 8].copy_from_slice(&func.to_le_bytes());
            }
            (
                4,
                if layout == PclntabLayout::Go118 {
                    37
                } else {
                    41
                },
            )
        }
    };
    section[0x140 + fields..0x144 + fields].copy_from_slice(&0u32.to_le_bytes());
    section[0x140 + flag] = FUNC_FLAG_TOPFRAME;
    section[0x170 + fields..0x174 + fields].copy_from_slice(&5u32.to_le_bytes());
    section
}

fn table_120() -> Vec<u8> {
    table(PclntabLayout::Go120)
}

#[test]
fn the_go_116_and_118_layouts_read_as_the_120_one() {
    for layout in [PclntabLayout::Go116, PclntabLayout::Go118] {
        let section = table(layout);
        let table = Pclntab::parse(&mut section.as_slice(), 0).expect("parsed");
        assert_eq!(table.layout, layout);
        let reference = table_120();
        let expected = functions(
            &Pclntab::parse(&mut reference.as_slice(), 0).expect("parsed"),
            &reference,
        );
        let functions: Vec<GoFunction> = functions(&table, &section);
        assert_eq!(functions, expected, "{layout:?}");
        assert_eq!(
            table.sp_steps(&mut section.as_slice(), &functions[1]).len(),
            3
        );
    }
}

#[test]
fn a_go_120_table_gives_each_function_its_range_name_and_root_flag() {
    let section = table_120();
    let table = Pclntab::parse(&mut section.as_slice(), 0).expect("parsed");
    assert_eq!(table.layout, PclntabLayout::Go120);
    assert_eq!(table.names(), 0x60..0x70);
    let functions: Vec<GoFunction> = functions(&table, &section);
    assert_eq!(functions.len(), 2);
    assert_eq!(
        (functions[0].entry, functions[0].end, functions[0].top_frame),
        (0x401000, 0x401040, true)
    );
    assert_eq!(
        (functions[1].entry, functions[1].end, functions[1].name),
        (0x401040, 0x401080, 5)
    );
    assert_eq!(
        table.sp_steps(&mut section.as_slice(), &functions[1]),
        vec![
            (0x401040..0x401044, 0),
            (0x401044..0x40107c, 24),
            (0x40107c..0x401080, 0)
        ]
    );
}

#[test]
fn the_function_index_finds_each_pcs_function_and_reads_its_rules() {
    let section = table_120();
    let pclntab = Pclntab::parse(&mut section.as_slice(), 0).expect("parsed");
    let index = GoFunctionIndex::build(&pclntab, &mut section.as_slice(), 0x400000).expect("built");
    assert_eq!(index.held_bytes(), 16);
    let rule = |pc: u64| {
        let at = index.function_at(pc)?;
        index
            .rules(&mut section.as_slice(), &at)
            .rule_at(pc - at.entry)
    };
    assert_eq!(rule(0x401010), Some(GoFrameRule::Root));
    assert_eq!(rule(0x401040), Some(GoFrameRule::StackPointerBelowEntry(0)));
    assert_eq!(
        rule(0x401050),
        Some(GoFrameRule::StackPointerBelowEntry(24))
    );
    assert_eq!(rule(0x40107f), Some(GoFrameRule::StackPointerBelowEntry(0)));
    assert_eq!(index.function_at(0x401080), None, "past the last function");
    assert_eq!(index.function_at(0x400fff), None, "before the first");
    assert_eq!(index.function_at(0x3fffff), None, "below the base");
    // A table that reads as nothing gives no rule, not a neighbour's.
    let mut broken = section.clone();
    broken[0x80..0x86].copy_from_slice(&[0xff; 6]);
    let at = index.function_at(0x401050).expect("found");
    assert_eq!(index.rules(&mut broken.as_slice(), &at).rule_at(0x10), None);
}

#[test]
fn a_small_window_reads_across_its_edges() {
    let section = table_120();
    let mut reads = 0;
    let mut source = WindowedSection::with_window(
        |at, buffer: &mut [u8]| {
            reads += 1;
            let at = at as usize;
            buffer.copy_from_slice(&section[at..at + buffer.len()]);
            true
        },
        0,
        section.len(),
        100,
    );
    for offset in [0, 60, 95, 99, 0x100, 0x1c0] {
        assert_eq!(
            source.bytes(offset, 16).map(<[u8]>::to_vec),
            Some(section[offset..offset + 16].to_vec())
        );
    }
    assert_eq!(source.bytes(section.len() - 4, 8), None, "past the end");
    assert_eq!(source.bytes(0, MAX_READ + 1), None, "over the read size");
}

#[test]
fn forged_headers_and_tables_are_refused_or_cut_short() {
    let section = table_120();
    assert!(matches!(
        Pclntab::parse(&mut &section[..4], 0),
        Err(GoPclntabError::Malformed { .. })
    ));
    let mut wrong = section.clone();
    wrong[..4].copy_from_slice(&0xffff_fffbu32.to_le_bytes());
    assert_eq!(
        Pclntab::parse(&mut wrong.as_slice(), 0),
        Err(GoPclntabError::UnknownMagic { magic: 0xffff_fffb })
    );
    // More functions than the section holds.
    let mut many = section.clone();
    many[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(Pclntab::parse(&mut many.as_slice(), 0).is_err());
    // An offset past the end.
    let mut far = section.clone();
    far[64..72].copy_from_slice(&0x10_0000u64.to_le_bytes());
    assert!(Pclntab::parse(&mut far.as_slice(), 0).is_err());
    // A pc table of endless varints and one that never ends.
    let mut endless = section.clone();
    endless[0x80..0x86].copy_from_slice(&[0xff; 6]);
    let table = Pclntab::parse(&mut endless.as_slice(), 0).expect("header is fine");
    let function = table
        .function(&mut endless.as_slice(), 1)
        .expect("record is fine");
    assert!(
        table
            .sp_steps(&mut endless.as_slice(), &function)
            .is_empty()
    );
    let mut long = section.clone();
    long[0x80..0x84].copy_from_slice(&[2, 1, 2, 1]);
    long[0x84..0x100].fill(1);
    let table = Pclntab::parse(&mut long.as_slice(), 0).expect("header is fine");
    let function = table
        .function(&mut long.as_slice(), 1)
        .expect("record is fine");
    let steps = table.sp_steps(&mut long.as_slice(), &function);
    assert!(steps.len() <= 0x40, "bounded by the function's size");
    assert!(steps.iter().all(|(range, _)| range.end <= 0x401080));
}

#[test]
fn varints_past_32_bits_are_malformed() {
    assert_eq!(uvarint(&[0x05, 9]), Some((5, &[9u8][..])));
    assert_eq!(uvarint(&[0x80, 0x01]), Some((128, &[][..])));
    assert_eq!(uvarint(&[0x80; 6]), None);
    assert_eq!(uvarint(&[]), None);
}
