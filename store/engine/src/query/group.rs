//! Grouping a merge by labels: every stack gets one synthetic root frame per
//! grouped label, named `label=value` (the idea of `pprof -tagroot`), so the
//! flame graph, top table, pprof and folded exports of a grouped merge all
//! show one subtree per group without any of them knowing about groups.
//!
//! A grouped label may be a series label (the caller merges each series
//! group apart and passes its value) or a per-sample label (looked up in each
//! stack's sample label set here); a series value of `""` means "not a series
//! label here", so the sample labels are consulted before the group is
//! called missing.

use hashbrown::HashMap;

use super::merged::MergedProfile;
use crate::symbols::{Function, Line, NO_MAPPING, ROOT_NODE, SymbolTable, SymbolTranslator};

impl MergedProfile {
    /// Adds `src` into this merge under one root frame per label of
    /// `group_by`, outermost first. `series_values[i]` is the value of
    /// `group_by[i]` shared by every series `src` was merged from, or `""`
    /// to take it from each sample's labels.
    pub fn add_grouped(
        &mut self,
        src: &MergedProfile,
        group_by: &[String],
        series_values: &[&str],
    ) {
        let mut translator = SymbolTranslator::new(&src.symbols);
        // The group prefix depends only on the sample label set.
        let mut prefix_of_labels: HashMap<u32, u32> = HashMap::new();
        let mut locations = Vec::new();
        for (&(stack, labels), &value) in &src.values {
            let prefix = match prefix_of_labels.get(&labels) {
                Some(&node) => node,
                None => {
                    let node = intern_group_prefix(
                        &mut self.symbols,
                        &src.symbols,
                        labels,
                        group_by,
                        series_values,
                    );
                    prefix_of_labels.insert(labels, node);
                    node
                }
            };
            locations.clear();
            src.symbols.stack_locations(stack, &mut locations);
            let mut node = prefix;
            // `stack_locations` is leaf first; the tree grows from the root.
            for &location in locations.iter().rev() {
                let location = translator.location(&src.symbols, &mut self.symbols, location);
                node = self.symbols.intern_node(node, location);
            }
            let labels = translator.label_set(&src.symbols, &mut self.symbols, labels);
            let sum = self.values.entry((node, labels)).or_insert(0);
            *sum = sum.wrapping_add(value);
            self.total = self.total.wrapping_add(value);
        }
    }
}

/// Interns the chain of `label=value` frames for one sample label set of
/// `src` and returns its last node.
fn intern_group_prefix(
    dst: &mut SymbolTable,
    src: &SymbolTable,
    labels: u32,
    group_by: &[String],
    series_values: &[&str],
) -> u32 {
    let mut node = ROOT_NODE;
    for (index, label) in group_by.iter().enumerate() {
        let series_value = series_values.get(index).copied().unwrap_or("");
        let value = if series_value.is_empty() {
            sample_label_value(src, labels, label)
        } else {
            series_value
        };
        let name = dst.intern_string(&kiln_contract::query_json::group_frame_name(label, value));
        let function = dst.intern_function(Function {
            name,
            system_name: name,
            filename: 0,
            start_line: 0,
        });
        let location = dst.intern_location(NO_MAPPING, 0, &[Line { function, line: 0 }]);
        node = dst.intern_node(node, location);
    }
    node
}

/// The string value of sample label `name` in label set `labels`, or `""`.
fn sample_label_value<'a>(symbols: &'a SymbolTable, labels: u32, name: &str) -> &'a str {
    symbols
        .label_set(labels)
        .iter()
        .find(|label| label.str != 0 && symbols.string(label.key) == name)
        .map_or("", |label| symbols.string(label.str))
}

#[cfg(test)]
mod tests {
    use crate::model::ProfileType;
    use crate::symbols::SampleLabel;

    use super::MergedProfile;

    /// A merge of `main;work` (5) and `main;idle` (3), the first sample
    /// carrying a `thread=worker` sample label.
    fn sample_merge() -> MergedProfile {
        let mut merged = MergedProfile::new();
        let main = merged.test_frame("main");
        let work = merged.test_frame("work");
        let idle = merged.test_frame("idle");
        let work_stack = merged.symbols.intern_stack(&[main, work]);
        let idle_stack = merged.symbols.intern_stack(&[main, idle]);
        let key = merged.symbols.intern_string("thread");
        let value = merged.symbols.intern_string("worker");
        let labels = merged.symbols.intern_label_set(&[SampleLabel {
            key,
            str: value,
            num: 0,
            unit: 0,
        }]);
        merged.values.insert((work_stack, labels), 5);
        merged.values.insert((idle_stack, 0), 3);
        merged.total = 8;
        merged
    }

