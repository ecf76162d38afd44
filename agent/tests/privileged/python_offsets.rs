//! The CPython offsets table (`kiln_agent::python::offsets`) against each
//! version's own headers, and the line-table decoder against real
//! interpreters.
//!
//! This test compiles `tests/python/offsets_probe.c` against the internal
//! headers of each CPython version it can find (Debian's 3.11, and the 3.9
//! and 3.13 headers `./kiln-dev test` unpacks from Debian's archive; see
//! `interpreters.rs`) and compares what the compiler says with
//! the table. In CI a version Debian ships must be there; 3.10 and 3.12,
//! which Debian never shipped, are skipped with a message.

use std::path::Path;
use std::process::Command;

use kiln_agent::python::line_table::{LineTableFormat, line_of};
use kiln_agent::python::offsets::{SUPPORTED, for_minor};
use kiln_testkit::prerequisites::{in_ci, visible_skip};

use crate::interpreters::{HEADERS_FROM_DEBIAN, header_flags, required_interpreters};

/// Says what was skipped where libtest's capture cannot hide it; in CI a
/// skip of something `./kiln-dev test` provides fails the test.
fn skip(message: &str, required: bool) {
    assert!(!(required && in_ci()), "{message} (needed in CI)");
    visible_skip(message);
}

fn probe(flags: &[String], out_dir: &Path) -> Vec<(String, u64)> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/offsets_probe.c");
    let binary = out_dir.join("probe");
    let compiled = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("cc runs");
    assert!(
        compiled.status.success(),
        "the probe compiles with {flags:?}: {}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let output = Command::new(&binary).output().expect("the probe runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_offsets_table_matches_every_versions_headers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut checked = Vec::new();
    for version in &SUPPORTED {
        let Some(flags) = header_flags(version.minor) else {
            let in_debian = HEADERS_FROM_DEBIAN.contains(&version.minor);
            skip(
                &format!(
                    "no CPython 3.{} headers{}",
                    version.minor,
                    if in_debian {
                        " (./kiln-dev test unpacks them from Debian)"
                    } else {
                        "; Debian never shipped this version, so its offsets are not checked here"
                    }
                ),
                in_debian,
            );
            continue;
        };
        let from_headers = probe(&flags, dir.path());
        let from_table: Vec<(String, u64)> = version
            .probe_lines()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        assert_eq!(
            from_table, from_headers,
            "offsets of 3.{} ({flags:?})",
            version.minor,
        );
        checked.push(format!("3.{}", version.minor));
    }
    eprintln!("offsets checked against the headers of {checked:?}");
    assert!(!checked.is_empty(), "no CPython headers at all");
}

/// Dumps, for a few real functions, the line table and the line of every
/// code unit as the interpreter itself reports it (`co_lines` from 3.10,
/// `dis.findlinestarts` over `co_lnotab` in 3.9).
const DUMP: &str = r#"
def sample(n):
    total = 0
    for i in range(n):
        if i % 3:
            total += i
        else:
            total -= 1
    return [x * 2
            for x in range(total)]
class K:
    def method(self):
        try:
            return 1 / 0
        except ZeroDivisionError:
            return 2
import dis
for code in (sample.__code__, K.method.__code__):
    units = len(code.co_code) // 2
    lines = ["-"] * units
    if hasattr(code, "co_lines"):
        for start, end, line in code.co_lines():
            for unit in range(start // 2, end // 2):
                if unit < units:
                    lines[unit] = "-" if line is None else str(line)
        table = code.co_linetable
    else:
        # 3.9: a code unit is on the line of the last line start before it.
        starts = list(dis.findlinestarts(code))
        for unit in range(units):
            line = None
            for offset, start_line in starts:
                if offset <= unit * 2:
                    line = start_line
            lines[unit] = "-" if line is None else str(line)
        table = code.co_lnotab
    print(code.co_firstlineno, table.hex(), ",".join(lines))
"#;

fn interpreters() -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for path in required_interpreters() {
        if path.is_file() {
            found.push(path);
        } else {
            skip(&format!("{} is not installed", path.display()), true);
        }
    }
    found
}

#[test]
fn line_tables_decode_as_the_interpreters_report_them() {
    for python in interpreters() {
        let output = Command::new(&python)
            .arg("-c")
            .arg(DUMP)
            .output()
            .expect("python runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let version = Command::new(&python)
            .args(["-c", "import sys; print(sys.version_info[1])"])
            .output()
            .expect("python runs");
        let minor: u8 = String::from_utf8_lossy(&version.stdout)
            .trim()
            .parse()
            .expect("a minor version");
        assert!(for_minor(minor).is_some(), "3.{minor} is supported");
        let format = LineTableFormat::for_minor(minor);
        let mut units_checked = 0;
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let mut parts = line.split(' ');
            let first: i32 = parts
                .next()
                .and_then(|p| p.parse().ok())
                .expect("first line");
            let table = parts.next().expect("table");
            let table: Vec<u8> = (0..table.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&table[i..i + 2], 16).expect("hex"))
                .collect();
            let expected = parts.next().expect("lines");
            for (unit, want) in expected.split(',').enumerate() {
                let got = line_of(format, first, &table, unit as u32);
                let want = want.parse::<u32>().ok();
                assert_eq!(
                    got, want,
                    "3.{minor}: code unit {unit} of a function at line {first}"
                );
                units_checked += 1;
            }
        }
        eprintln!(
            "3.{minor} ({}): {units_checked} code units decoded as the interpreter says",
            python.display()
        );
        assert!(units_checked > 40, "too few code units checked");
    }
}
