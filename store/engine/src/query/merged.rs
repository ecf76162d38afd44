//! The result of merging a selection: stacks with values, over its own
//! symbol table, so partial results from blocks with different symbol
//! tables merge by content.

use hashbrown::HashMap;

use crate::query::symbolize::file_offset;
use crate::symbols::{ContentKey, Location, SymbolTable, SymbolTranslator};

/// A merged selection: (stack, sample label set) -> value, with its own
/// symbols, interned by content.
#[derive(Debug, Clone, Default)]
pub struct MergedProfile {
    pub(crate) symbols: SymbolTable,
    pub(crate) values: HashMap<(u32, u32), i64>,
    pub(crate) total: i64,
    /// This merge's id of each stack and label set added from a block
    /// partial, by content key, so the same content from the next block is
    /// found without translating it again.
    pub(crate) by_content: ContentIndex,
}

/// Content key -> id in a [`MergedProfile`]'s symbols.
#[derive(Debug, Clone, Default)]
pub(crate) struct ContentIndex {
    pub(crate) nodes: HashMap<ContentKey, u32>,
    pub(crate) label_sets: HashMap<ContentKey, u32>,
}

#[cfg(test)]
impl MergedProfile {
    /// Interns a location of one frame named `name`, for tests that build
    /// merges by hand.
    pub(crate) fn test_frame(&mut self, name: &str) -> u32 {
        use crate::symbols::{Function, Line, NO_MAPPING};
        let name = self.symbols.intern_string(name);
        let function = self.symbols.intern_function(Function {
            name,
            system_name: name,
            filename: 0,
            start_line: 0,
        });
        self.symbols
            .intern_location(NO_MAPPING, 0, &[Line { function, line: 0 }])
    }
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

    /// Approximate heap bytes held, for the query's memory bound; O(1).
    pub fn approx_bytes(&self) -> usize {
        self.symbols.approx_bytes()
            + self.values.capacity() * (size_of::<((u32, u32), i64)>() + 1)
            + (self.by_content.nodes.capacity() + self.by_content.label_sets.capacity())
                * (size_of::<(u128, u32)>() + 1)
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

/// `libc.so.6+0x1a2b` style name for a frame without a function, where the
/// number is the offset in the file when the mapping says where the file was
/// loaded, and the address as sent otherwise. A mapping without a file name
/// is named by its build id (`build-id:<first 16 hex digits>`), and a frame
/// without either by `[unknown]`: never a bare address, which reads as
/// nothing in a flame graph.
///
/// NB: the file offset is the same in every process that maps the file,
/// whatever address-space randomisation chose, so one unsymbolized frame of
/// a shared library merges into one flame-graph node across processes and pods.
pub(crate) fn unsymbolized_name(symbols: &SymbolTable, location: &Location) -> String {
    let mapping = symbols.mapping(location.mapping);
    let file = mapping.map(|m| symbols.string(m.filename)).unwrap_or("");
    let base = file.rsplit('/').next().unwrap_or(file);
    let build_id = mapping.map(|m| symbols.string(m.build_id)).unwrap_or("");
    let module = if !base.is_empty() {
        base.to_owned()
    } else if !build_id.is_empty() {
        let short: String = build_id.chars().take(16).collect();
        format!("build-id:{short}")
    } else {
        "[unknown]".to_owned()
    };
    let offset = mapping
        .and_then(|m| file_offset(m, location.address))
        .unwrap_or(location.address);
    format!("{module}+0x{offset:x}")
}

#[cfg(test)]
mod tests {
    use super::unsymbolized_name;
    use crate::symbols::{Mapping, SymbolTable};

    /// Two processes load libc at different addresses; the same instruction
    /// must get one name so their flame graphs merge.
    #[test]
    fn unsymbolized_frames_are_named_by_file_offset_across_load_addresses() {
        let mut symbols = SymbolTable::new();
        let filename = symbols.intern_string("/usr/lib/libc.so.6");
        let mapping_at = |memory_start: u64| Mapping {
            memory_start,
            memory_limit: memory_start + 0x10_0000,
            file_offset: 0x2_8000,
            filename,
            build_id: 0,
            has_functions: false,
        };
        let first = mapping_at(0x7f00_0000_0000);
        let second = mapping_at(0x7f55_1000_0000);
        let first = symbols.intern_mapping(first);
        let second = symbols.intern_mapping(second);
        let a = symbols.intern_location(first, 0x7f00_0000_1234, &[]);
        let b = symbols.intern_location(second, 0x7f55_1000_1234, &[]);
        let name_a = unsymbolized_name(&symbols, symbols.location(a).unwrap());
        let name_b = unsymbolized_name(&symbols, symbols.location(b).unwrap());
        assert_eq!(name_a, "libc.so.6+0x29234");
        assert_eq!(name_a, name_b);
    }

    #[test]
    fn a_frame_without_a_file_name_is_named_by_build_id_or_unknown_never_a_bare_address() {
        let mut symbols = SymbolTable::new();
        let build_id = symbols.intern_string("0123456789abcdef0123456789abcdef01234567");
        let by_build_id = symbols.intern_mapping(Mapping {
            memory_start: 0x1000,
            memory_limit: 0x2000,
            file_offset: 0,
            filename: 0,
            build_id,
            has_functions: false,
        });
        let location = symbols.intern_location(by_build_id, 0x1234, &[]);
        assert_eq!(
            unsymbolized_name(&symbols, symbols.location(location).unwrap()),
            "build-id:0123456789abcdef+0x234"
        );
        let unmapped = symbols.intern_location(crate::symbols::NO_MAPPING, 0x1234, &[]);
        assert_eq!(
            unsymbolized_name(&symbols, symbols.location(unmapped).unwrap()),
            "[unknown]+0x1234"
        );
    }

    #[test]
    fn an_address_outside_its_mapping_keeps_the_raw_address() {
        let mut symbols = SymbolTable::new();
        let filename = symbols.intern_string("app");
        let mapping = symbols.intern_mapping(Mapping {
            memory_start: 0x1000,
            memory_limit: 0, // unknown limit
            file_offset: 0,
            filename,
            build_id: 0,
            has_functions: false,
        });
        let location = symbols.intern_location(mapping, 0x1234, &[]);
        assert_eq!(
            unsymbolized_name(&symbols, symbols.location(location).unwrap()),
            "app+0x1234"
        );
    }
}
