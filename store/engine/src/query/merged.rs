//! The result of merging a selection: stacks with values, over its own
//! symbol table, so partial results from blocks with different symbol
//! tables merge by content.

use hashbrown::HashMap;

use crate::symbols::{Location, SymbolTable, SymbolTranslator};

/// A merged selection: (stack, sample label set) -> value, with its own
/// symbols, interned by content.
#[derive(Debug, Clone, Default)]
pub struct MergedProfile {
    pub(crate) symbols: SymbolTable,
    pub(crate) values: HashMap<(u32, u32), i64>,
    total: i64,
}

impl MergedProfile {
    /// An empty merge.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sum of all values.
    pub fn total(&self) -> i64 {
        self.total
    }

    /// True when nothing was merged in.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Number of distinct (stack, sample label set) keys.
    pub fn stack_count(&self) -> usize {
        self.values.len()
    }

    /// Adds `(stack, label set) -> value` entries whose ids refer to `src`.
    pub(crate) fn add_from(
        &mut self,
        src: &SymbolTable,
        entries: impl IntoIterator<Item = ((u32, u32), i64)>,
    ) {
        let mut translator = SymbolTranslator::new(src);
        for ((stack, labels), value) in entries {
            let stack = translator.node(src, &mut self.symbols, stack);
            let labels = translator.label_set(src, &mut self.symbols, labels);
            let sum = self.values.entry((stack, labels)).or_insert(0);
            *sum = sum.wrapping_add(value);
            self.total = self.total.wrapping_add(value);
        }
    }

    /// Merges another merge result into this one.
    pub fn merge(&mut self, other: &MergedProfile) {
        self.add_from(&other.symbols, other.values.iter().map(|(&k, &v)| (k, v)));
    }

    /// The display name of each frame of `location`, innermost (leaf) first:
    /// one per inlined line, or one synthetic name for unsymbolized code.
    pub(crate) fn frame_names(&self, location: &Location, out: &mut Vec<String>) {
        frame_names(&self.symbols, location, out);
    }

    /// Every stack as frame names, leaf first, with its summed value
    /// (sample labels merged away), sorted. Meant for checks and tests.
    pub fn stacks(&self) -> Vec<(Vec<String>, i64)> {
        let mut by_stack: HashMap<Vec<String>, i64> = HashMap::new();
        let mut locations = Vec::new();
        for (&(stack, _), &value) in &self.values {
            locations.clear();
            self.symbols.stack_locations(stack, &mut locations);
            let mut names = Vec::new();
            for &location in &locations {
                if let Some(location) = self.symbols.location(location) {
                    self.frame_names(location, &mut names);
                }
            }
            let sum = by_stack.entry(names).or_insert(0);
            *sum = sum.wrapping_add(value);
        }
        let mut out: Vec<_> = by_stack.into_iter().collect();
        out.sort();
        out
    }

    /// The merge's symbol table.
    pub fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }
}

/// Frame names of `location` in `symbols`, innermost first.
pub(crate) fn frame_names(symbols: &SymbolTable, location: &Location, out: &mut Vec<String>) {
    let lines = symbols.location_lines(location);
    if lines.is_empty() {
        out.push(unsymbolized_name(symbols, location));
        return;
    }
    for line in lines {
        let name = symbols.function(line.function).map_or("", |f| {
            let name = symbols.string(f.name);
            if name.is_empty() {
                symbols.string(f.system_name)
            } else {
                name
            }
        });
        if name.is_empty() {
            out.push(unsymbolized_name(symbols, location));
        } else {
            out.push(name.to_owned());
        }
    }
}

/// `libc.so.6+0x1a2b` style name for a frame without a function.
pub(crate) fn unsymbolized_name(symbols: &SymbolTable, location: &Location) -> String {
    let file = symbols
        .mapping(location.mapping)
        .map(|m| symbols.string(m.filename))
        .unwrap_or("");
    let base = file.rsplit('/').next().unwrap_or(file);
    if base.is_empty() {
        format!("0x{:x}", location.address)
    } else {
        format!("{base}+0x{:x}", location.address)
    }
}
