//! The CPython offsets table (`kiln_agent::python::offsets`) against each
//! version's own headers, and the line-table decoder against real
//! interpreters.
//!
//! `./kiln-dev test` fetches and configures the CPython 3.9-3.13 sources
//! under `$KILN_TOOLS_DIR/cpython/src-<version>`; this test compiles
//! `tests/python/offsets_probe.c` against each and compares what the
//! compiler says with the table. In CI a missing tree fails the test;
//! elsewhere the test says which version it skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_agent::python::line_table::{LineTableFormat, line_of};
use kiln_agent::python::offsets::{SUPPORTED, for_minor};

fn tools_dir() -> PathBuf {
    std::env::var_os("KILN_TOOLS_DIR")
        .unwrap_or_else(|| "/var/tmp/kiln-tools".into())
        .into()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn skip(message: &str) {
    use std::io::Write;
    assert!(!in_ci(), "{message} (needed in CI)");
    let _ = writeln!(std::io::stderr(), "skipping: {message}");
}

/// The configured source tree of CPython 3.`minor`, newest patch first.
fn source_tree(minor: u8) -> Option<PathBuf> {
    let root = tools_dir().join("cpython");
    let prefix = format!("src-3.{minor}.");
    let mut trees: Vec<PathBuf> = std::fs::read_dir(&root)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .filter(|p| p.join("pyconfig.h").is_file())
        .collect();
    trees.sort();
    trees.pop()
}

fn probe(tree: &Path, out_dir: &Path) -> Vec<(String, u64)> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/offsets_probe.c");
    let binary = out_dir.join("probe");
    let compiled = Command::new("cc")
        .arg(format!("-I{}", tree.join("Include").display()))
        .arg(format!("-I{}", tree.join("Include/internal").display()))
        .arg(format!("-I{}", tree.display()))
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("cc runs");
    assert!(
        compiled.status.success(),
        "the probe compiles against {}: {}",
        tree.display(),
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
        let Some(tree) = source_tree(version.minor) else {
            skip(&format!(
                "no configured CPython 3.{} source tree under {}",
                version.minor,
                tools_dir().display()
            ));
            continue;
        };
        let from_headers = probe(&tree, dir.path());
        let from_table: Vec<(String, u64)> = version
            .probe_lines()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        assert_eq!(
            from_table,
            from_headers,
            "offsets of 3.{} ({})",
            version.minor,
            tree.display()
        );
        checked.push(tree.display().to_string());
    }
    eprintln!("offsets checked against {checked:?}");
}

/// Dumps, for a few real functions, the line table and the line of every
/// code unit as the interpreter itself reports it (`co_lines`, 3.10+).
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
for code in (sample.__code__, K.method.__code__):
    units = len(code.co_code) // 2
    lines = ["-"] * units
    for start, end, line in code.co_lines():
        for unit in range(start // 2, end // 2):
            if unit < units:
                lines[unit] = "-" if line is None else str(line)
    print(code.co_firstlineno, code.co_linetable.hex(), ",".join(lines))
"#;

fn interpreters() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for path in [
        PathBuf::from("/usr/bin/python3"),
        tools_dir().join("cpython/3.13.15/bin/python3.13"),
    ] {
        if path.is_file() {
            found.push(path);
        } else {
            skip(&format!("{} is not installed", path.display()));
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
        assert!(units_checked > 50);
    }
}
