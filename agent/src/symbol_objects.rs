//! ELF objects' symbol indexes, kept from one window to the next by file
//! identity within a byte budget.
//!
//! Naming a file offset needs an address index over the object's symbols.
//! For a compiler's shared library (rustc's `librustc_driver` and
//! `libLLVM`, 165,000 and 258,000 symbols) building it is the agent's
//! largest cost on a node that builds: every new compiler process samples
//! offsets never named before. So indexes are kept across windows; they
//! are compact (`symbol_index`: twelve bytes a symbol, names left in the
//! file), so keeping one costs a few MiB, not the object's tables. Objects
//! idle for a few windows are dropped, and the least recently used ones go
//! first when a new index would not fit the budget.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use crate::elf_symbols::{ElfSymbolsError, read_symbol_index, read_symbol_name};
use crate::process_info::{FileIdentity, MappedFile};
use crate::symbol_index::{SymbolIndex, SymbolTableKind};

/// One object's index and the names read through it.
#[derive(Debug)]
struct HeldObject {
    index: SymbolIndex,
    /// Names by symbol, demangled, each read once: every offset in a
    /// function shares its name (`None`: unreadable).
    names: HashMap<(SymbolTableKind, u32), Option<Arc<str>>>,
    /// Heap bytes of the index and the names.
    bytes: u64,
    /// The window it was last looked up in.
    last_window: u64,
}

/// Objects ready to be looked up, by file identity.
#[derive(Debug)]
pub struct SymbolObjects {
    held: HashMap<FileIdentity, HeldObject>,
    held_bytes: u64,
    budget_bytes: u64,
    window: u64,
    /// Indexes built (each a full read of an object's symbol tables).
    loads: u64,
    /// Objects dropped to make room within the budget.
    evictions: u64,
}

/// How many windows an object may go without lookups before it is
/// dropped: a few, so a build's compiler libraries stay while compilers
/// run (most of their offsets are named from the name cache, so they are
/// not looked up in every window), and a binary that ran once is released
/// half a minute later.
const IDLE_WINDOWS: u64 = 3;

/// What a name costs besides its bytes: the `Arc` header, its map slot,
/// and the allocator's rounding.
const NAME_OVERHEAD_BYTES: u64 = 64;

impl SymbolObjects {
    /// Holds at most `budget_bytes` of indexes and names (one larger
    /// object is still held alone, so that it can be looked up at all).
    pub fn new(budget_bytes: u64) -> SymbolObjects {
        SymbolObjects {
            held: HashMap::new(),
            held_bytes: 0,
            budget_bytes,
            window: 0,
            loads: 0,
            evictions: 0,
        }
    }

    /// The names of `offsets` (file offsets) in `file`, in order. The
    /// index is built on first use, refused when the object's symbol and
    /// string tables hold more than `max_table_bytes`.
    pub fn names(
        &mut self,
        identity: FileIdentity,
        file: &MappedFile,
        max_table_bytes: u64,
        offsets: &[u64],
    ) -> Result<Vec<Option<Arc<str>>>, ElfSymbolsError> {
        if !self.held.contains_key(&identity) {
            let index = read_symbol_index(&file.file, max_table_bytes)?;
            let bytes = index.held_bytes();
            self.make_room(bytes);
            self.loads += 1;
            self.held_bytes = self.held_bytes.saturating_add(bytes);
            self.held.insert(
                identity,
                HeldObject {
                    index,
                    names: HashMap::new(),
                    bytes,
                    last_window: self.window,
                },
            );
        }
        let Some(held) = self.held.get_mut(&identity) else {
            // Inserted above; nothing is dropped in between.
            return Ok(vec![None; offsets.len()]);
        };
        held.last_window = self.window;
        let mut added = 0u64;
        let names = offsets
            .iter()
            .map(|&offset| {
                let found = held.index.find(offset)?;
                match held.names.entry((found.table, found.position)) {
                    Entry::Occupied(name) => name.get().clone(),
                    Entry::Vacant(slot) => {
                        let name = read_symbol_name(&file.file, &found)
                            .map(|raw| Arc::<str>::from(demangle(&raw)));
                        added += NAME_OVERHEAD_BYTES + name.as_ref().map_or(0, |n| n.len() as u64);
                        slot.insert(name).clone()
                    }
                }
            })
            .collect();
        held.bytes = held.bytes.saturating_add(added);
        self.held_bytes = self.held_bytes.saturating_add(added);
        Ok(names)
    }

    /// Drops the least recently used objects until `incoming` more bytes fit.
    fn make_room(&mut self, incoming: u64) {
        while !self.held.is_empty() && self.held_bytes.saturating_add(incoming) > self.budget_bytes
        {
            let Some(oldest) = self
                .held
                .iter()
                .min_by_key(|(_, held)| held.last_window)
                .map(|(identity, _)| *identity)
            else {
                return;
            };
            self.drop_object(&oldest);
            self.evictions += 1;
        }
    }

    fn drop_object(&mut self, identity: &FileIdentity) {
        if let Some(held) = self.held.remove(identity) {
            self.held_bytes = self.held_bytes.saturating_sub(held.bytes);
        }
    }

    /// Ends a window: objects without lookups in the last [`IDLE_WINDOWS`]
    /// windows are dropped, and so is the oldest when names read this
    /// window took the total past the budget.
    pub fn end_window(&mut self) {
        let keep_since = self.window.saturating_sub(IDLE_WINDOWS - 1);
        let idle: Vec<FileIdentity> = self
            .held
            .iter()
            .filter(|(_, held)| held.last_window < keep_since)
            .map(|(identity, _)| *identity)
            .collect();
        for identity in &idle {
            self.drop_object(identity);
        }
        if self.held.len() > 1 {
            self.make_room(0);
        }
        self.window += 1;
    }

