//! Java method names from HotSpot's metadata: `Method` → `ConstMethod` →
//! constant pool → `Symbol`s for the name and signature, the pool's
//! holder `Klass` → its name; the line of a bytecode index from the
//! method's compressed line number table. Methods can be unloaded under
//! the agent: every pointer is read checked, and a failed read is `None`.

use super::layout::JvmLayout;
use super::vmstructs::{RemoteMemory, read_u16, read_u32, read_u64};

/// Longest symbol read (class names with packages, signatures).
const MAX_SYMBOL_BYTES: u16 = 1024;
/// Bytes of a line number table read at most.
const MAX_LINE_TABLE_BYTES: usize = 4096;

/// A method's name, class and source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodName {
    /// `com.example.Main.hot(I)J`.
    pub function: String,
    /// The source file's name (`Main.java`), empty when unknown.
    pub file: String,
}

/// What a `Method*` names, or `None` when any read fails or the metadata
/// is inconsistent.
pub fn read_method(
    memory: &dyn RemoteMemory,
    layout: &JvmLayout,
    method: u64,
) -> Option<MethodName> {
    let const_method = pointer(memory, method.wrapping_add(layout.method_const_method))?;
    let pool = pointer(
        memory,
        const_method.wrapping_add(layout.const_method_constants),
    )?;
    let pool_length = read_u32(memory, pool.wrapping_add(layout.pool_length)).ok()?;
    let symbol_at = |index: u16| -> Option<String> {
        if u32::from(index) >= pool_length || index == 0 {
            return None;
        }
        let symbol = pointer(
            memory,
            pool.wrapping_add(layout.pool_size)
                .wrapping_add(u64::from(index) * 8),
        )?;
        read_symbol(memory, layout, symbol)
    };
    let name = symbol_at(
        read_u16(
            memory,
            const_method.wrapping_add(layout.const_method_name_index),
        )
        .ok()?,
    )?;
    let signature = symbol_at(
        read_u16(
            memory,
            const_method.wrapping_add(layout.const_method_signature_index),
        )
        .ok()?,
    )?;
    let holder = pointer(memory, pool.wrapping_add(layout.pool_holder))?;
    let class = read_symbol(
        memory,
        layout,
        pointer(memory, holder.wrapping_add(layout.klass_name))?,
    )?;
    let file = layout
        .pool_source_file_index
        .and_then(|offset| read_u16(memory, pool.wrapping_add(offset)).ok())
        .and_then(symbol_at)
        .unwrap_or_default();
    Some(MethodName {
        function: format!("{}.{name}{signature}", class.replace('/', ".")),
        file,
    })
}

/// A `Symbol`'s text.
fn read_symbol(memory: &dyn RemoteMemory, layout: &JvmLayout, symbol: u64) -> Option<String> {
    let length = read_u16(memory, symbol.wrapping_add(layout.symbol_length)).ok()?;
    if length == 0 || length > MAX_SYMBOL_BYTES {
        return None;
    }
    let mut bytes = vec![0u8; usize::from(length)];
    memory
        .read(symbol.wrapping_add(layout.symbol_body), &mut bytes)
        .ok()?;
    // Modified UTF-8; names in practice are plain UTF-8.
    String::from_utf8(bytes).ok()
}

/// A non-null, 8-byte-aligned pointer read at `address`.
fn pointer(memory: &dyn RemoteMemory, address: u64) -> Option<u64> {
    read_u64(memory, address)
        .ok()
        .filter(|&p| p != 0 && p % 8 == 0)
}

/// The bytecode index of `bcp` in `method`, checked: it points into the
/// method's bytecodes.
pub fn bytecode_index(
    memory: &dyn RemoteMemory,
    layout: &JvmLayout,
    method: u64,
    bcp: u64,
) -> Option<u32> {
    let const_method = pointer(memory, method.wrapping_add(layout.method_const_method))?;
    let code_size = read_u16(
        memory,
        const_method.wrapping_add(layout.const_method_code_size),
    )
    .ok()?;
    let codes = const_method.wrapping_add(layout.const_method_size);
    let index = bcp.checked_sub(codes)?;
    (index < u64::from(code_size)).then_some(index as u32)
}

/// The source line of bytecode `bci` of `method`; 0 when the method has no
/// line table or it cannot be read.
pub fn line_of(memory: &dyn RemoteMemory, layout: &JvmLayout, method: u64, bci: u32) -> u32 {
    read_line(memory, layout, method, bci).unwrap_or(0)
}

