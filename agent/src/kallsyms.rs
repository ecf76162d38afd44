//! Kernel symbolization from `/proc/kallsyms` (pure once the text is read).

/// Sorted kernel text symbols, stored compactly: one string holding every
/// name, and `(address, name offset, name length)` per symbol (about 4 MB
/// for a distribution kernel instead of a heap allocation per name).
#[derive(Debug, Clone, Default)]
pub struct KernelSymbols {
    names: String,
    symbols: Vec<(u64, u32, u32)>,
}

impl KernelSymbols {
    /// Parses kallsyms text, keeping text symbols (`t`/`T`/`w`/`W`) with a
    /// non-zero address. Zero addresses mean `kptr_restrict` hides them.
    pub fn parse(text: &str) -> KernelSymbols {
        Self::parse_lines(text.lines())
    }

    /// Reads `/proc/kallsyms` line by line (never the whole file at once).
    pub fn read(reader: impl std::io::BufRead) -> std::io::Result<KernelSymbols> {
        let mut lines = Vec::new();
        let mut symbols = KernelSymbols::default();
        for line in reader.lines() {
            lines.push(line?);
            if lines.len() == 4096 {
                symbols.extend(lines.iter().map(String::as_str));
                lines.clear();
            }
        }
        symbols.extend(lines.iter().map(String::as_str));
        symbols.finish();
        Ok(symbols)
    }

    fn parse_lines<'a>(lines: impl Iterator<Item = &'a str>) -> KernelSymbols {
        let mut symbols = KernelSymbols::default();
        symbols.extend(lines);
        symbols.finish();
        symbols
    }

    fn extend<'a>(&mut self, lines: impl Iterator<Item = &'a str>) {
        for line in lines {
            let mut fields = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if !matches!(kind, "t" | "T" | "w" | "W") || addr == 0 {
                continue;
            }
            let (Ok(offset), Ok(len)) =
                (u32::try_from(self.names.len()), u32::try_from(name.len()))
            else {
                continue;
            };
            self.names.push_str(name);
            self.symbols.push((addr, offset, len));
        }
    }

    fn finish(&mut self) {
        self.symbols.sort_by_key(|&(addr, _, _)| addr);
        self.symbols.shrink_to_fit();
        self.names.shrink_to_fit();
    }

    /// Number of symbols; 0 when addresses are hidden.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether no symbol is known.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The symbol containing `addr`: the closest one at or below it.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let index = self
            .symbols
            .partition_point(|&(start, _, _)| start <= addr)
            .checked_sub(1)?;
        let (_, offset, len) = self.symbols[index];
        self.names
            .get(offset as usize..(offset as usize + len as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_the_enclosing_text_symbol() {
        let symbols = KernelSymbols::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81000100 t do_syscall_64\n\
             ffffffff81000200 D some_data\n\
             ffffffff81000300 T __x64_sys_getpid\t[kernel]\n\
             garbage\n",
        );
        assert_eq!(symbols.len(), 3);
        assert_eq!(symbols.lookup(0xffffffff81000150), Some("do_syscall_64"));
        assert_eq!(symbols.lookup(0xffffffff81000250), Some("do_syscall_64"));
        assert_eq!(symbols.lookup(0xffffffff81000300), Some("__x64_sys_getpid"));
        assert_eq!(symbols.lookup(0x10), None);
    }

    #[test]
    fn reading_in_chunks_matches_parsing_at_once() {
        let text: String = (0..10_000)
            .map(|i| format!("{:016x} T sym_{i}\n", 0xffff_0000_0000_0000u64 + i * 16))
            .collect();
        let read = KernelSymbols::read(text.as_bytes()).expect("in-memory read");
        assert_eq!(read.len(), 10_000);
        assert_eq!(
            read.lookup(0xffff_0000_0000_0000 + 16 * 9_999 + 3),
            Some("sym_9999")
        );
    }

    #[test]
    fn hidden_addresses_yield_no_symbols() {
        let symbols = KernelSymbols::parse("0000000000000000 T _stext\n");
        assert!(symbols.is_empty());
    }
}
