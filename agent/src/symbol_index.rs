//! A compact address index over one ELF object's code symbols (pure).
//!
//! Each symbol is twelve bytes: its start (from the object's lowest load
//! address), its size, and where its name lies in its string table. Names
//! stay in the file and are read only for the symbols a lookup finds
//! (`elf_symbols::read_symbol_name`). Holding an index across windows then
//! costs a fraction of the object's tables: rustc's `librustc_driver` has
//! 3.97 MB of `.symtab` and 19.7 MB of `.strtab`, and an index of about
//! 2 MB; the sealed copy blazesym needed kept every page of the symbol
//! table and each touched page of the strings resident (issue 48).
//!
//! Lookups answer as blazesym's ELF resolver did, so that names do not
//! change with the index: `.symtab` first, then `.dynsym`; among the
//! symbols with the greatest start at or below the address (the largest
//! first), the first that covers it. A sizeless symbol covers what follows
//! it in `.symtab`, but only its own address in `.dynsym`, which is too
//! sparse for that guess.

/// Which of an object's symbol tables a symbol comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SymbolTableKind {
    /// `.symtab`, which strip removes; for a stripped Go binary, the
    /// functions of its `.gopclntab` (see `go_pclntab`).
    Full,
    /// `.dynsym`, the exported symbols.
    Dynamic,
}

/// One symbol as read from a table, before it is indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSymbol {
    /// `st_name`: the name's offset in the table's string table.
    pub name: u32,
    /// `st_info`.
    pub info: u8,
    /// `st_shndx`.
    pub section: u16,
    /// `st_value`: the stated address.
    pub address: u64,
    /// `st_size`.
    pub size: u64,
}

impl RawSymbol {
    /// Whether the symbol can name code: a defined function, ifunc or
    /// untyped label. Data symbols are left out (they never cover a
    /// sampled pc, and are most of some tables).
    pub fn names_code(&self) -> bool {
        const STT_NOTYPE: u8 = 0;
        const STT_FUNC: u8 = 2;
        const STT_GNU_IFUNC: u8 = 10;
        const SHN_UNDEF: u16 = 0;
        let kind = self.info & 0xf;
        self.section != SHN_UNDEF && matches!(kind, STT_NOTYPE | STT_FUNC | STT_GNU_IFUNC)
    }
}

/// Twelve bytes a symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// Start, from the index's base.
    start: u32,
    /// Size, 0 when unknown (sizes past 4 GiB are cut to it).
    size: u32,
    /// Offset of the name in the table's string table.
    name: u32,
}

/// One table's entries, sorted by start, the largest first among equal starts.
#[derive(Debug, Default)]
struct Table {
    entries: Box<[Entry]>,
    /// File offset and size of the table's string table.
    strings: (u64, u64),
}

impl Table {
    /// The position of the entry covering `address` (see the module docs).
    fn find(&self, address: u32, sizeless_covers_following: bool) -> Option<usize> {
        let after = self.entries.partition_point(|e| e.start <= address);
        let last = after.checked_sub(1)?;
        let start = self.entries[last].start;
        let first = self.entries[..last].partition_point(|e| e.start < start);
        (first..after).find(|&i| {
            let entry = self.entries[i];
            if entry.size == 0 {
                sizeless_covers_following || entry.start == address
            } else {
                address - entry.start < entry.size
            }
        })
    }
}

/// Where the name of a found symbol lies in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FoundSymbol {
    /// The table it comes from.
    pub table: SymbolTableKind,
    /// Its position in the index: the same symbol is found at the same
    /// position, so a name read once can be shared by every offset in it.
    pub position: u32,
    /// File offset of the first byte of its name.
    pub name_offset: u64,
    /// Bytes from there to the end of its string table: a name is no
    /// longer (a missing terminator ends the read there).
    pub name_limit: u64,
}

/// An object's code symbols by address; see the module docs.
#[derive(Debug, Default)]
pub struct SymbolIndex {
    /// `PT_LOAD` segments as (file offset, file size, stated address).
    loads: Box<[(u64, u64, u64)]>,
    /// The lowest stated address of a load segment; starts count from it.
    base: u64,
    full: Table,
    dynamic: Table,
}

/// Builds a [`SymbolIndex`] one table at a time.
#[derive(Debug)]
pub struct SymbolIndexBuilder {
    index: SymbolIndex,
    full: Vec<Entry>,
    dynamic: Vec<Entry>,
}

