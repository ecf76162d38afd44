//! Deduplicated symbol tables: strings, mappings, functions, locations with
//! inlined lines, sample label sets, and stacks as a parent-pointer tree.
//!
//! Every table deduplicates by content, so the same stack ingested from a
//! thousand pods costs one entry. Tables are per head or per block, which is
//! what bounds them: retention deletes blocks, and their symbols go with them.

mod content_key;
mod translate;

use std::hash::{BuildHasher, Hash, Hasher};

use hashbrown::{DefaultHashBuilder, HashMap, HashTable};

pub(crate) use content_key::{ContentKey, ContentKeyer, content_hasher};
pub(crate) use translate::SymbolTranslator;

/// Marks a location without a mapping.
pub const NO_MAPPING: u32 = u32::MAX;
/// The stack tree's root node: the empty stack. Real nodes start at 1.
pub const ROOT_NODE: u32 = 0;
/// The empty sample label set.
pub const EMPTY_LABEL_SET: u32 = 0;

/// An executable or library mapped into a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// Start of the mapped range.
    pub memory_start: u64,
    /// End of the mapped range.
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    pub file_offset: u64,
    /// String id of the file name.
    pub filename: u32,
    /// String id of the build id (kept so frames can be symbolized later).
    pub build_id: u32,
    /// Whether its locations were symbolized.
    pub has_functions: bool,
}

/// A function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Function {
    /// String id of the (demangled) name.
    pub name: u32,
    /// String id of the system (mangled) name.
    pub system_name: u32,
    /// String id of the source file.
    pub filename: u32,
    /// First line of the function.
    pub start_line: i64,
}

/// One source line of a location; several mean inlined calls, innermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Line {
    /// Function id.
    pub function: u32,
    /// Line number.
    pub line: i64,
}

/// A code location: mapping plus address, and its lines when symbolized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Mapping id, or [`NO_MAPPING`].
    pub mapping: u32,
    /// Instruction address (0 when unknown).
    pub address: u64,
    lines_start: u32,
    lines_len: u32,
}

/// One per-sample label kept out of the series labels (span ids, numeric labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleLabel {
    /// String id of the key.
    pub key: u32,
    /// String id of the string value (0 for numeric labels).
    pub str: u32,
    /// Numeric value (0 for string labels).
    pub num: i64,
    /// String id of the numeric unit.
    pub unit: u32,
}

/// One node of the stack tree: a location under a parent node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackNode {
    /// Parent node id; the root's parent is itself.
    pub parent: u32,
    /// Location id (unused for the root).
    pub location: u32,
}

/// Per-head or per-block deduplicated tables.
///
/// NB: tables decoded from a block are read-only and are built without
/// their dedup maps; only heads and merge results intern into a table.
#[derive(Debug, Clone)]
pub struct SymbolTable {
    pub(crate) strings: Vec<Box<str>>,
    string_lookup: HashTable<u32>,
    pub(crate) mappings: Vec<Mapping>,
    mapping_lookup: HashMap<Mapping, u32>,
    pub(crate) functions: Vec<Function>,
    function_lookup: HashMap<Function, u32>,
    pub(crate) locations: Vec<Location>,
    pub(crate) lines: Vec<Line>,
    location_lookup: HashMap<LocationKey, u32>,
    /// Locations by the content key ingest computes from a profile alone
    /// (`head::ingest::location_keys`): a location seen before is found
    /// without interning its strings, functions and mapping again.
    location_content_lookup: HashTable<LocationByContent>,
    pub(crate) nodes: Vec<StackNode>,
    node_lookup: HashMap<u64, u32>,
    /// Whole stacks seen by ingest, root first, in `stack_frames`.
    stack_lookup: HashTable<StackEntry>,
    stack_frames: Vec<u32>,
    pub(crate) label_sets: Vec<Box<[SampleLabel]>>,
    label_set_lookup: HashMap<Box<[SampleLabel]>, u32>,
    hasher: DefaultHashBuilder,
    /// Heap bytes of the variable-size entries (strings, label sets), kept
    /// as they are interned so [`SymbolTable::approx_bytes`] is O(1): ingest
    /// asks for it on every profile.
    variable_bytes: usize,
    /// Whether the dedup maps are kept (heads, merges) or not (tables read
    /// from a block, partials kept for later merges).
    has_lookups: bool,
}

