//! Real ELF files, built at test time: a C program with a static hot
//! function and an inlined helper, compiled with `gcc -g`, its debug info
//! split off with `objcopy --only-keep-debug`, and stripped. Needs gcc and
//! binutils (skipped visibly without them, failed under `CI=true`).

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_debuginfo::{DebugFile, DebugInfoError, DebugInfoLimits, FileKind};
use kiln_testkit::prerequisites::missing;
use object::{Object, ObjectSegment, ObjectSymbol};

const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static __attribute__((noinline)) unsigned long hot_static_work(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++) acc = acc * 31 + i;
    return acc;
}
static inline unsigned long inlined_helper(unsigned long x) {
    return hot_static_work(x) ^ 7;
}
int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000;
    printf("%lu\n", inlined_helper(n));
    return 0;
}
"#;

struct Built {
    _dir: tempfile::TempDir,
    full: PathBuf,
    debug: PathBuf,
    stripped: PathBuf,
}

fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

fn build() -> Option<Built> {
    for tool in ["gcc", "objcopy", "strip"] {
        if !run(tool, &["--version"]) {
            return missing(&format!("{tool} (Debian build-essential, binutils)"));
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let source = dir.path().join("hot.c");
    std::fs::write(&source, PROGRAM).expect("write source");
    let full = dir.path().join("hot");
    let debug = dir.path().join("hot.debug");
    let stripped = dir.path().join("hot.stripped");
    let s = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
    assert!(run("gcc", &["-g", "-O1", "-o", &s(&full), &s(&source)]));
    assert!(run(
        "objcopy",
        &["--only-keep-debug", &s(&full), &s(&debug)]
    ));
    assert!(run("strip", &["-o", &s(&stripped), &s(&full)]));
    assert!(run(
        "objcopy",
        &[&format!("--add-gnu-debuglink={}", s(&debug)), &s(&stripped)]
    ));
    Some(Built {
        _dir: dir,
        full,
        debug,
        stripped,
    })
}

/// The address of `name` in the unstripped binary, and the file offset of
/// that address with the file offset its executable segment is mapped from.
fn where_is(full: &[u8], name: &str) -> (u64, u64, u64) {
    let file = object::File::parse(full).expect("elf");
    let symbol = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("{name} in the symbol table"));
    let address = symbol.address();
    let segment = file
        .segments()
        .find(|s| s.address() <= address && address < s.address() + s.size())
        .expect("segment");
    let (segment_offset, _) = segment.file_range();
    let file_offset = address - segment.address() + segment_offset;
    (address, file_offset, segment_offset & !0xfff)
}

#[test]
fn a_static_function_is_named_from_the_binary_and_from_its_split_debug_info() {
    let Some(built) = build() else { return };
    let full = std::fs::read(&built.full).unwrap();
    let (_, offset, mapping_offset) = where_is(&full, "hot_static_work");
    let binary = DebugFile::parse(&full, DebugInfoLimits::default()).unwrap();
    assert_eq!(binary.kind(), FileKind::Binary);
    assert!(binary.has_dwarf());
    let frames = binary.frames(offset + 4, mapping_offset);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].function, "hot_static_work");
    assert!(frames[0].file.ends_with("hot.c"), "{frames:?}");
    assert!((4..=7).contains(&frames[0].line), "{frames:?}");

    let debug = DebugFile::parse(
        &std::fs::read(&built.debug).unwrap(),
        DebugInfoLimits::default(),
    )
    .unwrap();
    assert_eq!(debug.kind(), FileKind::DebugOnly);
    assert_eq!(debug.build_id(), binary.build_id());
    assert!(debug.build_id().is_some());
    assert_eq!(debug.frames(offset + 4, mapping_offset), frames);

    let stripped = DebugFile::parse(
        &std::fs::read(&built.stripped).unwrap(),
        DebugInfoLimits::default(),
    )
    .unwrap();
    assert_eq!(stripped.build_id(), binary.build_id());
    assert!(!stripped.has_dwarf());
    assert!(
        stripped.frames(offset + 4, mapping_offset).is_empty(),
        "a stripped binary has no name for a static function"
    );
}

