//! `kiln query --group-by pod` exports are lossless: a live `kiln-store` is
//! seeded with the real CPU profiles of three processes (built and run at
//! test time, see `ui/tests/programs/workload`), and the grouped `.folded`,
//! `.svg` and `.pb.gz` exports must carry exactly each pod's own untrimmed
//! totals, with `go tool pprof -raw` reading the same from the pprof. The
//! JSON tree is trimmed to a few nodes on purpose: the exports must not be.
//! `kiln diff -o x.folded` is checked the same way against both pods.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use kiln_contract::query_json::FlameGraphResponse;
use kiln_testkit::binaries::built_binary;
use kiln_testkit::clock::now_s;
use kiln_testkit::go_programs::workload_cpu_profiles;
use kiln_testkit::store_process::StoreProcess;

const CPU: &str = "process_cpu:cpu";

fn kiln(store: &StoreProcess, args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--store")
        .arg(store.url())
        .args(["query", "--from", "now-15m", "--to", "now"])
        .args(args)
        .env_remove("KILN_OUTPUT")
        .env_remove("KILN_FORMAT")
        .env_remove("KILN_GROUP_BY")
        .output()
        .expect("kiln runs");
    assert!(
        output.status.success(),
        "kiln {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Folded lines as `(frames root first, value)`.
fn folded(text: &str) -> Vec<(Vec<String>, i64)> {
    text.lines()
        .map(|line| {
            let (stack, value) = line.rsplit_once(' ').expect("`stack value` lines");
            let frames = stack.split(';').map(str::to_owned).collect();
            (frames, value.parse().expect("integer values"))
        })
        .collect()
}

fn sorted(mut lines: Vec<(Vec<String>, i64)>) -> Vec<(Vec<String>, i64)> {
    lines.sort();
    lines
}

/// Sums folded values by their first (root) frame.
fn by_root(lines: &[(Vec<String>, i64)]) -> BTreeMap<String, i64> {
    let mut sums = BTreeMap::new();
    for (frames, value) in lines {
        *sums.entry(frames[0].clone()).or_insert(0) += value;
    }
    sums
}

/// `go tool pprof -raw`: sample values summed by the root frame's function.
fn pprof_raw_by_root(path: &Path, home: &Path) -> BTreeMap<String, i64> {
    let output = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(path)
        .env("HOME", home)
        .output()
        .expect("go tool pprof runs");
    assert!(
        output.status.success(),
        "go tool pprof -raw failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut samples: Vec<(i64, String)> = Vec::new();
    let mut location_names: BTreeMap<String, String> = BTreeMap::new();
    let mut section = "";
    for line in text.lines() {
        if matches!(line, "Samples:" | "Locations" | "Mappings") {
            section = line.trim_end_matches(':');
            continue;
        }
        let trimmed = line.trim();
        let Some((head, rest)) = trimmed.split_once(": ") else {
            continue;
        };
        match section {
            "Samples" => {
                if let Ok(value) = head.parse::<i64>() {
                    let root = rest.split_whitespace().last().unwrap_or("").to_owned();
                    samples.push((value, root));
                }
            }
            "Locations" => {
                // `id: 0xaddr [M=n] function file:line s=n`
                let function = rest
                    .split_whitespace()
                    .skip(1)
                    .find(|field| !field.starts_with("M="));
                if head.parse::<u64>().is_ok()
                    && let Some(function) = function
                {
                    location_names.insert(head.to_owned(), function.to_owned());
                }
            }
            _ => {}
        }
    }
    let mut sums = BTreeMap::new();
    for (value, root) in samples {
        let name = location_names
            .get(&root)
            .unwrap_or_else(|| panic!("location {root} is not listed:\n{text}"));
        *sums.entry(name.clone()).or_insert(0) += value;
    }
    sums
}

/// The counts inferno writes into each frame's title, e.g.
/// `<title>pod=search-1 (1,230,000,000 nanoseconds, 40.00%)</title>`.
fn svg_frame_count(svg: &str, frame: &str) -> Option<i64> {
    let start = svg.find(&format!("<title>{frame} ("))? + frame.len() + 9;
    let digits: String = svg[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[test]
fn group_by_pod_exports_carry_each_pods_untrimmed_totals() {
    let Some(binary) = built_binary("kiln-store", "KILN_STORE_BIN") else {
        return;
    };
    let work = tempfile::tempdir().expect("temporary directory");
    let Some(profiles) = workload_cpu_profiles(work.path()) else {
        return;
    };
    let store = StoreProcess::start(&binary, &[]);
    let now = now_s();
    for (service, path) in &profiles {
        let body = std::fs::read(path).expect("profile written");
        let response = ureq::post(format!("{}/ingest", store.url()))
            .query("format", "pprof")
            .query(
                "name",
                format!("process_cpu{{pod={service}-1,namespace=shop}}"),
            )
            .query("from", (now - 120).to_string())
            .query("until", (now - 110).to_string())
            .send(&body[..])
            .expect("ingest succeeds");
        assert_eq!(response.status().as_u16(), 200);
    }

    // Each pod's own untrimmed stacks and total, one query per pod.
    let mut expected = BTreeMap::new();
    let mut expected_stacks = BTreeMap::new();
    for (service, _) in &profiles {
        let path = work.path().join(format!("{service}.folded"));
        let selector = format!("{CPU}{{pod=\"{service}-1\"}}");
        kiln(
            &store,
            &["--output", path.to_str().expect("utf-8"), &selector],
        );
        let lines = folded(&std::fs::read_to_string(&path).expect("folded written"));
        assert!(!lines.is_empty(), "{service} has samples");
        let total: i64 = lines.iter().map(|(_, v)| v).sum();
        expected.insert(format!("pod={service}-1"), total);
        expected_stacks.insert(format!("pod={service}-1"), sorted(lines));
    }
    let grand_total: i64 = expected.values().sum();

    let out = |name: &str| work.path().join(name).to_str().expect("utf-8").to_owned();
    let (folded_path, svg_path, pprof_path, json_path) = (
        out("grouped.folded"),
        out("grouped.svg"),
        out("grouped.pb.gz"),
        out("grouped.json"),
    );
    for path in [&folded_path, &svg_path, &pprof_path] {
        kiln(&store, &["--group-by", "pod", "--output", path, CPU]);
    }
    // The JSON tree is trimmed hard; the files above must not be.
    kiln(
        &store,
        &[
            "--group-by",
            "pod",
            "--max-nodes",
            "8",
            "--output",
            &json_path,
            CPU,
        ],
    );

    let grouped = folded(&std::fs::read_to_string(&folded_path).expect("folded written"));
    assert_eq!(by_root(&grouped), expected, "folded: one root per pod");
    // Under its pod root, every stack is the one the pod's own query
    // returns: grouping adds a root and drops or merges nothing. (Depth
    // alone says nothing: a Go profile taken on a busy machine holds the
    // one-frame stack `runtime/pprof.lostProfileEvent` for dropped samples.)
    let mut under_pods: BTreeMap<String, Vec<(Vec<String>, i64)>> = BTreeMap::new();
    for (frames, value) in &grouped {
        under_pods
            .entry(frames[0].clone())
            .or_default()
            .push((frames[1..].to_vec(), *value));
    }
    let under_pods: BTreeMap<_, _> = under_pods
        .into_iter()
        .map(|(root, lines)| (root, sorted(lines)))
        .collect();
    assert_eq!(
        under_pods, expected_stacks,
        "every stack keeps its frames under the pod"
    );

    let svg = std::fs::read_to_string(&svg_path).expect("SVG written");
    for (root, total) in &expected {
        assert_eq!(
            svg_frame_count(&svg, root),
            Some(*total),
            "the SVG's {root} frame carries the pod's total"
        );
    }
    assert_eq!(svg_frame_count(&svg, "all"), Some(grand_total));

    let raw = pprof_raw_by_root(Path::new(&pprof_path), work.path());
    assert_eq!(raw, expected, "go tool pprof -raw reads the same groups");

    let json: FlameGraphResponse =
        serde_json::from_slice(&std::fs::read(&json_path).expect("JSON written"))
            .expect("the JSON answer fits kiln-contract");
    assert_eq!(json.total, grand_total);
    assert_eq!(json.group_by, ["pod"]);
    assert!(
        json.flamegraph.node_count() <= 8,
        "the JSON tree is the trimmed one"
    );

    let diff_path = out("diff.folded");
    let diff = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("--store")
        .arg(store.url())
        .args([
            "diff",
            "--from",
            "now-15m",
            "--to",
            "now",
            "--max-nodes",
            "8",
        ])
        .args(["--output", &diff_path])
        .arg(format!("{CPU}{{pod=\"checkout-1\"}}"))
        .arg(format!("{CPU}{{pod=\"search-1\"}}"))
        .env_remove("KILN_OUTPUT")
        .output()
        .expect("kiln runs");
    assert!(
        diff.status.success(),
        "kiln diff failed: {}",
        String::from_utf8_lossy(&diff.stderr)
    );
    let diff_text = std::fs::read_to_string(&diff_path).expect("diff written");
    let (mut base_sum, mut compare_sum) = (0i64, 0i64);
    for line in diff_text.lines() {
        let mut fields = line.rsplitn(3, ' ');
        let compare: i64 = fields
            .next()
            .and_then(|v| v.parse().ok())
            .expect("compare count");
        let base: i64 = fields
            .next()
            .and_then(|v| v.parse().ok())
            .expect("base count");
        assert!(!line.contains("(other)"), "untrimmed: {line}");
        base_sum += base;
        compare_sum += compare;
    }
    assert_eq!(
        compare_sum, expected["pod=search-1"],
        "the compared side is whole"
    );
    // The base is scaled to the compared total, each line rounded.
    let lines = diff_text.lines().count() as i64;
    assert!(
        (base_sum - expected["pod=search-1"]).abs() <= lines,
        "the scaled base adds up to the compared total: {base_sum}"
    );
}
