//! Copying entries from one symbol table into another by content, memoized,
//! so each source entry is looked at once per translation however many
//! samples reference it. Used by block encoding (which thereby drops
//! unreferenced entries), compaction and query merges.

use super::{Function, Line, Mapping, NO_MAPPING, ROOT_NODE, SampleLabel, SymbolTable};

/// A memo slot holds the destination id plus one, so that a slot not yet
/// seen is zero.
///
/// NB: memos are sized to the source's tables, which for a query's block
/// are every pod's, while a one-pod merge touches a few entries. Zeroed
/// vectors come from the allocator as untouched pages (the store's large
/// allocations are fresh mmaps); filled with `u32::MAX` they were written
/// whole for every block a query read.
const UNSEEN: u32 = 0;

fn slot(id: u32) -> u32 {
    id.wrapping_add(1)
}

fn seen(slot: u32) -> Option<u32> {
    slot.checked_sub(1)
}

/// Destination ids of a filled memo (an unseen slot reads as `u32::MAX`).
fn ids(memo: Vec<u32>) -> Vec<u32> {
    memo.into_iter().map(|s| s.wrapping_sub(1)).collect()
}

/// Memo of source id -> destination id for every table.
#[derive(Debug)]
pub(crate) struct SymbolTranslator {
    strings: Vec<u32>,
    mappings: Vec<u32>,
    functions: Vec<u32>,
    locations: Vec<u32>,
    nodes: Vec<u32>,
    label_sets: Vec<u32>,
    chain: Vec<u32>,
    lines: Vec<Line>,
    labels: Vec<SampleLabel>,
}

impl SymbolTranslator {
    /// Starts an empty memo sized for `src`.
    pub(crate) fn new(src: &SymbolTable) -> Self {
        let mut nodes = vec![UNSEEN; src.nodes.len()];
        if let Some(root) = nodes.first_mut() {
            *root = slot(ROOT_NODE);
        }
        Self {
            strings: vec![UNSEEN; src.strings.len()],
            mappings: vec![UNSEEN; src.mappings.len()],
            functions: vec![UNSEEN; src.functions.len()],
            locations: vec![UNSEEN; src.locations.len()],
            nodes,
            label_sets: vec![UNSEEN; src.label_sets.len()],
            chain: Vec::new(),
            lines: Vec::new(),
            labels: Vec::new(),
        }
    }

    fn string(&mut self, src: &SymbolTable, dst: &mut SymbolTable, id: u32) -> u32 {
        let Some(memo) = self.strings.get_mut(id as usize) else {
            return 0;
        };
        if *memo == UNSEEN {
            *memo = slot(dst.intern_string(src.string(id)));
        }
        memo.wrapping_sub(1)
    }

    fn mapping(&mut self, src: &SymbolTable, dst: &mut SymbolTable, id: u32) -> u32 {
        let Some(&mapping) = src.mapping(id) else {
            return NO_MAPPING;
        };
        if self.mappings[id as usize] == UNSEEN {
            let translated = Mapping {
                filename: self.string(src, dst, mapping.filename),
                build_id: self.string(src, dst, mapping.build_id),
                ..mapping
            };
            self.mappings[id as usize] = slot(dst.intern_mapping(translated));
        }
        self.mappings[id as usize].wrapping_sub(1)
    }

    fn function(&mut self, src: &SymbolTable, dst: &mut SymbolTable, id: u32) -> u32 {
        let Some(&function) = src.function(id) else {
            return 0;
        };
        if self.functions[id as usize] == UNSEEN {
            let translated = Function {
                name: self.string(src, dst, function.name),
                system_name: self.string(src, dst, function.system_name),
                filename: self.string(src, dst, function.filename),
                start_line: function.start_line,
            };
            self.functions[id as usize] = slot(dst.intern_function(translated));
        }
        self.functions[id as usize].wrapping_sub(1)
    }