fn string_bytes(s: &str) -> usize {
    s.len() + 16 + 8
}

fn label_set_bytes(labels: &[SampleLabel]) -> usize {
    size_of_val(labels) * 2 + 48
}

/// A whole stack: its locations (root first) at `stack_frames[start..start + len]`
/// and the id of its leaf node.
#[derive(Debug, Clone, Copy)]
struct StackEntry {
    start: usize,
    len: usize,
    node: u32,
}

/// A location id under its content key, split in two words so the entry
/// is 8-byte aligned (24 bytes, not a `u128`'s 32).
#[derive(Debug, Clone, Copy)]
struct LocationByContent {
    key: [u64; 2],
    id: u32,
}

fn content_words(key: u128) -> [u64; 2] {
    // Truncation is the point: the key's two halves.
    #[allow(clippy::cast_possible_truncation)]
    [key as u64, (key >> 64) as u64]
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LocationKey {
    mapping: u32,
    address: u64,
    lines: KeyLines,
}

/// A location key's lines. Most locations have one line, kept inline: a
/// lookup then compares what the map's slot holds, without following a
/// pointer to a separate allocation (that cache miss was a third of
/// `intern_location`'s time in the store's ingest).
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyLines {
    One(Line),
    Other(Box<[Line]>),
}

impl KeyLines {
    fn new(lines: &[Line]) -> Self {
        match lines {
            [line] => Self::One(*line),
            _ => Self::Other(lines.into()),
        }
    }

    fn as_slice(&self) -> &[Line] {
        match self {
            Self::One(line) => std::slice::from_ref(line),
            Self::Other(lines) => lines,
        }
    }
}

impl Hash for LocationKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        LocationKeyRef {
            mapping: self.mapping,
            address: self.address,
            lines: self.lines.as_slice(),
        }
        .hash(state);
    }
}

struct LocationKeyRef<'a> {
    mapping: u32,
    address: u64,
    lines: &'a [Line],
}

impl Hash for LocationKeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.mapping.hash(state);
        self.address.hash(state);
        self.lines.hash(state);
    }
}

impl hashbrown::Equivalent<LocationKey> for LocationKeyRef<'_> {
    fn equivalent(&self, key: &LocationKey) -> bool {
        self.mapping == key.mapping
            && self.address == key.address
            && self.lines == key.lines.as_slice()
    }
}

fn next_id(len: usize) -> u32 {
    u32::try_from(len).expect("symbol tables stay below 2^32 entries: heads are cut long before")
}

impl Default for SymbolTable {
    fn default() -> Self {
        Self::new()
    }
}

impl SymbolTable {
    /// Creates a table holding only the empty string, the root node and the
    /// empty sample label set.
    pub fn new() -> Self {
        let mut table = Self {
            strings: Vec::new(),
            string_lookup: HashTable::new(),
            mappings: Vec::new(),
            mapping_lookup: HashMap::new(),
            functions: Vec::new(),
            function_lookup: HashMap::new(),
            locations: Vec::new(),
            lines: Vec::new(),
            location_lookup: HashMap::new(),
            location_content_lookup: HashTable::new(),
            nodes: vec![StackNode {
                parent: ROOT_NODE,
                location: 0,
            }],
            node_lookup: HashMap::new(),
            stack_lookup: HashTable::new(),
            stack_frames: Vec::new(),
            label_sets: vec![Box::default()],
            label_set_lookup: HashMap::new(),
            hasher: DefaultHashBuilder::default(),
            variable_bytes: label_set_bytes(&[]),
            has_lookups: true,
        };
        table.intern_string("");
        table
            .label_set_lookup
            .insert(Box::default(), EMPTY_LABEL_SET);
        table
    }

