//! Keeping the samples of a merge that carry a per-sample label value: a
//! span profile is the part of its series' merge whose samples ran inside
//! the span, marked by their `span_id` label (which never selects a
//! series, so a million spans do not make a million series).

use hashbrown::HashMap;

use super::merged::MergedProfile;

impl MergedProfile {
    /// Keeps only the values whose sample label set holds a string label
    /// `name` whose value `keep` accepts; the total becomes theirs. The
    /// kept values are merged into a fresh symbol table, so no frame of a
    /// dropped stack is left for a flame graph to draw.
    pub fn retain_sample_label(&mut self, name: &str, keep: impl Fn(&str) -> bool) {
        let symbols = &self.symbols;
        // Decided once per label set: many stacks share one set.
        let mut kept_sets: HashMap<u32, bool> = HashMap::new();
        let kept: Vec<((u32, u32), i64)> = self
            .values
            .iter()
            .filter(|&(&(_, labels), _)| {
                *kept_sets.entry(labels).or_insert_with(|| {
                    symbols.label_set(labels).iter().any(|label| {
                        label.str != 0
                            && symbols.string(label.key) == name
                            && keep(symbols.string(label.str))
                    })
                })
            })
            .map(|(&key, &value)| (key, value))
            .collect();
        let mut retained = MergedProfile::new();
        retained.add_from(&self.symbols, kept);
        *self = retained;
    }
}

#[cfg(test)]
mod tests {
    use crate::symbols::SampleLabel;

    use super::MergedProfile;

    /// `main;slow` (7) in span `aa`, `main;other` (4) in span `bb` and
    /// `main;idle` (2) in no span.
    fn spans() -> MergedProfile {
        let mut merged = MergedProfile::new();
        let (main, slow, other, idle) = (
            merged.test_frame("main"),
            merged.test_frame("slow"),
            merged.test_frame("other"),
            merged.test_frame("idle"),
        );
        let key = merged.symbols.intern_string("span_id");
        let mut span = |id: &str| {
            let str = merged.symbols.intern_string(id);
            merged.symbols.intern_label_set(&[SampleLabel {
                key,
                str,
                num: 0,
                unit: 0,
            }])
        };
        let (in_aa, in_bb) = (span("aa"), span("bb"));
        for (stack, labels, value) in [
            ([main, slow], in_aa, 7),
            ([main, other], in_bb, 4),
            ([main, idle], 0, 2),
        ] {
            let stack = merged.symbols.intern_stack(&stack);
            merged.values.insert((stack, labels), value);
            merged.total += value;
        }
        merged
    }

    #[test]
    fn only_the_samples_of_the_selected_spans_are_kept() {
        let mut merged = spans();
        merged.retain_sample_label("span_id", |id| id == "aa");
        assert_eq!(merged.total(), 7);
        assert_eq!(
            merged.stacks(),
            [(vec!["slow".to_owned(), "main".to_owned()], 7)]
        );
        let mut both = spans();
        both.retain_sample_label("span_id", |id| id == "aa" || id == "bb");
        assert_eq!(both.total(), 11);
        let mut none = spans();
        none.retain_sample_label("span_id", |id| id == "cc");
        assert!(none.is_empty());
        assert_eq!(none.total(), 0);
        assert_eq!(none.flamegraph(16).nodes.len(), 1, "the root alone");
    }

    #[test]
    fn another_label_of_the_same_value_does_not_select() {
        let mut merged = spans();
        merged.retain_sample_label("trace_id", |id| id == "aa");
        assert!(merged.is_empty());
    }
}