#[test]
fn an_inlined_call_gives_its_own_frame_and_its_callers() {
    let Some(built) = build() else { return };
    let full = std::fs::read(&built.full).unwrap();
    let (_, offset, mapping_offset) = where_is(&full, "main");
    let file = object::File::parse(&*full).unwrap();
    let size = file
        .symbols()
        .find(|s| s.name() == Ok("main"))
        .map(|s| s.size())
        .unwrap();
    let debug = DebugFile::parse(
        &std::fs::read(&built.debug).unwrap(),
        DebugInfoLimits::default(),
    )
    .unwrap();
    let inlined = (0..size)
        .map(|delta| debug.frames(offset + delta, mapping_offset))
        .find(|frames| frames.len() == 2)
        .expect("an address of main inside the inlined helper");
    assert_eq!(inlined[0].function, "inlined_helper");
    assert_eq!(inlined[1].function, "main");
    assert!(
        inlined
            .iter()
            .all(|f| f.file.ends_with("hot.c") && f.line > 0)
    );
}

#[test]
fn compressed_debug_sections_are_inflated() {
    let Some(built) = build() else { return };
    let full = std::fs::read(&built.full).unwrap();
    let (_, offset, mapping_offset) = where_is(&full, "hot_static_work");
    let mut formats = vec!["zlib"];
    // zstd only where this objcopy was built with it.
    let probe = built.debug.with_extension("probe");
    if run(
        "objcopy",
        &[
            "--compress-debug-sections=zstd",
            built.debug.to_str().unwrap(),
            probe.to_str().unwrap(),
        ],
    ) {
        formats.push("zstd");
    }
    for format in formats {
        let out = built.debug.with_extension(format!("{format}.out"));
        assert!(run(
            "objcopy",
            &[
                &format!("--compress-debug-sections={format}"),
                built.debug.to_str().unwrap(),
                out.to_str().unwrap(),
            ]
        ));
        let bytes = std::fs::read(&out).unwrap();
        let debug = DebugFile::parse(&bytes, DebugInfoLimits::default()).unwrap();
        let frames = debug.frames(offset + 4, mapping_offset);
        assert_eq!(
            frames[0].function, "hot_static_work",
            "{format}: {frames:?}"
        );
        let tight = DebugInfoLimits {
            max_section_bytes: 64,
            ..DebugInfoLimits::default()
        };
        assert!(matches!(
            DebugFile::parse(&bytes, tight),
            Err(DebugInfoError::SectionBudget { .. })
        ));
    }
}

#[test]
fn files_past_their_limits_are_refused_before_any_lookup() {
    let Some(built) = build() else { return };
    let full = std::fs::read(&built.full).unwrap();
    let limits = DebugInfoLimits::default();
    let refused = |limits: DebugInfoLimits| DebugFile::parse(&full, limits).unwrap_err();
    assert!(matches!(
        refused(DebugInfoLimits {
            max_file_bytes: 100,
            ..limits
        }),
        DebugInfoError::TooLarge { .. }
    ));
    assert!(matches!(
        refused(DebugInfoLimits {
            max_dwarf_depth: 1,
            ..limits
        }),
        DebugInfoError::DwarfLimit {
            what: "nesting",
            ..
        }
    ));
    assert!(matches!(
        refused(DebugInfoLimits {
            max_dwarf_entries: 3,
            ..limits
        }),
        DebugInfoError::DwarfLimit {
            what: "entries",
            ..
        }
    ));
    assert!(matches!(
        refused(DebugInfoLimits {
            max_symbols: 1,
            ..limits
        }),
        DebugInfoError::TooManySymbols { .. }
    ));
    assert!(matches!(
        DebugFile::parse(b"\x7fELF not really", limits),
        Err(DebugInfoError::NotElf { .. })
    ));
    // Every prefix of a real file is refused or read, never a panic.
    for len in (0..full.len()).step_by(97) {
        if let Ok(file) = DebugFile::parse(&full[..len], limits) {
            let _ = file.frames(0x1149, 0x1000);
        }
    }
}