    /// Builds a read-only table from decoded parts (no dedup maps).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_decoded(
        strings: Vec<Box<str>>,
        mappings: Vec<Mapping>,
        functions: Vec<Function>,
        locations: Vec<Location>,
        lines: Vec<Line>,
        nodes: Vec<StackNode>,
        label_sets: Vec<Box<[SampleLabel]>>,
    ) -> Self {
        let variable_bytes = strings.iter().map(|s| string_bytes(s)).sum::<usize>()
            + label_sets.iter().map(|s| label_set_bytes(s)).sum::<usize>();
        Self {
            variable_bytes,
            strings,
            string_lookup: HashTable::new(),
            mappings,
            mapping_lookup: HashMap::new(),
            functions,
            function_lookup: HashMap::new(),
            locations,
            lines,
            location_lookup: HashMap::new(),
            location_content_lookup: HashTable::new(),
            nodes,
            node_lookup: HashMap::new(),
            stack_lookup: HashTable::new(),
            stack_frames: Vec::new(),
            label_sets,
            label_set_lookup: HashMap::new(),
            hasher: DefaultHashBuilder::default(),
            has_lookups: false,
        }
    }

    /// Drops the dedup maps of a table nothing will intern into again (a
    /// partial kept for later merges, which only read it): they take about
    /// as much memory as the entries. Interning afterwards still works but
    /// no longer deduplicates against what the table held.
    pub(crate) fn drop_lookups(&mut self) {
        self.string_lookup = HashTable::new();
        self.mapping_lookup = HashMap::new();
        self.function_lookup = HashMap::new();
        self.location_lookup = HashMap::new();
        self.location_content_lookup = HashTable::new();
        self.node_lookup = HashMap::new();
        self.stack_lookup = HashTable::new();
        self.stack_frames = Vec::new();
        self.label_set_lookup = HashMap::new();
        self.has_lookups = false;
    }

    /// A copy to write a block from: every entry keeps its id, and the
    /// dedup maps come along so more entries can be interned into it, but
    /// not the lookups only ingest uses (whole stacks, locations by a
    /// profile's content key).
    pub(crate) fn copy_for_block(&self) -> Self {
        Self {
            strings: self.strings.clone(),
            string_lookup: self.string_lookup.clone(),
            mappings: self.mappings.clone(),
            mapping_lookup: self.mapping_lookup.clone(),
            functions: self.functions.clone(),
            function_lookup: self.function_lookup.clone(),
            locations: self.locations.clone(),
            lines: self.lines.clone(),
            location_lookup: self.location_lookup.clone(),
            location_content_lookup: HashTable::new(),
            nodes: self.nodes.clone(),
            node_lookup: self.node_lookup.clone(),
            stack_lookup: HashTable::new(),
            stack_frames: Vec::new(),
            label_sets: self.label_sets.clone(),
            label_set_lookup: self.label_set_lookup.clone(),
            hasher: self.hasher,
            variable_bytes: self.variable_bytes,
            has_lookups: self.has_lookups,
        }
    }

    /// Interns a string and returns its id.
    pub fn intern_string(&mut self, s: &str) -> u32 {
        let hash = self.hasher.hash_one(s);
        let strings = &self.strings;
        if let Some(&id) = self
            .string_lookup
            .find(hash, |&id| &*strings[id as usize] == s)
        {
            return id;
        }
        let id = next_id(self.strings.len());
        self.variable_bytes += string_bytes(s);
        self.strings.push(s.into());
        let strings = &self.strings;
        let hasher = &self.hasher;
        self.string_lookup
            .insert_unique(hash, id, |&id| hasher.hash_one(&*strings[id as usize]));
        id
    }

    /// Interns a mapping and returns its id.
    pub fn intern_mapping(&mut self, mapping: Mapping) -> u32 {
        if let Some(&id) = self.mapping_lookup.get(&mapping) {
            return id;
        }
        let id = next_id(self.mappings.len());
        self.mappings.push(mapping);
        self.mapping_lookup.insert(mapping, id);
        id
    }

    /// Interns a function and returns its id.
    pub fn intern_function(&mut self, function: Function) -> u32 {
        if let Some(&id) = self.function_lookup.get(&function) {
            return id;
        }
        let id = next_id(self.functions.len());
        self.functions.push(function);
        self.function_lookup.insert(function, id);
        id
    }

    /// Interns a location (lines innermost first) and returns its id.
    pub fn intern_location(&mut self, mapping: u32, address: u64, lines: &[Line]) -> u32 {
        let key = LocationKeyRef {
            mapping,
            address,
            lines,
        };
        if let Some(&id) = self.location_lookup.get(&key) {
            return id;
        }
        let id = next_id(self.locations.len());
        self.locations.push(Location {
            mapping,
            address,
            lines_start: next_id(self.lines.len()),
            lines_len: next_id(lines.len()),
        });
        self.lines.extend_from_slice(lines);
        self.location_lookup.insert(
            LocationKey {
                mapping,
                address,
                lines: KeyLines::new(lines),
            },
            id,
        );
        id
    }

    /// Gives location `id` the lines `lines` (innermost first) in place of
    /// the ones it has: a frame known only by its address, named once its
    /// debug info was found. Every stack holding the location is named
    /// with it. Returns false for an unknown id or a table read from a
    /// block, which is never changed.
    pub(crate) fn replace_location_lines(&mut self, id: u32, lines: &[Line]) -> bool {
        if !self.has_lookups {
            return false;
        }
        let Some(location) = self.locations.get(id as usize).copied() else {
            return false;
        };
        let old_start = location.lines_start as usize;
        let old_lines = self
            .lines
            .get(old_start..old_start + location.lines_len as usize)
            .unwrap_or(&[]);
        self.location_lookup.remove(&LocationKeyRef {
            mapping: location.mapping,
            address: location.address,
            lines: old_lines,
        });
        let start = next_id(self.lines.len());
        self.lines.extend_from_slice(lines);
        let replaced = Location {
            lines_start: start,
            lines_len: next_id(lines.len()),
            ..location
        };
        self.locations[id as usize] = replaced;
        self.location_lookup.insert(
            LocationKey {
                mapping: location.mapping,
                address: location.address,
                lines: KeyLines::new(lines),
            },
            id,
        );
        true
    }

    /// The location stored under content key `key` by
    /// [`SymbolTable::remember_location_content`], if any.
    pub(crate) fn location_by_content(&self, key: u128) -> Option<u32> {
        let words = content_words(key);
        // The key is a keyed hash already: its low word is the table's hash.
        self.location_content_lookup
            .find(words[0], |entry| entry.key == words)
            .map(|entry| entry.id)
    }

    /// Remembers that content key `key` is location `id`.
    pub(crate) fn remember_location_content(&mut self, key: u128, id: u32) {
        let words = content_words(key);
        if self.location_by_content(key).is_some() {
            return;
        }
        self.location_content_lookup.insert_unique(
            words[0],
            LocationByContent { key: words, id },
            |entry| entry.key[0],
        );
    }

    /// Interns the stack node `location` under `parent` and returns its id.
    pub fn intern_node(&mut self, parent: u32, location: u32) -> u32 {
        let key = (u64::from(parent) << 32) | u64::from(location);
        if let Some(&id) = self.node_lookup.get(&key) {
            return id;
        }
        let id = next_id(self.nodes.len());
        self.nodes.push(StackNode { parent, location });
        self.node_lookup.insert(key, id);
        id
    }

    /// Interns the stack of `locations` (root first) and returns its leaf
    /// node, or [`ROOT_NODE`] for an empty stack.
    ///
    /// NB: same as calling [`SymbolTable::intern_node`] frame by frame, but a
    /// stack seen before costs one hash of its frames and one lookup instead
    /// of one cache-missing lookup per frame, which dominated ingest.
    pub fn intern_stack(&mut self, locations: &[u32]) -> u32 {
        if locations.is_empty() {
            return ROOT_NODE;
        }
        let hash = self.hasher.hash_one(locations);
        let frames = &self.stack_frames;
        let found = self.stack_lookup.find(hash, |entry| {
            frames.get(entry.start..entry.start + entry.len) == Some(locations)
        });
        if let Some(entry) = found {
            return entry.node;
        }
        let mut node = ROOT_NODE;
        for &location in locations {
            node = self.intern_node(node, location);
        }
        let entry = StackEntry {
            start: self.stack_frames.len(),
            len: locations.len(),
            node,
        };
        self.stack_frames.extend_from_slice(locations);
        let frames = &self.stack_frames;
        let hasher = &self.hasher;
        self.stack_lookup.insert_unique(hash, entry, |entry| {
            hasher.hash_one(
                frames
                    .get(entry.start..entry.start + entry.len)
                    .unwrap_or(&[]),
            )
        });
        node
    }

    /// Interns a sample label set (must be sorted) and returns its id.
    pub fn intern_label_set(&mut self, labels: &[SampleLabel]) -> u32 {
        if let Some(&id) = self.label_set_lookup.get(labels) {
            return id;
        }
        let id = next_id(self.label_sets.len());
        self.variable_bytes += label_set_bytes(labels);
        self.label_sets.push(labels.into());
        self.label_set_lookup.insert(labels.into(), id);
        id
    }

    /// The string with id `id` (`""` when out of range).
    pub fn string(&self, id: u32) -> &str {
        self.strings.get(id as usize).map_or("", |s| s)
    }

    /// Number of strings.
    pub fn string_count(&self) -> usize {
        self.strings.len()
    }

    /// The mapping with id `id`, if any.
    pub fn mapping(&self, id: u32) -> Option<&Mapping> {
        self.mappings.get(id as usize)
    }

    /// The function with id `id`, if any.
    pub fn function(&self, id: u32) -> Option<&Function> {
        self.functions.get(id as usize)
    }

    /// The location with id `id`, if any.
    pub fn location(&self, id: u32) -> Option<&Location> {
        self.locations.get(id as usize)
    }

    /// Number of locations.
    pub fn location_count(&self) -> usize {
        self.locations.len()
    }

    /// The lines of a location, innermost (inlined) first.
    pub fn location_lines(&self, location: &Location) -> &[Line] {
        let start = location.lines_start as usize;
        self.lines
            .get(start..start + location.lines_len as usize)
            .unwrap_or(&[])
    }

    /// The stack node with id `id`, if any.
    pub fn node(&self, id: u32) -> Option<&StackNode> {
        self.nodes.get(id as usize)
    }

    /// Number of stack nodes, including the root.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The sample label set with id `id` (empty when out of range).
    pub fn label_set(&self, id: u32) -> &[SampleLabel] {
        self.label_sets.get(id as usize).map_or(&[], |s| s)
    }

    /// Appends the locations of stack `node`, leaf first, to `out`.
    pub fn stack_locations(&self, mut node: u32, out: &mut Vec<u32>) {
        // Parents always have smaller ids than children (checked on decode), so this ends.
        while node != ROOT_NODE {
            let Some(entry) = self.nodes.get(node as usize) else {
                return;
            };
            out.push(entry.location);
            if entry.parent >= node {
                return;
            }
            node = entry.parent;
        }
    }

    /// Approximate heap bytes held, for cut-by-size decisions and metrics.
    pub fn approx_bytes(&self) -> usize {
        // The dedup maps hold a copy of each fixed-size entry plus its id.
        let lookups = usize::from(self.has_lookups);
        self.variable_bytes
            + self.mappings.len() * (size_of::<Mapping>() * (1 + lookups) + 8 * lookups)
            + self.functions.len() * (size_of::<Function>() * (1 + lookups) + 8 * lookups)
            + self.locations.len() * (size_of::<Location>() + 48 * lookups)
            + self.lines.len() * size_of::<Line>() * (1 + lookups)
            + self.nodes.len() * (size_of::<StackNode>() + 16 * lookups)
            + self.stack_frames.capacity() * size_of::<u32>()
            + self.stack_lookup.capacity() * (size_of::<StackEntry>() + 1)
            + self.location_content_lookup.capacity() * (size_of::<LocationByContent>() + 1)
    }
}

/// Builds a decoded location whose lines are `lines[lines_start..lines_start + lines_len]`
/// of the table's shared lines vector.
pub(crate) fn decoded_location(
    mapping: u32,
    address: u64,
    lines_start: u32,
    lines_len: u32,
) -> Location {
    Location {
        mapping,
        address,
        lines_start,
        lines_len,
    }
}

#[cfg(test)]
mod tests;