impl SymbolIndexBuilder {
    /// A builder for an object with these `PT_LOAD` segments, each as
    /// (file offset, file size, stated address).
    pub fn new(loads: Vec<(u64, u64, u64)>) -> SymbolIndexBuilder {
        let base = loads
            .iter()
            .map(|&(_, _, address)| address)
            .min()
            .unwrap_or(0);
        SymbolIndexBuilder {
            index: SymbolIndex {
                loads: loads.into_boxed_slice(),
                base,
                ..SymbolIndex::default()
            },
            full: Vec::new(),
            dynamic: Vec::new(),
        }
    }

    /// Says where `table`'s string table lies and how many symbols it has
    /// (room is made for them at once, so the table is not copied as it grows).
    pub fn start_table(&mut self, table: SymbolTableKind, strings: (u64, u64), symbols: usize) {
        let (index_table, entries) = self.table_mut(table);
        index_table.strings = strings;
        entries.reserve_exact(symbols);
    }

    /// Adds one symbol of `table` if it names code within 4 GiB of the
    /// object's base (any code a process maps is).
    pub fn add(&mut self, table: SymbolTableKind, symbol: RawSymbol) {
        if !symbol.names_code() {
            return;
        }
        let Some(start) = symbol
            .address
            .checked_sub(self.index.base)
            .and_then(|start| u32::try_from(start).ok())
        else {
            return;
        };
        let size = u32::try_from(symbol.size).unwrap_or(u32::MAX);
        let (_, entries) = self.table_mut(table);
        entries.push(Entry {
            start,
            size,
            name: symbol.name,
        });
    }

    /// The index, its tables sorted.
    pub fn finish(self) -> SymbolIndex {
        let SymbolIndexBuilder {
            mut index,
            full,
            dynamic,
        } = self;
        index.full.entries = sorted(full);
        index.dynamic.entries = sorted(dynamic);
        index
    }

    fn table_mut(&mut self, table: SymbolTableKind) -> (&mut Table, &mut Vec<Entry>) {
        match table {
            SymbolTableKind::Full => (&mut self.index.full, &mut self.full),
            SymbolTableKind::Dynamic => (&mut self.index.dynamic, &mut self.dynamic),
        }
    }
}

fn sorted(mut entries: Vec<Entry>) -> Box<[Entry]> {
    entries.sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
    entries.into_boxed_slice()
}

impl SymbolIndex {
    /// The stated address of a file offset, through the load segment
    /// holding it (the first, as blazesym took it).
    pub fn stated_address(&self, file_offset: u64) -> Option<u64> {
        self.loads.iter().find_map(|&(offset, size, address)| {
            (offset <= file_offset && file_offset - offset < size)
                .then(|| address.wrapping_add(file_offset - offset))
        })
    }

    /// The symbol covering `file_offset`, if any.
    pub fn find(&self, file_offset: u64) -> Option<FoundSymbol> {
        let address = self.stated_address(file_offset)?;
        let relative = u32::try_from(address.checked_sub(self.base)?).ok()?;
        let (table, kind, position) = match self.full.find(relative, true) {
            Some(position) => (&self.full, SymbolTableKind::Full, position),
            None => (
                &self.dynamic,
                SymbolTableKind::Dynamic,
                self.dynamic.find(relative, false)?,
            ),
        };
        let name = u64::from(table.entries[position].name);
        let (strings_offset, strings_size) = table.strings;
        if name >= strings_size {
            return None;
        }
        Some(FoundSymbol {
            table: kind,
            position: u32::try_from(position).ok()?,
            name_offset: strings_offset.saturating_add(name),
            name_limit: strings_size - name,
        })
    }

    /// Symbols indexed, in both tables.
    pub fn len(&self) -> usize {
        self.full.entries.len() + self.dynamic.entries.len()
    }

