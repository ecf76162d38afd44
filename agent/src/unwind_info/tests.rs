use super::*;

/// Builds a C object whose only unwind info is `.debug_frame`, with
/// `-gz=<compression>` (an object: a linked program would get the C
/// runtime's `.eh_frame`); `None` (and a visible skip) without gcc, a
/// failure under CI.
fn debug_frame_only_program(dir: &std::path::Path, compression: &str) -> Option<Vec<u8>> {
    let source = dir.join("leaf.c");
    std::fs::write(
        &source,
        "int leaf(int x) { return x * 3; }\nint main(void) { return leaf(2); }\n",
    )
    .expect("source");
    let output = dir.join(format!("leaf-{compression}.o"));
    let built = std::process::Command::new("gcc")
        .args([
            "-c",
            "-O1",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ])
        .arg(format!("-gz={compression}"))
        .arg("-o")
        .arg(&output)
        .arg(&source)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "gcc is needed in CI"
        );
        eprintln!("SKIPPED: gcc could not build a program with -gz={compression}");
        return None;
    }
    Some(std::fs::read(output).expect("built program"))
}

#[test]
fn a_zlib_compressed_debug_frame_is_read_as_its_plain_twin() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (Some(plain), Some(zlib)) = (
        debug_frame_only_program(dir.path(), "none"),
        debug_frame_only_program(dir.path(), "zlib"),
    ) else {
        return;
    };
    let limits = UnwindInfoLimits::default();
    let plain = read_unwind_sections(plain.as_slice(), &limits).expect("plain");
    let zlib = read_unwind_sections(zlib.as_slice(), &limits).expect("zlib");
    assert!(plain.eh_frame.is_none() && zlib.eh_frame.is_none());
    let plain = plain.debug_frame.expect(".debug_frame").to_vec();
    assert!(!plain.is_empty());
    assert_eq!(zlib.debug_frame.expect("inflated").to_vec(), plain);
    // Declared larger than the cap: refused before inflating.
    let tight = UnwindInfoLimits {
        max_bytes_per_object: plain.len() as u64 - 1,
        ..limits
    };
    let zlib = debug_frame_only_program(dir.path(), "zlib").expect("built above");
    assert!(matches!(
        read_unwind_sections(zlib.as_slice(), &tight),
        Err(UnwindInfoError::TooLarge { .. })
    ));
}

#[test]
fn a_compressed_section_that_lies_about_its_size_is_malformed() {
    let mut section = Vec::new();
    section.extend_from_slice(&1u32.to_le_bytes());
    section.extend_from_slice(&0u32.to_le_bytes());
    section.extend_from_slice(&100u64.to_le_bytes());
    section.extend_from_slice(&1u64.to_le_bytes());
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut encoder, &[7u8; 10]).expect("deflate");
    section.extend(encoder.finish().expect("deflate"));
    assert!(matches!(
        inflate_section(&section, 1 << 20),
        Err(UnwindInfoError::Malformed { .. })
    ));
    section[0] = 2; // zstd
    assert!(matches!(
        inflate_section(&section, 1 << 20),
        Err(UnwindInfoError::Malformed { .. })
    ));
    assert!(inflate_section(&section[..10], 1 << 20).is_err());
}

fn own_executable() -> Vec<u8> {
    std::fs::read("/proc/self/exe").expect("own executable is readable")
}

#[test]
fn own_executable_has_eh_frame_with_header_and_an_executable_segment() {
    let bytes = own_executable();
    let sections = read_unwind_sections(bytes.as_slice(), &UnwindInfoLimits::default())
        .expect("a Rust test binary has unwind info");
    let (eh_range, eh_bytes) = sections.eh_frame.as_ref().expect(".eh_frame");
    assert_eq!(eh_range.end - eh_range.start, eh_bytes.len() as u64);
    assert!(sections.eh_frame_hdr.is_some());
    assert!(sections.segments.iter().any(|s| s.executable));
    assert!(sections.held_bytes() >= eh_bytes.len() as u64);
}

#[test]
fn file_reads_agree_with_slice_reads() {
    let file = File::open("/proc/self/exe").expect("open own executable");
    let from_file = read_from_file(&file, &UnwindInfoLimits::default()).expect("file");
    let bytes = own_executable();
    let from_slice =
        read_unwind_sections(bytes.as_slice(), &UnwindInfoLimits::default()).expect("slice");
    assert_eq!(
        from_file.eh_frame.map(|(_, b)| b.to_vec()),
        from_slice.eh_frame.map(|(_, b)| b.to_vec())
    );
}

#[test]
fn search_tables_pointing_outside_eh_frame_are_dropped() {
    let bytes = own_executable();
    let sections = read_unwind_sections(bytes.as_slice(), &UnwindInfoLimits::default())
        .expect("own unwind info");
    let (eh_range, _) = sections.eh_frame.clone().expect(".eh_frame");
    let (hdr_range, hdr) = sections.eh_frame_hdr.clone().expect("sound table kept");
    assert!(search_table_is_sound(
        &hdr,
        hdr_range.start,
        eh_range.clone()
    ));
    let mut bad = hdr.to_vec();
    // The first entry's FDE pointer now points far before .eh_frame.
    bad[16..20].copy_from_slice(&i32::MIN.to_le_bytes());
    assert!(!search_table_is_sound(
        &bad,
        hdr_range.start,
        eh_range.clone()
    ));
    let mut unsorted = hdr.to_vec();
    unsorted[12..16].copy_from_slice(&i32::MAX.to_le_bytes());
    assert!(!search_table_is_sound(
        &unsorted,
        hdr_range.start,
        eh_range.clone()
    ));
    assert!(!search_table_is_sound(
        &hdr[..10],
        hdr_range.start,
        eh_range
    ));
}

#[test]
fn objects_over_the_cap_are_refused_before_reading() {
    let bytes = own_executable();
    let limits = UnwindInfoLimits {
        max_bytes_per_object: 64,
        ..UnwindInfoLimits::default()
    };
    let error = read_unwind_sections(bytes.as_slice(), &limits).expect_err("over the cap");
    assert_eq!(error.reason(), "too_large");
}

#[test]
fn non_elf_and_truncated_input_are_clean_errors() {
    assert_eq!(
        read_unwind_sections(&b"#!/bin/sh\n"[..], &UnwindInfoLimits::default())
            .expect_err("script")
            .reason(),
        "not_elf"
    );
    let bytes = own_executable();
    for cut in [16, 64, 200, bytes.len() / 2] {
        // Whatever a cut leaves, the answer is an error or sections that
        // are within the file: never a panic.
        let _ = read_unwind_sections(&bytes[..cut], &UnwindInfoLimits::default());
    }
}

#[test]
fn base_address_accounts_for_segment_offset_and_vaddr() {
    let sections = UnwindSections {
        segments: vec![
            LoadSegment {
                file_offset: 0,
                vaddr: 0,
                file_size: 0x1000,
                executable: false,
            },
            // lld-style layout: vaddr is one page above the offset.
            LoadSegment {
                file_offset: 0x1000,
                vaddr: 0x2000,
                file_size: 0x5000,
                executable: true,
            },
        ],
        ..UnwindSections::default()
    };
    let base = sections
        .base_avma(0x7f00_0000_1000, 0x1000)
        .expect("offset in the text segment");
    // svma 0x2000 (file offset 0x1000) is at the mapping start.
    assert_eq!(base + 0x2000, 0x7f00_0000_1000);
    assert_eq!(
        sections.base_avma(0x7f00_0000_0000, 0),
        None,
        "not executable"
    );
}
