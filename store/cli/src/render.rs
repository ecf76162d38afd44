//! Turning the store's answers into terminal tables, folded stacks and
//! SVG flame graphs. Pure: strings in, strings out.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use kiln_contract::query_json::{DiffFlameGraph, TopResponse};

/// Formats `value` in a pprof sample unit (`nanoseconds`, `bytes`, ...).
pub fn format_value(value: i64, unit: &str) -> String {
    let v = value as f64;
    let (scaled, suffix) = match unit {
        "nanoseconds" => scale(
            v,
            &[
                (3.6e12, "h"),
                (6e10, "min"),
                (1e9, "s"),
                (1e6, "ms"),
                (1e3, "µs"),
            ],
            "ns",
        ),
        "bytes" => scale(
            v,
            &[
                (1024f64.powi(4), "TiB"),
                (1024f64.powi(3), "GiB"),
                (1024f64.powi(2), "MiB"),
                (1024.0, "KiB"),
            ],
            "B",
        ),
        _ => scale(v, &[(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")], ""),
    };
    let unscaled = matches!(suffix, "" | "ns" | "B") && scaled == v;
    if unscaled {
        return if suffix.is_empty() {
            value.to_string()
        } else {
            format!("{value} {suffix}")
        };
    }
    let digits = if scaled.abs() >= 100.0 {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else {
        2
    };
    let number = format!("{scaled:.digits$}");
    let number = if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        &number
    };
    format!("{number} {suffix}")
}

fn scale(v: f64, steps: &[(f64, &'static str)], base: &'static str) -> (f64, &'static str) {
    for &(size, suffix) in steps {
        // 999.96 ms shows as 1 s, not 1000 ms.
        if v.abs() >= size * 0.9995 {
            return (v / size, suffix);
        }
    }
    (v, base)
}

fn percent(part: i64, whole: i64) -> String {
    if whole == 0 {
        return "-".to_owned();
    }
    format!("{:.2}%", 100.0 * part as f64 / whole as f64)
}

/// The top table as aligned text, `limit` rows. A `source` column
/// (`file:line`) follows the function where the store knows any row's
/// source; the function column is padded only then.
pub fn top_table(top: &TopResponse, limit: usize) -> String {
    let rows: Vec<[String; 6]> = top
        .top
        .iter()
        .take(limit)
        .map(|e| {
            [
                format_value(e.flat, &top.unit),
                percent(e.flat, top.total),
                format_value(e.cumulative, &top.unit),
                percent(e.cumulative, top.total),
                e.name.clone(),
                e.source
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let with_sources = rows.iter().any(|row| !row[5].is_empty());
    let header = ["flat", "flat%", "cum", "cum%", "function", "source"];
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}  total {}  (top {} functions)",
        top.profile_type,
        format_value(top.total, &top.unit),
        rows.len()
    );
    let line = |out: &mut String, cells: [&str; 6]| {
        let _ = write!(
            out,
            "{:>w0$}  {:>w1$}  {:>w2$}  {:>w3$}  ",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
        );
        let _ = if with_sources && !cells[5].is_empty() {
            writeln!(out, "{:<w4$}  {}", cells[4], cells[5], w4 = widths[4])
        } else {
            writeln!(out, "{}", cells[4])
        };
    };
    line(&mut out, header);
    for row in &rows {
        line(
            &mut out,
            [&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]],
        );
    }
    out
}

/// Differential folded stacks (`stack base compare`) in inferno's (and
/// Brendan Gregg's) differential format, from the two sides' untrimmed
/// folded exports (`/api/v1/folded`): the graph takes its shape from the
/// compared selection and its colour from the change. Base values are
/// scaled to the compared total, so colour shows a change in share rather
/// than in sheer volume when the two ranges differ in length.
pub fn diff_folded_lines(base: &str, compare: &str) -> Result<Vec<String>, String> {
    let mut stacks: BTreeMap<&str, [i64; 2]> = BTreeMap::new();
    let mut totals = [0i64; 2];
    for (side, text) in [base, compare].into_iter().enumerate() {
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (stack, value) = line
                .rsplit_once(' ')
                .and_then(|(stack, value)| Some((stack, value.parse::<i64>().ok()?)))
                .ok_or_else(|| format!("the store sent a folded line without a count: {line:?}"))?;
            let slot = &mut stacks.entry(stack).or_insert([0, 0])[side];
            *slot = slot.saturating_add(value);
            totals[side] = totals[side].saturating_add(value);
        }
    }
    let scale = if totals[0] > 0 && totals[1] > 0 {
        totals[1] as f64 / totals[0] as f64
    } else {
        1.0
    };
    Ok(stacks
        .into_iter()
        .map(|(stack, [b, c])| format!("{stack} {} {c}", (b as f64 * scale).round() as i64))
        .collect())
}

/// Renders folded lines (`a;b;c value`, as `/api/v1/folded` answers) as an
/// SVG flame graph with inferno.
pub fn flamegraph_svg(lines: &[&str], title: &str, unit: &str) -> Result<Vec<u8>, String> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    options.count_name = if unit.is_empty() {
        "samples".to_owned()
    } else {
        unit.to_owned()
    };
    options.no_javascript = false;
    let mut svg = Vec::new();
    if lines.is_empty() {
        // inferno refuses empty input; an empty selection still gets a file.
        let text = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"60\"><text x=\"10\" y=\"30\">{}: no samples</text></svg>",
            title.replace('&', "&amp;").replace('<', "&lt;")
        );
        return Ok(text.into_bytes());
    }
    inferno::flamegraph::from_lines(&mut options, lines.iter().copied(), &mut svg)
        .map_err(|e| e.to_string())?;
    Ok(svg)
}

/// One row of the diff table: a function's self share in each selection.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffRow {
    /// Function name.
    pub name: String,
    /// Share of the base total, 0..1.
    pub base_share: f64,
    /// Share of the compared total, 0..1.
    pub compare_share: f64,
}

/// Per-function self shares of both sides, largest change first.
pub fn diff_rows(graph: &DiffFlameGraph) -> Vec<DiffRow> {
    let base_total = graph.root().base_total;
    let compare_total = graph.root().compare_total;
    let mut sums: std::collections::HashMap<&str, (i64, i64)> = std::collections::HashMap::new();
    // Every node but the root, in the tree's flat order.
    for node in graph.nodes.iter().skip(1) {
        let name = graph
            .names
            .get(node.name as usize)
            .map_or("?", String::as_str);
        let entry = sums.entry(name).or_insert((0, 0));
        entry.0 = entry.0.saturating_add(node.base_self);
        entry.1 = entry.1.saturating_add(node.compare_self);
    }
    let share = |v: i64, total: i64| {
        if total == 0 {
            0.0
        } else {
            v as f64 / total as f64
        }
    };
    let mut rows: Vec<DiffRow> = sums
        .into_iter()
        .filter(|(_, (b, c))| *b != 0 || *c != 0)
        .map(|(name, (b, c))| DiffRow {
            name: name.to_owned(),
            base_share: share(b, base_total),
            compare_share: share(c, compare_total),
        })
        .collect();
    rows.sort_by(|a, b| {
        let da = (a.compare_share - a.base_share).abs();
        let db = (b.compare_share - b.base_share).abs();
        db.total_cmp(&da).then_with(|| a.name.cmp(&b.name))
    });
    rows
}

/// The diff table as aligned text.
pub fn diff_table(rows: &[DiffRow], limit: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>9}  {:>9}  {:>10}  function",
        "base%", "compare%", "change"
    );
    for row in rows.iter().take(limit) {
        let change = 100.0 * (row.compare_share - row.base_share);
        let _ = writeln!(
            out,
            "{:>8.2}%  {:>8.2}%  {:>+8.2}pp  {}",
            100.0 * row.base_share,
            100.0 * row.compare_share,
            change,
            row.name
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_contract::query_json::{FrameSource, TopEntry};

    #[test]
    fn svg_names_every_frame_and_counts_every_sample() {
        let svg =
            flamegraph_svg(&["main 1", "main;work:x 6", "main;idle 3"], "t", "").expect("renders");
        let text = String::from_utf8(svg).expect("utf-8");
        assert!(text.contains("work:x"));
        assert!(text.contains("idle"));
        assert!(text.contains("all (10 samples, 100%)"), "{text}");
    }

    #[test]
    fn empty_selections_still_render_an_svg() {
        let svg = flamegraph_svg(&[], "cpu{pod=\"<x>\"}", "").expect("renders");
        let text = String::from_utf8(svg).expect("utf-8");
        assert!(text.contains("no samples") && text.contains("&lt;x>"));
    }

    #[test]
    fn values_are_shown_in_their_units() {
        assert_eq!(format_value(1_500_000_000, "nanoseconds"), "1.5 s");
        assert_eq!(format_value(60_000_000, "nanoseconds"), "60 ms");
        assert_eq!(format_value(999_960_000, "nanoseconds"), "1 s");
        assert_eq!(format_value(3 * 1024 * 1024, "bytes"), "3 MiB");
        assert_eq!(format_value(42, "count"), "42");
        assert_eq!(format_value(12_345, "count"), "12.3 k");
    }

    #[test]
    fn top_table_aligns_columns_and_shows_percentages() {
        let top = TopResponse {
            group_by: Vec::new(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            unit: "nanoseconds".into(),
            total: 2_000_000_000,
            top: vec![
                TopEntry {
                    name: "main.work".into(),
                    flat: 1_000_000_000,
                    cumulative: 1_500_000_000,
                    source: None,
                },
                TopEntry {
                    name: "main.idle".into(),
                    flat: 10_000_000,
                    cumulative: 10_000_000,
                    source: None,
                },
            ],
        };
        let text = top_table(&top, 10);
        assert!(text.contains("50.00%"), "{text}");
        assert!(text.contains("75.00%"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[2].find("main.work"), lines[3].find("main.idle"));
        assert!(
            !text.contains("source"),
            "no column without sources: {text}"
        );
        assert!(lines[2].ends_with("main.work"), "{text}");
    }

    #[test]
    fn top_table_shows_file_and_line_where_known() {
        let row = |name: &str, source: Option<(&str, u32)>| TopEntry {
            name: name.into(),
            flat: 10,
            cumulative: 10,
            source: source.map(|(file, line)| FrameSource {
                file: file.into(),
                line,
            }),
        };
        let top = TopResponse {
            group_by: Vec::new(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            unit: "nanoseconds".into(),
            total: 30,
            top: vec![
                row("hot_static_work", Some(("/src/hot.c", 5))),
                row("libc.so.6+0x29d90", None),
                row("init", Some(("init.c", 0))),
            ],
        };
        let text = top_table(&top, 10);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].ends_with("function           source"), "{text}");
        assert!(
            lines[2].ends_with("hot_static_work    /src/hot.c:5"),
            "{text}"
        );
        assert!(lines[3].ends_with("libc.so.6+0x29d90"), "{text}");
        assert!(lines[4].ends_with("init               init.c"), "{text}");
    }

    #[test]
    fn diff_rows_put_the_largest_change_first() {
        use kiln_contract::query_json::DiffNode;
        let d = |name, bt, bs, ct, cs, children: std::ops::Range<u32>| DiffNode {
            name,
            base_total: bt,
            base_self: bs,
            compare_total: ct,
            compare_self: cs,
            first_child: children.start,
            child_count: children.end - children.start,
        };
        let graph = DiffFlameGraph {
            names: vec!["total".into(), "a".into(), "b".into()],
            nodes: vec![
                d(0, 10, 0, 10, 0, 1..3),
                d(1, 9, 9, 5, 5, 3..3),
                d(2, 1, 1, 5, 5, 3..3),
            ],
        };
        let rows = diff_rows(&graph);
        assert_eq!(rows.len(), 2);
        assert!((rows[0].compare_share - rows[0].base_share).abs() > 0.39);
    }

    #[test]
    fn diff_folded_lines_join_both_sides_untrimmed_and_scale_the_base() {
        assert_eq!(
            diff_folded_lines("m;a 9\nm;b 1\n", "m;a 5\nm;c 5\n").unwrap(),
            vec!["m;a 9 5", "m;b 1 0", "m;c 0 5"],
            "every stack of either side, the base scaled by 10/10"
        );
        assert_eq!(
            diff_folded_lines("a 9\nb 1\n", "a 10\nb 10\n").unwrap(),
            vec!["a 18 10", "b 2 10"]
        );
        assert!(diff_folded_lines("a;b\n", "").is_err());
    }
}
