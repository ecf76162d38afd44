//! Go's function table read from real Go binaries, built at test time with
//! this machine's Go: the same program unstripped and stripped
//! (`-ldflags='-s -w'`). Needs no root; without Go it skips visibly (and
//! fails in CI).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_agent::elf_symbols::{read_symbol_index, read_symbol_name};
use kiln_agent::go_pclntab::{GoFrameRule, GoFunction, GoFunctionIndex, Pclntab, WindowedSection};
use kiln_agent::unwind_info::{UnwindInfoLimits, read_from_file};
use object::{Object, ObjectSection, ObjectSymbol};

const PROGRAM: &str = r#"package main

import "os"

//go:noinline
func kilnGoHot(seed uint64) uint64 {
	x := seed
	for i := 0; i < 2000000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

//go:noinline
func kilnGoCaller(seed uint64) uint64 {
	var buffer [64]byte
	buffer[seed%64] = byte(seed)
	return kilnGoHot(seed) ^ uint64(buffer[3])
}

func main() {
	var sink uint64
	for i := 0; i < 3; i++ {
		sink = kilnGoCaller(sink)
	}
	if sink == 42 {
		os.Exit(1)
	}
}
"#;

/// Builds [`PROGRAM`] into `dir/name` with `ldflags`; `None` without Go.
fn build(dir: &Path, name: &str, ldflags: &str) -> Option<PathBuf> {
    let go = kiln_testkit::tools::go()?;
    let source = dir.join("main.go");
    std::fs::write(&source, PROGRAM).expect("source");
    let binary = dir.join(name);
    let output = Command::new(go)
        .args(["build", &format!("-ldflags={ldflags}"), "-o"])
        .arg(&binary)
        .arg(&source)
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        .env("GO111MODULE", "off")
        .env("HOME", dir)
        .output()
        .expect("go runs");
    assert!(
        output.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(binary)
}

/// (address, size) of a function in the binary's `.symtab`, where an
/// assembly function's name carries its ABI (`runtime.goexit.abi0`).
fn symtab_function(binary: &Path, name: &str) -> (u64, u64) {
    let bytes = std::fs::read(binary).expect("built");
    let elf = object::File::parse(bytes.as_slice()).expect("ELF");
    let assembly = format!("{name}.abi0");
    let symbol = elf
        .symbols()
        .find(|s| s.name() == Ok(name) || s.name() == Ok(assembly.as_str()))
        .unwrap_or_else(|| panic!("{name} in .symtab"));
    (symbol.address(), symbol.size())
}

fn pclntab_of(binary: &Path) -> (Vec<u8>, u64, u64) {
    let bytes = std::fs::read(binary).expect("built");
    let elf = object::File::parse(bytes.as_slice()).expect("ELF");
    let section = elf.section_by_name(".gopclntab").expect(".gopclntab");
    let text = elf.section_by_name(".text").expect(".text").address();
    let base = elf
        .segments()
        .map(|s| object::ObjectSegment::address(&s))
        .min()
        .unwrap_or(0);
    (section.data().expect("data").to_vec(), text, base)
}

fn all_functions(pclntab: &Pclntab, mut section: &[u8]) -> Vec<GoFunction> {
    let mut all = Vec::new();
    pclntab.each_function(&mut section, |_, function| all.push(function));
    all
}

#[test]
fn go_function_table_matches_the_symbol_table_and_names_a_stripped_binary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(full) = build(dir.path(), "full", "") else {
        return;
    };
    let stripped = build(dir.path(), "stripped", "-s -w").expect("Go ran once already");

    // Every function the table lists lies where .symtab says, and sizes
    // agree up to the alignment padding between functions.
    let (section, text, _) = pclntab_of(&full);
    let pclntab = Pclntab::parse(&mut section.as_slice(), text).expect("a layout read here");
    assert!(
        pclntab.function_count() > 500,
        "the runtime's functions too"
    );
    let names = pclntab.names();
    let name_of = |offset: u32| {
        let at = names.start + offset as usize;
        let end = section[at..].iter().position(|&b| b == 0).expect("NUL");
        String::from_utf8(section[at..at + end].to_vec()).expect("UTF-8")
    };
    for wanted in ["main.kilnGoHot", "main.kilnGoCaller", "runtime.goexit"] {
        let function = all_functions(&pclntab, &section)
            .into_iter()
            .find(|f| name_of(f.name) == wanted)
            .unwrap_or_else(|| panic!("{wanted} in .gopclntab"));
        let (address, size) = symtab_function(&full, wanted);
        assert_eq!(function.entry, address, "{wanted}'s entry");
        assert!(
            function.end - function.entry >= size && function.end - function.entry < size + 32,
            "{wanted}: {} bytes in the table, {size} in .symtab",
            function.end - function.entry
        );
        assert_eq!(function.top_frame, wanted == "runtime.goexit");
    }

    // The stripped binary: no .symtab, and the symbol index names its
    // functions from the table at the addresses the unstripped one has.
    let bytes = std::fs::read(&stripped).expect("built");
    let elf = object::File::parse(bytes.as_slice()).expect("ELF");
    assert!(elf.section_by_name(".symtab").is_none());
    assert!(elf.section_by_name(".debug_frame").is_none());
    let file = File::open(&stripped).expect("open");
    let index = read_symbol_index(&file, 64 << 20).expect("indexed");
    let (hot, hot_size) = symtab_function(&full, "main.kilnGoHot");
    let (stripped_section, stripped_text, _) = pclntab_of(&stripped);
    let stripped_table =
        Pclntab::parse(&mut stripped_section.as_slice(), stripped_text).expect("parsed");
    assert_eq!(
        all_functions(&stripped_table, &stripped_section)
            .into_iter()
            .find(|f| f.entry == hot)
            .map(|f| f.name),
        all_functions(&pclntab, &section)
            .into_iter()
            .find(|f| f.entry == hot)
            .map(|f| f.name),
        "-s -w moves no function"
    );
    let segment = elf
        .segments()
        .find(|s| {
            let (start, size) = (
                object::ObjectSegment::address(s),
                object::ObjectSegment::size(s),
            );
            (start..start + size).contains(&hot)
        })
        .expect("a segment holds the text");
    let (segment_offset, _) = object::ObjectSegment::file_range(&segment);
    let file_offset = hot - object::ObjectSegment::address(&segment) + segment_offset;
    for inside in [0, hot_size / 2, hot_size - 1] {
        let found = index.find(file_offset + inside).expect("found");
        assert_eq!(
            read_symbol_name(&file, &found).as_deref(),
            Some("main.kilnGoHot")
        );
    }
}

#[test]
fn go_stack_pointer_rules_find_the_callers_of_framed_and_frameless_functions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(stripped) = build(dir.path(), "stripped", "-s -w") else {
        return;
    };
    let full = build(dir.path(), "full", "").expect("Go ran once already");
    let (section, text, base) = pclntab_of(&stripped);
    let pclntab = Pclntab::parse(&mut section.as_slice(), text).expect("parsed");
    let index = GoFunctionIndex::build(&pclntab, &mut section.as_slice(), base).expect("index");
    // Each function's rules read from the file, a few small windows each.
    let file = File::open(&stripped).expect("open");
    let (offset, _) = {
        let bytes = std::fs::read(&stripped).expect("built");
        let elf = object::File::parse(bytes.as_slice()).expect("ELF");
        let section = elf.section_by_name(".gopclntab").expect(".gopclntab");
        section.file_range().expect("in the file")
    };
    let mut windows = WindowedSection::with_window(
        |at, buffer: &mut [u8]| {
            std::os::unix::fs::FileExt::read_exact_at(&file, buffer, at).is_ok()
        },
        offset,
        section.len(),
        512,
    );
    let mut rule = |pc: u64| {
        let at = index.function_at(pc)?;
        let from_file = index.rules(&mut windows, &at);
        assert_eq!(
            from_file,
            index.rules(&mut section.as_slice(), &at),
            "read from the file as from memory"
        );
        from_file.rule_at(pc - at.entry)
    };

    // The leaf allocates no frame: its return address is at its stack
    // pointer at every pc.
    let (hot, hot_size) = symtab_function(&full, "main.kilnGoHot");
    for pc in hot..hot + hot_size {
        assert_eq!(
            rule(pc),
            Some(GoFrameRule::StackPointerBelowEntry(0)),
            "main.kilnGoHot+{:#x}",
            pc - hot
        );
    }
    // The caller has a frame (its buffer): 0 at entry, more in its body.
    let (caller, caller_size) = symtab_function(&full, "main.kilnGoCaller");
    assert_eq!(rule(caller), Some(GoFrameRule::StackPointerBelowEntry(0)));
    let deepest = (caller..caller + caller_size)
        .filter_map(|pc| match rule(pc) {
            Some(GoFrameRule::StackPointerBelowEntry(below)) => Some(below),
            _ => None,
        })
        .max();
    assert!(
        deepest.is_some_and(|below| below >= 64 + 8),
        "main.kilnGoCaller's frame holds its buffer and saved frame pointer: {deepest:?}"
    );
    let (goexit, _) = symtab_function(&full, "runtime.goexit");
    assert_eq!(rule(goexit + 1), Some(GoFrameRule::Root));
    eprintln!(
        "{} windows of 512 bytes read for the rules of {} pcs",
        windows.reads(),
        hot_size + caller_size + 1
    );

    // What the unwinder reads from the file is the same index, for a
    // binary without CFI.
    let sections = read_from_file(
        &File::open(&stripped).expect("open"),
        &UnwindInfoLimits::default(),
    )
    .expect("a Go table stands in for CFI");
    assert!(!sections.has_cfi());
    assert_eq!(
        sections.go_functions.as_ref().map(|(index, _)| index),
        Some(&index)
    );
    assert_eq!(index.held_bytes(), 8 * pclntab.function_count() as u64);
    eprintln!(
        "{} functions: {} bytes of .gopclntab, {} bytes of index",
        pclntab.function_count(),
        section.len(),
        index.held_bytes()
    );
}
