//! Content keys: 128-bit hashes of what a stack node or a sample label set
//! holds (frames by mapping, address, lines and function names; labels by
//! their strings), the same in every symbol table exactly when
//! [`super::SymbolTranslator`] would map the two entries to one. A merge
//! that remembers the key of each stack it already holds adds a block's
//! stack with one lookup instead of translating it frame by frame through
//! that block's tables, once per block.
//!
//! Keys are SipHash-1-3 with a 128-bit output under keys drawn once per
//! process, so they agree across every block a process reads and cannot be
//! aimed at a collision from outside. Where a table refers to an entry it lacks
//! (only in a corrupt table), there is no key and the caller translates.

use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::OnceLock;

use siphasher::sip128::{Hasher128, SipHasher13};

use super::{NO_MAPPING, ROOT_NODE, SymbolTable};

/// The content key of a stack node or a sample label set.
pub type ContentKey = u128;

/// The key of the root node (the empty stack).
const ROOT_KEY: ContentKey = 0;

/// A SipHash-1-3 hasher under this process's content-key keys: the one
/// keyed hash behind every content key of the engine (stack nodes and label
/// sets here, a profile's locations at ingest).
///
/// NB: one 128-bit pass, not two 64-bit ones under two keys: hashing
/// content keys was a tenth of the CPU of the workload bench's merges at
/// 500 pods (perf), all of it in the two passes.
pub(crate) fn content_hasher() -> SipHasher13 {
    static KEYS: OnceLock<(u64, u64)> = OnceLock::new();
    let &(k0, k1) = KEYS.get_or_init(|| {
        // std's RandomState is seeded from the OS once per process; two of
        // its hashes are two random words.
        let state = RandomState::new();
        (state.hash_one(0u8), state.hash_one(1u8))
    });
    SipHasher13::new_with_keys(k0, k1)
}

fn key_of<T: Hash + ?Sized>(value: &T) -> ContentKey {
    let mut hasher = content_hasher();
    value.hash(&mut hasher);
    hasher.finish128().as_u128()
}

/// Keys memoized by table id, one slot per entry of the table.
///
/// NB: keyers are run over a partial's own table, nearly every entry of which
/// is keyed, so slots are dense; a hash map of `Option` keys (48 bytes an
/// entry, grown by doubling into fresh pages under the store's mmap
/// threshold) was 6 % of a query-only run's CPU at 2,000 pods (perf). The
/// slots start zeroed, so the allocator hands over untouched pages.
#[derive(Debug)]
struct KeyMemo {
    keys: Vec<ContentKey>,
    /// Per slot: [`UNKEYED`], [`NO_KEY`] or [`KEYED`].
    state: Vec<u8>,
}

const UNKEYED: u8 = 0;
const NO_KEY: u8 = 1;
const KEYED: u8 = 2;

impl KeyMemo {
    fn new(len: usize) -> Self {
        Self {
            keys: vec![0; len],
            state: vec![UNKEYED; len],
        }
    }

    /// The memoized key of `id`: `None` when not keyed yet (or out of the
    /// table, which is never memoized).
    fn get(&self, id: u32) -> Option<Option<ContentKey>> {
        match *self.state.get(id as usize)? {
            KEYED => Some(Some(self.keys[id as usize])),
            NO_KEY => Some(None),
            _ => None,
        }
    }

    fn set(&mut self, id: u32, key: Option<ContentKey>) {
        let Some(state) = self.state.get_mut(id as usize) else {
            return;
        };
        match key {
            Some(key) => {
                *state = KEYED;
                self.keys[id as usize] = key;
            }
            None => *state = NO_KEY,
        }
    }
}

/// Computes keys of one table's entries, memoized so that stacks sharing
/// frames hash each frame once.
#[derive(Debug)]
pub(crate) struct ContentKeyer<'a> {
    src: &'a SymbolTable,
    nodes: KeyMemo,
    locations: KeyMemo,
    functions: KeyMemo,
}

impl<'a> ContentKeyer<'a> {
    pub(crate) fn new(src: &'a SymbolTable) -> Self {
        Self {
            src,
            nodes: KeyMemo::new(src.nodes.len()),
            locations: KeyMemo::new(src.locations.len()),
            functions: KeyMemo::new(src.functions.len()),
        }
    }