    /// Drops every object.
    pub fn clear(&mut self) {
        self.held.clear();
        self.held_bytes = 0;
    }

    /// Bytes of indexes and names held now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Indexes built since start (each a full read of an object's tables).
    pub fn loads(&self) -> u64 {
        self.loads
    }

    /// Objects dropped for the budget since start.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

/// A symbol's name as people read it: Rust (legacy and v0, without the
/// hash) or C++ demangled, else as it is (C, or a name neither scheme
/// parses). Rust is tried first: a legacy Rust name is also valid C++.
pub fn demangle(raw: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(raw) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(raw)
        .ok()
        .and_then(|symbol| symbol.demangle().ok())
        .unwrap_or_else(|| raw.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc_maps::MappingKind;
    use crate::process_info::{ProcessTable, boottime_ns_to_ticks, parse_stat_start_ticks};

    #[inline(never)]
    fn kiln_held_marker() -> u64 {
        std::hint::black_box(11)
    }

    /// Two distinct ELF objects this test process maps (itself first, then
    /// a library), opened as the agent opens them.
    fn two_objects() -> Vec<Arc<MappedFile>> {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("own stat");
        let ticks = parse_stat_start_ticks(&stat).expect("start time");
        // SAFETY: sysconf only reads a configuration value.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("positive");
        let ns = ticks * (1_000_000_000 / hz);
        assert_eq!(boottime_ns_to_ticks(ns, hz), ticks);
        let mut table = ProcessTable::new(8, 64);
        let snapshot = table
            .refresh(std::process::id(), ns)
            .expect("own process readable");
        let mut objects: Vec<Arc<MappedFile>> = Vec::new();
        for (entry, file) in snapshot.maps.iter().zip(&snapshot.files) {
            if let (MappingKind::File { .. }, Some(file)) = (&entry.kind, file)
                && entry.executable
                && !objects.iter().any(|o| o.identity == file.identity)
            {
                objects.push(Arc::clone(file));
            }
        }
        assert!(objects.len() >= 2, "this test maps itself and libc");
        objects.truncate(2);
        objects
    }

    /// The file offset of `kiln_held_marker` in the test binary.
    fn marker_offset() -> u64 {
        let address = kiln_held_marker as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("own maps");
        let maps = crate::proc_maps::parse_executable_maps(&maps).expect("parse");
        let index = crate::proc_maps::find_mapping(&maps, address).expect("mapped");
        maps[index].file_offset_of(address)
    }

    #[test]
    fn an_object_is_indexed_once_while_it_is_looked_up() {
        let objects = two_objects();
        let mut held = SymbolObjects::new(u64::MAX);
        for _ in 0..5 {
            held.names(objects[0].identity, &objects[0], u64::MAX, &[0])
                .expect("indexed");
            held.end_window();
        }
        assert_eq!(held.loads(), 1);
        assert!(held.held_bytes() > 0);
        // Idle for longer than IDLE_WINDOWS: dropped, and indexed again.
        for _ in 0..=IDLE_WINDOWS {
            held.end_window();
        }
        assert_eq!(held.held_bytes(), 0);
        held.names(objects[0].identity, &objects[0], u64::MAX, &[0])
            .expect("indexed");
        assert_eq!(held.loads(), 2);
    }

    #[test]
    fn offsets_in_one_function_share_its_demangled_name() {
        assert_eq!(kiln_held_marker(), 11);
        let objects = two_objects();
        let offset = marker_offset();
        let mut held = SymbolObjects::new(u64::MAX);
        let names = held
            .names(
                objects[0].identity,
                &objects[0],
                u64::MAX,
                &[offset, offset + 1],
            )
            .expect("indexed");
        let first = names[0].as_ref().expect("named");
        assert!(first.ends_with("kiln_held_marker"), "demangled: {first}");
        assert!(!first.contains("::h"), "without the hash: {first}");
        let second = names[1].as_ref().expect("named");
        assert!(Arc::ptr_eq(first, second), "one allocation for both");
        assert!(matches!(
            held.names(objects[1].identity, &objects[1], 1, &[0]),
            Err(ElfSymbolsError::TooLarge { .. })
        ));
    }

    #[test]
    fn the_least_recently_used_object_makes_room() {
        let objects = two_objects();
        let mut held = SymbolObjects::new(u64::MAX);
        held.names(objects[0].identity, &objects[0], u64::MAX, &[])
            .expect("indexed");
        let first = held.held_bytes();
        held.names(objects[1].identity, &objects[1], u64::MAX, &[])
            .expect("indexed");
        let second = held.held_bytes() - first;
        // A budget that holds either object but not both.
        let mut held = SymbolObjects::new(first.max(second));
        held.names(objects[0].identity, &objects[0], u64::MAX, &[])
            .expect("indexed");
        held.end_window();
        held.names(objects[1].identity, &objects[1], u64::MAX, &[])
            .expect("indexed");
        assert_eq!(held.evictions(), 1);
        assert_eq!(held.held.len(), 1);
        assert!(held.held.contains_key(&objects[1].identity));
        // Looked up again while held: not indexed again.
        held.names(objects[1].identity, &objects[1], u64::MAX, &[])
            .expect("held");
        assert_eq!(held.loads(), 2);
    }

    #[test]
    fn rust_and_cpp_names_are_demangled_and_c_names_kept() {
        assert_eq!(
            demangle("_ZN4kiln5agent3run17h0123456789abcdefE"),
            "kiln::agent::run"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("lzma_code"), "lzma_code");
    }
}