    #[test]
    fn series_groups_become_nested_root_frames_and_keep_every_value() {
        let mut grouped = MergedProfile::new();
        let group_by = ["namespace".to_owned(), "pod".to_owned()];
        grouped.add_grouped(&sample_merge(), &group_by, &["shop", "checkout-1"]);
        grouped.add_grouped(&sample_merge(), &group_by, &["shop", "cart-1"]);
        assert_eq!(grouped.total(), 16);
        let stacks = grouped.stacks();
        assert!(stacks.contains(&(
            vec![
                "work".to_owned(),
                "main".to_owned(),
                "pod=checkout-1".to_owned(),
                "namespace=shop".to_owned()
            ],
            5
        )));
        let graph = grouped.flamegraph(100);
        assert_eq!(graph.children(graph.root()).len(), 1, "one namespace");
        let namespace = &graph.children(graph.root())[0];
        assert_eq!(graph.names[namespace.name as usize], "namespace=shop");
        assert_eq!(namespace.total, 16);
        let mut pods: Vec<(&str, i64)> = graph
            .children(namespace)
            .iter()
            .map(|c| (graph.names[c.name as usize].as_str(), c.total))
            .collect();
        pods.sort_unstable();
        assert_eq!(pods, [("pod=cart-1", 8), ("pod=checkout-1", 8)]);
    }

    /// "(other)" names trimmed frames: a graph that kept every frame does
    /// not list it among its names (a client would draw it as a frame), one
    /// that trimmed some lists it once, as the node that holds their value.
    #[test]
    fn the_other_name_is_listed_only_when_frames_were_trimmed() {
        use crate::query::flamegraph::OTHER_NODE_NAME;
        let merged = sample_merge();
        let whole = merged.flamegraph(100);
        assert!(
            !whole.names.iter().any(|n| n == OTHER_NODE_NAME),
            "{:?}",
            whole.names
        );
        let whole_diff = crate::diff(&merged, &merged, 100);
        assert!(!whole_diff.names.iter().any(|n| n == OTHER_NODE_NAME));
        // Root, main and one "other" node for main's two children.
        let trimmed = merged.flamegraph(3);
        let others: Vec<_> = trimmed
            .nodes
            .iter()
            .filter(|n| trimmed.names[n.name as usize] == OTHER_NODE_NAME)
            .collect();
        assert_eq!(others.len(), 1, "{:?}", trimmed.names);
        assert_eq!(others[0].total, 8, "work's and idle's values");
        let trimmed_diff = crate::diff(&merged, &merged, 3);
        assert_eq!(
            trimmed_diff
                .names
                .iter()
                .filter(|n| *n == OTHER_NODE_NAME)
                .count(),
            1
        );
    }

    #[test]
    fn equal_totals_are_drawn_in_name_order_whatever_order_they_were_merged_in() {
        let pods = ["pod=search", "pod=checkout", "pod=auth"];
        let mut orders = Vec::new();
        for merged_order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let mut grouped = MergedProfile::new();
            for index in merged_order {
                let pod = &pods[index]["pod=".len()..];
                grouped.add_grouped(&sample_merge(), &["pod".to_owned()], &[pod]);
            }
            let graph = grouped.flamegraph(100);
            let drawn: Vec<String> = graph
                .children(graph.root())
                .iter()
                .map(|c| graph.names[c.name as usize].clone())
                .collect();
            orders.push(drawn);
        }
        for drawn in &orders {
            assert_eq!(drawn, &["pod=auth", "pod=checkout", "pod=search"]);
        }
    }

    #[test]
    fn sample_labels_group_per_stack_and_a_missing_label_is_named() {
        let mut grouped = MergedProfile::new();
        grouped.add_grouped(&sample_merge(), &["thread".to_owned()], &[""]);
        let mut roots: Vec<(String, i64)> = grouped
            .stacks()
            .into_iter()
            .map(|(frames, value)| (frames.last().cloned().unwrap_or_default(), value))
            .collect();
        roots.sort();
        assert_eq!(
            roots,
            [
                ("thread=(none)".to_owned(), 3),
                ("thread=worker".to_owned(), 5)
            ]
        );
    }

    #[test]
    fn a_grouped_pprof_carries_the_group_frames_and_the_same_total() {
        let mut grouped = MergedProfile::new();
        grouped.add_grouped(&sample_merge(), &["pod".to_owned()], &["checkout-1"]);
        let profile =
            grouped.to_pprof(&ProfileType::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap());
        let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, 8);
        assert!(
            profile
                .string_table
                .iter()
                .any(|name| name.as_slice() == b"pod=checkout-1")
        );
    }

    #[test]
    fn folded_lines_are_root_first_and_add_up_to_the_total() {
        assert_eq!(sample_merge().folded(), "main;idle 3\nmain;work 5\n");
    }
}