    fn string(&self, id: u32) -> Option<&'a str> {
        self.src.strings.get(id as usize).map(|s| &**s)
    }

    fn function(&mut self, id: u32) -> Option<ContentKey> {
        if let Some(key) = self.functions.get(id) {
            return key;
        }
        let key = self.src.function(id).and_then(|f| {
            Some(key_of(&(
                self.string(f.name)?,
                self.string(f.system_name)?,
                self.string(f.filename)?,
                f.start_line,
            )))
        });
        self.functions.set(id, key);
        key
    }

    /// As the translator does, a location without a mapping entry (none
    /// named, or a missing one) keys as "no mapping", and a missing
    /// location as the empty one.
    fn location(&mut self, id: u32) -> Option<ContentKey> {
        if let Some(key) = self.locations.get(id) {
            return key;
        }
        let src = self.src;
        let key = match src.location(id) {
            None => Some(key_of(&(NO_MAPPING, 0u64, &[] as &[(ContentKey, i64)]))),
            Some(location) => {
                let mapping = src.mapping(location.mapping).map(|m| {
                    (
                        m.memory_start,
                        m.memory_limit,
                        m.file_offset,
                        self.string(m.filename),
                        self.string(m.build_id),
                        m.has_functions,
                    )
                });
                let mut lines = Vec::new();
                let mut complete = true;
                for line in src.location_lines(location) {
                    match self.function(line.function) {
                        Some(function) => lines.push((function, line.line)),
                        None => complete = false,
                    }
                }
                let strings_present = mapping.is_none_or(|m| m.3.is_some() && m.4.is_some());
                (complete && strings_present)
                    .then(|| key_of(&(mapping, location.address, lines.as_slice())))
            }
        };
        self.locations.set(id, key);
        key
    }

    /// The key of stack node `node`: its location's under its parent's.
    pub(crate) fn node(&mut self, node: u32) -> Option<ContentKey> {
        if node == ROOT_NODE {
            return Some(ROOT_KEY);
        }
        if let Some(key) = self.nodes.get(node) {
            return key;
        }
        // Walk up to the nearest keyed ancestor, then key back down.
        let mut chain = Vec::new();
        let mut current = node;
        let mut base = None;
        loop {
            if current == ROOT_NODE {
                base = Some(ROOT_KEY);
                break;
            }
            if let Some(key) = self.nodes.get(current) {
                base = key;
                break;
            }
            let Some(entry) = self.src.node(current) else {
                break;
            };
            chain.push((current, entry.location));
            // Parents precede children (checked on decode); anything else
            // has no key.
            if entry.parent >= current {
                break;
            }
            current = entry.parent;
        }
        let mut key = base;
        for &(id, location) in chain.iter().rev() {
            key = match (key, self.location(location)) {
                (Some(parent), Some(location)) => Some(key_of(&(parent, location))),
                _ => None,
            };
            self.nodes.set(id, key);
        }
        key
    }

    /// The key of sample label set `id`: its labels' contents, in an order
    /// of their own (the translator sorts the labels it interns too).
    pub(crate) fn label_set(&self, id: u32) -> Option<ContentKey> {
        let labels = self.src.label_sets.get(id as usize)?;
        let mut contents = Vec::with_capacity(labels.len());
        for label in labels.iter() {
            contents.push((
                self.string(label.key)?,
                self.string(label.str)?,
                label.num,
                self.string(label.unit)?,
            ));
        }
        contents.sort_unstable();
        Some(key_of(contents.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::{Function, Line, Mapping, SampleLabel};

    /// The same stack built in two tables with different ids gets one key;
    /// a stack differing in one line number gets another.
    #[test]
    fn keys_follow_content_not_ids() {
        let build = |padding: usize, line: i64| {
            let mut t = SymbolTable::new();
            for i in 0..padding {
                t.intern_string(&format!("pad{i}"));
            }
            let file = t.intern_string("/bin/app");
            let mapping = t.intern_mapping(Mapping {
                memory_start: 0x1000,
                memory_limit: 0x9000,
                file_offset: 0,
                filename: file,
                build_id: 0,
                has_functions: true,
            });
            let name = t.intern_string("main");
            let function = t.intern_function(Function {
                name,
                system_name: name,
                filename: file,
                start_line: 1,
            });
            let outer = t.intern_location(mapping, 0x1100, &[Line { function, line: 3 }]);
            let inner = t.intern_location(mapping, 0x1200, &[Line { function, line }]);
            let stack = t.intern_stack(&[outer, inner]);
            let key = t.intern_string("span");
            let value = t.intern_string("7");
            let labels = t.intern_label_set(&[SampleLabel {
                key,
                str: value,
                num: 0,
                unit: 0,
            }]);
            (t, stack, labels)
        };
        let (a, a_stack, a_labels) = build(0, 9);
        let (b, b_stack, b_labels) = build(5, 9);
        let (c, c_stack, _) = build(0, 10);
        let key = |t: &SymbolTable, stack| ContentKeyer::new(t).node(stack).unwrap();
        assert_eq!(key(&a, a_stack), key(&b, b_stack));
        assert_ne!(key(&a, a_stack), key(&c, c_stack));
        assert_eq!(
            ContentKeyer::new(&a).label_set(a_labels),
            ContentKeyer::new(&b).label_set(b_labels)
        );
        assert_ne!(
            ContentKeyer::new(&a).label_set(a_labels),
            ContentKeyer::new(&a).label_set(crate::symbols::EMPTY_LABEL_SET)
        );
    }
}