    pub(crate) fn location(&mut self, src: &SymbolTable, dst: &mut SymbolTable, id: u32) -> u32 {
        let Some(&location) = src.location(id) else {
            return dst.intern_location(NO_MAPPING, 0, &[]);
        };
        if self.locations[id as usize] == UNSEEN {
            let mapping = self.mapping(src, dst, location.mapping);
            let mut lines = std::mem::take(&mut self.lines);
            lines.clear();
            for line in src.location_lines(&location) {
                lines.push(Line {
                    function: self.function(src, dst, line.function),
                    line: line.line,
                });
            }
            self.locations[id as usize] =
                slot(dst.intern_location(mapping, location.address, &lines));
            self.lines = lines;
        }
        self.locations[id as usize].wrapping_sub(1)
    }

    /// Translates every entry of `src` into `dst` and returns the id
    /// remaps of its strings, stack nodes and sample label sets, so the
    /// caller can drop `src`.
    pub(crate) fn translate_all(
        mut self,
        src: &SymbolTable,
        dst: &mut SymbolTable,
    ) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        for id in 0..src.strings.len() {
            self.string(src, dst, id as u32);
        }
        for node in 0..src.nodes.len() {
            self.node(src, dst, node as u32);
        }
        for set in 0..src.label_sets.len() {
            self.label_set(src, dst, set as u32);
        }
        (ids(self.strings), ids(self.nodes), ids(self.label_sets))
    }

    /// Translates stack node `node` of `src` into `dst`.
    pub(crate) fn node(&mut self, src: &SymbolTable, dst: &mut SymbolTable, node: u32) -> u32 {
        // Walk up to the nearest translated ancestor, then intern back down.
        let mut chain = std::mem::take(&mut self.chain);
        chain.clear();
        let mut current = node;
        let mut base = ROOT_NODE;
        loop {
            match self.nodes.get(current as usize) {
                None => break,
                Some(&memo) if memo != UNSEEN => {
                    base = memo.wrapping_sub(1);
                    break;
                }
                Some(_) => {
                    chain.push(current);
                    let parent = src.nodes[current as usize].parent;
                    // Parents precede children (checked on decode); stop on anything else.
                    if parent >= current {
                        break;
                    }
                    current = parent;
                }
            }
        }
        let mut translated = base;
        for &src_node in chain.iter().rev() {
            let location = self.location(src, dst, src.nodes[src_node as usize].location);
            translated = dst.intern_node(translated, location);
            self.nodes[src_node as usize] = slot(translated);
        }
        self.chain = chain;
        translated
    }

    /// Translates sample label set `id` of `src` into `dst`.
    pub(crate) fn label_set(&mut self, src: &SymbolTable, dst: &mut SymbolTable, id: u32) -> u32 {
        let Some(&memo) = self.label_sets.get(id as usize) else {
            return super::EMPTY_LABEL_SET;
        };
        if let Some(translated) = seen(memo) {
            return translated;
        }
        let mut labels = std::mem::take(&mut self.labels);
        labels.clear();
        for label in src.label_set(id) {
            labels.push(SampleLabel {
                key: self.string(src, dst, label.key),
                str: self.string(src, dst, label.str),
                num: label.num,
                unit: self.string(src, dst, label.unit),
            });
        }
        labels.sort_unstable();
        let translated = dst.intern_label_set(&labels);
        self.label_sets[id as usize] = slot(translated);
        self.labels = labels;
        translated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translation_keeps_content_and_drops_unreferenced_entries() {
        let mut src = SymbolTable::new();
        let unused = src.intern_string("unused");
        assert!(unused > 0);
        let name = src.intern_string("work");
        let function = src.intern_function(Function {
            name,
            system_name: name,
            filename: 0,
            start_line: 0,
        });
        let loc = src.intern_location(NO_MAPPING, 7, &[Line { function, line: 9 }]);
        let node = src.intern_node(ROOT_NODE, loc);
        let mut dst = SymbolTable::new();
        dst.intern_string("something else");
        let mut translator = SymbolTranslator::new(&src);
        let translated = translator.node(&src, &mut dst, node);
        let mut locs = Vec::new();
        dst.stack_locations(translated, &mut locs);
        let location = dst.location(locs[0]).copied().unwrap();
        assert_eq!(location.address, 7);
        let line = dst.location_lines(&location)[0];
        assert_eq!(line.line, 9);
        let function = dst.function(line.function).unwrap();
        assert_eq!(dst.string(function.name), "work");
        assert!(!dst.strings.iter().any(|s| &**s == "unused"));
    }
}