fn read_line(memory: &dyn RemoteMemory, layout: &JvmLayout, method: u64, bci: u32) -> Option<u32> {
    let flag = layout.has_line_number_table?;
    let const_method = pointer(memory, method.wrapping_add(layout.method_const_method))?;
    let flags = super::code_cache::read_signed(memory, const_method, layout.const_method_flags?)?;
    if flags & i64::from(flag) == 0 {
        return None;
    }
    let code_size = read_u16(
        memory,
        const_method.wrapping_add(layout.const_method_code_size),
    )
    .ok()?;
    let table = const_method
        .wrapping_add(layout.const_method_size)
        .wrapping_add(u64::from(code_size));
    // The table's length is only known by decoding it: read up to the cap,
    // less if that crosses into an unreadable page.
    let mut bytes = vec![0u8; MAX_LINE_TABLE_BYTES];
    let readable = [MAX_LINE_TABLE_BYTES, 512, 64]
        .into_iter()
        .find(|&len| memory.read(table, &mut bytes[..len]).is_ok())?;
    bytes.truncate(readable);
    Some(line_in_table(&bytes, bci))
}

/// The line of `bci` in a compressed line number table (HotSpot's
/// `CompressedLineNumberReadStream`): pairs of (bytecode index delta, line
/// delta), one byte `bci_delta << 3 | line_delta` when they fit, else 0xFF
/// and two zigzag-coded UNSIGNED5 numbers; a 0 byte ends the table. The
/// line of the last pair at or before `bci`.
pub fn line_in_table(table: &[u8], bci: u32) -> u32 {
    let mut reader = Unsigned5 {
        bytes: table,
        at: 0,
        excluded: 0,
    };
    let (mut pair_bci, mut line) = (0i64, 0i64);
    let mut found = 0i64;
    while let Some(byte) = reader.byte() {
        if byte == 0 {
            break;
        }
        if byte == 0xFF {
            let (Some(b), Some(l)) = (reader.signed(), reader.signed()) else {
                break;
            };
            pair_bci += b;
            line += l;
        } else {
            pair_bci += i64::from(byte >> 3);
            line += i64::from(byte & 7);
        }
        if pair_bci > i64::from(bci) {
            break;
        }
        found = line;
    }
    u32::try_from(found).unwrap_or(0)
}

/// A reader of HotSpot's compressed streams.
#[derive(Debug)]
pub struct Unsigned5<'a> {
    pub bytes: &'a [u8],
    pub at: usize,
    /// Added to every byte so none is 0: 1 in the scopes of JDK 21 and
    /// later, 0 before.
    pub excluded: u8,
}

impl Unsigned5<'_> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    /// HotSpot's UNSIGNED5: bytes below 192 end a number; each earlier
    /// byte adds `(b - 192)` scaled by 64^i; at most 5 bytes.
    pub fn unsigned(&mut self) -> Option<u32> {
        let mut value: u64 = 0;
        let mut scale: u64 = 1;
        let low = 192 - u64::from(self.excluded);
        for i in 0..5 {
            let byte = u64::from(self.byte()?.checked_sub(self.excluded)?);
            value += byte * scale;
            if byte < low || i == 4 {
                return u32::try_from(value).ok();
            }
            scale *= 64;
        }
        None
    }

    fn signed(&mut self) -> Option<i64> {
        let value = self.unsigned()?;
        Some(i64::from((value >> 1) as i32 ^ -((value & 1) as i32)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_come_from_short_and_long_pairs() {
        // bci 0 → line 3, bci 4 → line 5, then a long pair: bci +40 (80,
        // zigzag), line +100 (200 is two bytes: 200 = 192 + 8, then 0).
        let table = [3u8, (4 << 3) | 2, 0xFF, 80, 200, 0, 0];
        assert_eq!(line_in_table(&table, 0), 3);
        assert_eq!(line_in_table(&table, 3), 3);
        assert_eq!(line_in_table(&table, 4), 5);
        assert_eq!(line_in_table(&table, 43), 5);
        assert_eq!(line_in_table(&table, 44), 105);
        assert_eq!(line_in_table(&[], 7), 0);
        // A truncated long pair ends the table.
        assert_eq!(line_in_table(&[3, 0xFF, 200], 9), 3);
    }
}