    /// Whether no symbol is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes the index holds.
    pub fn held_bytes(&self) -> u64 {
        (self.len() * size_of::<Entry>() + self.loads.len() * size_of::<(u64, u64, u64)>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FUNC: u8 = 2;
    const OBJECT: u8 = 1;

    fn symbol(name: u32, address: u64, size: u64) -> RawSymbol {
        RawSymbol {
            name,
            info: FUNC,
            section: 1,
            address,
            size,
        }
    }

    /// Text at file offset 0x1000, stated address 0x401000.
    fn text_object() -> SymbolIndexBuilder {
        SymbolIndexBuilder::new(vec![(0, 0x1000, 0x400000), (0x1000, 0x4000, 0x401000)])
    }

    #[test]
    fn a_file_offset_finds_the_symbol_covering_its_stated_address() {
        let mut builder = text_object();
        builder.start_table(SymbolTableKind::Full, (0x9000, 100), 3);
        builder.add(SymbolTableKind::Full, symbol(20, 0x401100, 0x80));
        builder.add(SymbolTableKind::Full, symbol(10, 0x401000, 0x100));
        builder.add(SymbolTableKind::Full, symbol(30, 0x401200, 0x10));
        let index = builder.finish();
        let found = index.find(0x1150).expect("in the second symbol");
        assert_eq!(found.name_offset, 0x9000 + 20);
        assert_eq!(found.name_limit, 80);
        assert_eq!(found.table, SymbolTableKind::Full);
        assert_eq!(index.find(0x1000).map(|f| f.name_offset), Some(0x9000 + 10));
        // Past the end of the nearest symbol below: no name, not an older one.
        assert_eq!(index.find(0x1190), None);
        assert_eq!(index.find(0x1210), None);
        // Outside every load segment.
        assert_eq!(index.find(0x9000), None);
        assert_eq!(index.len(), 3);
        assert_eq!(index.held_bytes(), 3 * 12 + 2 * 24);
    }

    #[test]
    fn the_largest_of_symbols_at_one_address_is_found_first_and_a_smaller_one_when_it_alone_covers()
    {
        let mut builder = text_object();
        builder.start_table(SymbolTableKind::Full, (0, 100), 2);
        builder.add(SymbolTableKind::Full, symbol(1, 0x401000, 0x10));
        builder.add(SymbolTableKind::Full, symbol(2, 0x401000, 0x40));
        let index = builder.finish();
        assert_eq!(index.find(0x1008).map(|f| f.name_offset), Some(2));
        assert_eq!(index.find(0x1030).map(|f| f.name_offset), Some(2));
        let position = index.find(0x1008).map(|f| f.position);
        assert_eq!(index.find(0x1030).map(|f| f.position), position);
    }

    #[test]
    fn sizeless_symbols_cover_what_follows_in_symtab_and_only_themselves_in_dynsym() {
        let mut builder = text_object();
        builder.start_table(SymbolTableKind::Dynamic, (0x100, 50), 1);
        builder.add(SymbolTableKind::Dynamic, symbol(5, 0x402000, 0));
        let index = builder.finish();
        assert_eq!(
            index.find(0x2000).map(|f| f.table),
            Some(SymbolTableKind::Dynamic)
        );
        assert_eq!(index.find(0x2004), None);

        let mut builder = text_object();
        builder.start_table(SymbolTableKind::Full, (0x100, 50), 1);
        builder.add(SymbolTableKind::Full, symbol(5, 0x402000, 0));
        let index = builder.finish();
        assert_eq!(index.find(0x2004).map(|f| f.name_offset), Some(0x105));
    }

    #[test]
    fn symtab_is_asked_first_and_dynsym_where_it_has_nothing() {
        let mut builder = text_object();
        builder.start_table(SymbolTableKind::Full, (0x100, 50), 1);
        builder.start_table(SymbolTableKind::Dynamic, (0x200, 50), 2);
        builder.add(SymbolTableKind::Full, symbol(1, 0x401000, 0x10));
        builder.add(SymbolTableKind::Dynamic, symbol(2, 0x401000, 0x10));
        builder.add(SymbolTableKind::Dynamic, symbol(3, 0x401800, 0x10));
        let index = builder.finish();
        assert_eq!(index.find(0x1004).map(|f| f.name_offset), Some(0x101));
        assert_eq!(index.find(0x1804).map(|f| f.name_offset), Some(0x203));
    }

    #[test]
    fn data_undefined_and_out_of_range_symbols_are_not_indexed() {
        let mut builder = text_object();
        builder.start_table(SymbolTableKind::Full, (0, 100), 4);
        builder.add(
            SymbolTableKind::Full,
            RawSymbol {
                info: OBJECT,
                ..symbol(1, 0x401000, 0x100)
            },
        );
        builder.add(
            SymbolTableKind::Full,
            RawSymbol {
                section: 0,
                ..symbol(2, 0x401000, 0x100)
            },
        );
        builder.add(SymbolTableKind::Full, symbol(3, 0x3000, 0x100));
        builder.add(
            SymbolTableKind::Full,
            symbol(4, 0x400000 + (1 << 33), 0x100),
        );
        let index = builder.finish();
        assert!(index.is_empty());
        assert_eq!(index.find(0x1010), None);
    }

    #[test]
    fn a_name_offset_past_its_string_table_is_no_symbol() {
        let mut builder = text_object();
        builder.start_table(SymbolTableKind::Full, (0x100, 8), 1);
        builder.add(SymbolTableKind::Full, symbol(8, 0x401000, 0x10));
        assert_eq!(builder.finish().find(0x1000), None);
    }
}
