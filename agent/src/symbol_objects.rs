//! ELF objects' symbol tables, ready to be looked up, kept from one window
//! to the next by file identity within a byte budget.
//!
//! Naming a file offset takes a sealed copy of the object's symbol tables
//! (`elf_symbols::symbolization_copy`) and an address index blazesym sorts
//! over every symbol. For a compiler's shared library (rustc's
//! `librustc_driver` and `libLLVM`, about 27 MB of tables each) that is the
//! agent's largest cost on a node that builds: every new compiler process
//! samples offsets never named before, and making the copy and the index
//! again in each window cost more than everything else the agent does.
//! Each object here has a blazesym symbolizer of its own, so one object
//! can be dropped without the others; objects idle for a window are
//! dropped, and the least recently used ones go first when a new copy would
//! not fit the budget.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;

use blazesym::symbolize as blaze;

use crate::elf_symbols::ElfCopyError;
use crate::process_info::{FileIdentity, MappedFile};

/// One object's sealed copy and the symbolizer that has read it.
#[derive(Debug)]
struct HeldObject {
    symbolizer: blaze::Symbolizer,
    copy: File,
    /// Allocated bytes of the (sparse) copy.
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
    /// Copies made (each one a full read and index of an object's tables).
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

impl SymbolObjects {
    /// Holds at most `budget_bytes` of copies (one larger copy is still
    /// held alone, so that it can be looked up at all).
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

    /// The symbolizer for `file` and the `/proc/self/fd/N` path of its
    /// copy, which it keys its state by. The copy is made on first use,
    /// with at most `max_copy_bytes`.
    pub fn get(
        &mut self,
        identity: FileIdentity,
        file: &MappedFile,
        max_copy_bytes: u64,
    ) -> Result<(&blaze::Symbolizer, PathBuf), ElfCopyError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let window = self.window;
        let fresh = if self.held.contains_key(&identity) {
            None
        } else {
            let copy = crate::elf_symbols::symbolization_copy(&file.file, max_copy_bytes)?;
            // The copy is sparse: its allocated blocks are what it costs.
            let bytes = copy
                .metadata()
                .map_or(0, |m| m.blocks().saturating_mul(512));
            self.make_room(bytes);
            self.loads += 1;
            self.held_bytes = self.held_bytes.saturating_add(bytes);
            Some(HeldObject {
                symbolizer: new_symbolizer(),
                copy,
                bytes,
                last_window: window,
            })
        };
        let held = match fresh {
            Some(object) => self.held.entry(identity).or_insert(object),
            // Present: checked above, and nothing was dropped since.
            None => self.held.get_mut(&identity).ok_or(ElfCopyError::NotElf)?,
        };
        held.last_window = window;
        let path = PathBuf::from(format!("/proc/self/fd/{}", held.copy.as_raw_fd()));
        Ok((&held.symbolizer, path))
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
    /// windows are dropped.
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
        self.window += 1;
    }

    /// Drops every object.
    pub fn clear(&mut self) {
        self.held.clear();
        self.held_bytes = 0;
    }

    /// Bytes of copies held now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Copies made since start (each a full read and index of an object).
    pub fn loads(&self) -> u64 {
        self.loads
    }

    /// Objects dropped for the budget since start.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

/// A blazesym symbolizer for ELF symbols only, names demangled.
pub fn new_symbolizer() -> blaze::Symbolizer {
    blaze::Symbolizer::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_demangling(true)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc_maps::MappingKind;
    use crate::process_info::{ProcessTable, boottime_ns_to_ticks, parse_stat_start_ticks};
    use std::sync::Arc;

    /// Two distinct ELF objects this test process maps (itself and a
    /// library), opened as the agent opens them.
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

    #[test]
    fn an_object_is_copied_once_while_it_is_looked_up() {
        let objects = two_objects();
        let mut held = SymbolObjects::new(u64::MAX);
        for _ in 0..5 {
            held.get(objects[0].identity, &objects[0], u64::MAX)
                .expect("copied");
            held.end_window();
        }
        assert_eq!(held.loads(), 1);
        assert!(held.held_bytes() > 0);
        // Idle for longer than IDLE_WINDOWS: dropped, and copied again.
        for _ in 0..=IDLE_WINDOWS {
            held.end_window();
        }
        assert_eq!(held.held_bytes(), 0);
        held.get(objects[0].identity, &objects[0], u64::MAX)
            .expect("copied");
        assert_eq!(held.loads(), 2);
    }

    #[test]
    fn the_least_recently_used_object_makes_room() {
        let objects = two_objects();
        let mut held = SymbolObjects::new(u64::MAX);
        held.get(objects[0].identity, &objects[0], u64::MAX)
            .expect("copied");
        let first = held.held_bytes();
        // A budget that holds either object but not both.
        let mut held = SymbolObjects::new(first);
        held.get(objects[0].identity, &objects[0], u64::MAX)
            .expect("copied");
        held.end_window();
        held.get(objects[1].identity, &objects[1], u64::MAX)
            .expect("copied");
        assert_eq!(held.evictions(), 1);
        assert_eq!(held.held.len(), 1);
        assert!(held.held.contains_key(&objects[1].identity));
        // Looked up again while held: not copied again.
        held.get(objects[1].identity, &objects[1], u64::MAX)
            .expect("held");
        assert_eq!(held.loads(), 2);
    }
}
