//! HotSpot's own description of its data structures: the `gHotSpotVMStructs`
//! (fields), `gHotSpotVMTypes` (sizes) and `gHotSpotVMIntConstants` /
//! `gHotSpotVMLongConstants` tables that `libjvm.so` exports for debuggers
//! (the serviceability agent). Each table is an array of entries ending in
//! one whose name is null; where each member of an entry lies is itself
//! exported (`gHotSpotVMStructEntryTypeNameOffset`, …, and the array
//! stride), so nothing here depends on a JDK release.
//!
//! Reading is pure over [`RemoteMemory`]: tests build tables in memory.
//! Every count, stride and string is capped, so a forged table costs a
//! bounded number of reads and gives a [`VmStructsError`].

use std::collections::HashMap;

use crate::python::memory::{MemoryReadError, ProcessMemory};

/// Entries read per table at most (JDK 17 has about 2,600 fields).
pub const MAX_ENTRIES: usize = 20_000;
/// Longest name read (type names with templates are the longest, ~60).
pub const MAX_NAME_BYTES: usize = 256;
/// Largest entry stride accepted (JDK 17: 48 bytes for fields).
const MAX_STRIDE: u64 = 512;
/// Entries read per memory read.
const ENTRIES_PER_READ: usize = 128;

/// Memory of the process the tables are read from.
pub trait RemoteMemory {
    /// Fills `buffer` from `address`; a short read is an error.
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryReadError>;
}

impl RemoteMemory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryReadError> {
        ProcessMemory::read(self, address, buffer)
    }
}

/// Reads a little-endian u64.
pub fn read_u64(memory: &dyn RemoteMemory, address: u64) -> Result<u64, MemoryReadError> {
    let mut bytes = [0u8; 8];
    memory.read(address, &mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// Reads a little-endian u32.
pub fn read_u32(memory: &dyn RemoteMemory, address: u64) -> Result<u32, MemoryReadError> {
    let mut bytes = [0u8; 4];
    memory.read(address, &mut bytes)?;
    Ok(u32::from_le_bytes(bytes))
}

/// Reads a little-endian u16.
pub fn read_u16(memory: &dyn RemoteMemory, address: u64) -> Result<u16, MemoryReadError> {
    let mut bytes = [0u8; 2];
    memory.read(address, &mut bytes)?;
    Ok(u16::from_le_bytes(bytes))
}

/// Why the tables could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VmStructsError {
    /// A read of the process's memory failed.
    #[error("reading the VM tables failed: {0}")]
    Memory(#[from] MemoryReadError),
    /// The JVM has not filled in its tables yet (it is starting).
    #[error("the {table} table is not initialized yet")]
    NotInitialized {
        /// Which table.
        table: &'static str,
    },
    /// An entry layout that no HotSpot has: forged or corrupt.
    #[error("the {table} table's entry layout is invalid: {what}")]
    BadLayout {
        /// Which table.
        table: &'static str,
        /// What was wrong.
        what: String,
    },
    /// More entries than any HotSpot has.
    #[error("the {table} table has more than {MAX_ENTRIES} entries")]
    TooManyEntries {
        /// Which table.
        table: &'static str,
    },
    /// A name without its terminating NUL within [`MAX_NAME_BYTES`].
    #[error("a name in the {table} table at {address:#x} is too long or unterminated")]
    BadName {
        /// Which table.
        table: &'static str,
        /// Where the name starts.
        address: u64,
    },
    /// A field, type or constant the agent needs is missing.
    #[error("the VM tables have no {what}")]
    Missing {
        /// What, as `Type::field` or a type or constant name.
        what: String,
    },
}

impl VmStructsError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            VmStructsError::Memory(_) => "vmstructs_unreadable",
            VmStructsError::NotInitialized { .. } => "vmstructs_not_initialized",
            VmStructsError::BadLayout { .. }
            | VmStructsError::TooManyEntries { .. }
            | VmStructsError::BadName { .. } => "vmstructs_invalid",
            VmStructsError::Missing { .. } => "vmstructs_missing_entry",
        }
    }
}

/// Addresses (in the process) of the exported variables: each table's
/// pointer, and each entry member's offset and the stride.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportedSymbols {
    pub structs: u64,
    pub struct_type_name_offset: u64,
    pub struct_field_name_offset: u64,
    pub struct_type_string_offset: u64,
    pub struct_is_static_offset: u64,
    pub struct_offset_offset: u64,
    pub struct_address_offset: u64,
    pub struct_stride: u64,
    pub types: u64,
    pub type_name_offset: u64,
    pub type_size_offset: u64,
    pub type_stride: u64,
    pub int_constants: u64,
    pub int_name_offset: u64,
    pub int_value_offset: u64,
    pub int_stride: u64,
    pub long_constants: u64,
    pub long_name_offset: u64,
    pub long_value_offset: u64,
    pub long_stride: u64,
}

impl ExportedSymbols {
    /// Records the dynamic symbol `name` at `address` (already relocated);
    /// `false` for a symbol that is not one of the tables'.
    pub fn set(&mut self, name: &[u8], address: u64) -> bool {
        let slot = match name {
            b"gHotSpotVMStructs" => &mut self.structs,
            b"gHotSpotVMStructEntryTypeNameOffset" => &mut self.struct_type_name_offset,
            b"gHotSpotVMStructEntryFieldNameOffset" => &mut self.struct_field_name_offset,
            b"gHotSpotVMStructEntryTypeStringOffset" => &mut self.struct_type_string_offset,
            b"gHotSpotVMStructEntryIsStaticOffset" => &mut self.struct_is_static_offset,
            b"gHotSpotVMStructEntryOffsetOffset" => &mut self.struct_offset_offset,
            b"gHotSpotVMStructEntryAddressOffset" => &mut self.struct_address_offset,
            b"gHotSpotVMStructEntryArrayStride" => &mut self.struct_stride,
            b"gHotSpotVMTypes" => &mut self.types,
            b"gHotSpotVMTypeEntryTypeNameOffset" => &mut self.type_name_offset,
            b"gHotSpotVMTypeEntrySizeOffset" => &mut self.type_size_offset,
            b"gHotSpotVMTypeEntryArrayStride" => &mut self.type_stride,
            b"gHotSpotVMIntConstants" => &mut self.int_constants,
            b"gHotSpotVMIntConstantEntryNameOffset" => &mut self.int_name_offset,
            b"gHotSpotVMIntConstantEntryValueOffset" => &mut self.int_value_offset,
            b"gHotSpotVMIntConstantEntryArrayStride" => &mut self.int_stride,
            b"gHotSpotVMLongConstants" => &mut self.long_constants,
            b"gHotSpotVMLongConstantEntryNameOffset" => &mut self.long_name_offset,
            b"gHotSpotVMLongConstantEntryValueOffset" => &mut self.long_value_offset,
            b"gHotSpotVMLongConstantEntryArrayStride" => &mut self.long_stride,
            _ => return false,
        };
        *slot = address;
        true
    }

    /// The name of the first symbol not found, if any.
    pub fn first_missing(&self) -> Option<&'static str> {
        [
            (self.structs, "gHotSpotVMStructs"),
            (
                self.struct_type_name_offset,
                "gHotSpotVMStructEntryTypeNameOffset",
            ),
            (
                self.struct_field_name_offset,
                "gHotSpotVMStructEntryFieldNameOffset",
            ),
            (
                self.struct_type_string_offset,
                "gHotSpotVMStructEntryTypeStringOffset",
            ),
            (
                self.struct_is_static_offset,
                "gHotSpotVMStructEntryIsStaticOffset",
            ),
            (
                self.struct_offset_offset,
                "gHotSpotVMStructEntryOffsetOffset",
            ),
            (
                self.struct_address_offset,
                "gHotSpotVMStructEntryAddressOffset",
            ),
            (self.struct_stride, "gHotSpotVMStructEntryArrayStride"),
            (self.types, "gHotSpotVMTypes"),
            (self.type_name_offset, "gHotSpotVMTypeEntryTypeNameOffset"),
            (self.type_size_offset, "gHotSpotVMTypeEntrySizeOffset"),
            (self.type_stride, "gHotSpotVMTypeEntryArrayStride"),
            (self.int_constants, "gHotSpotVMIntConstants"),
            (self.int_name_offset, "gHotSpotVMIntConstantEntryNameOffset"),
            (
                self.int_value_offset,
                "gHotSpotVMIntConstantEntryValueOffset",
            ),
            (self.int_stride, "gHotSpotVMIntConstantEntryArrayStride"),
            (self.long_constants, "gHotSpotVMLongConstants"),
            (
                self.long_name_offset,
                "gHotSpotVMLongConstantEntryNameOffset",
            ),
            (
                self.long_value_offset,
                "gHotSpotVMLongConstantEntryValueOffset",
            ),
            (self.long_stride, "gHotSpotVMLongConstantEntryArrayStride"),
        ]
        .into_iter()
        .find(|(address, _)| *address == 0)
        .map(|(_, name)| name)
    }
}

/// One field: its offset in its type, or for a static field its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldPlace {
    Offset(u64),
    Static(u64),
}

/// The tables, by name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VmStructs {
    /// (type, field) to place.
    pub fields: HashMap<(String, String), FieldPlace>,
    /// (type, field) to the field's C++ type, where the table names one.
    pub field_types: HashMap<(String, String), String>,
    /// Type sizes.
    pub types: HashMap<String, u64>,
    /// Int and long constants.
    pub constants: HashMap<String, i64>,
}

impl VmStructs {
    /// A field's offset in its type.
    pub fn offset(&self, type_name: &str, field: &str) -> Result<u64, VmStructsError> {
        match self.fields.get(&(type_name.to_owned(), field.to_owned())) {
            Some(FieldPlace::Offset(offset)) => Ok(*offset),
            _ => Err(missing(format!("field {type_name}::{field}"))),
        }
    }

    /// The first of `candidates` (type, field) that the tables hold: fields
    /// that moved between types across releases.
    pub fn offset_of_any(&self, candidates: &[(&str, &str)]) -> Result<u64, VmStructsError> {
        candidates
            .iter()
            .find_map(|(type_name, field)| self.offset(type_name, field).ok())
            .ok_or_else(|| {
                let (type_name, field) = candidates.first().copied().unwrap_or_default();
                missing(format!("field {type_name}::{field}"))
            })
    }

    /// A field's offset and its width in bytes (1, 2, 4 or 8), for integer
    /// fields whose width changed between releases.
    pub fn integer_field(&self, type_name: &str, field: &str) -> Result<(u64, u8), VmStructsError> {
        let offset = self.offset(type_name, field)?;
        let width = match self
            .field_types
            .get(&(type_name.to_owned(), field.to_owned()))
            .map(String::as_str)
        {
            Some("bool" | "u1" | "jbyte" | "int8_t" | "uint8_t" | "char") => 1,
            Some("u2" | "jshort" | "int16_t" | "uint16_t" | "short") => 2,
            Some("int" | "jint" | "juint" | "u4" | "int32_t" | "uint32_t" | "uint") => 4,
            Some("intx" | "uintx" | "size_t" | "u8" | "jlong" | "uint64_t" | "int64_t") => 8,
            other => {
                return Err(VmStructsError::BadLayout {
                    table: "structs",
                    what: format!("{type_name}::{field} has type {other:?}, not an integer"),
                });
            }
        };
        Ok((offset, width))
    }

    /// A static field's address.
    pub fn address(&self, type_name: &str, field: &str) -> Result<u64, VmStructsError> {
        match self.fields.get(&(type_name.to_owned(), field.to_owned())) {
            Some(FieldPlace::Static(address)) if *address != 0 => Ok(*address),
            _ => Err(missing(format!("static field {type_name}::{field}"))),
        }
    }

    /// A type's size.
    pub fn size(&self, type_name: &str) -> Result<u64, VmStructsError> {
        self.types
            .get(type_name)
            .copied()
            .ok_or_else(|| missing(format!("type {type_name}")))
    }

    /// A constant.
    pub fn constant(&self, name: &str) -> Result<i64, VmStructsError> {
        self.constants
            .get(name)
            .copied()
            .ok_or_else(|| missing(format!("constant {name}")))
    }
}

fn missing(what: String) -> VmStructsError {
    VmStructsError::Missing { what }
}

/// The place of each member in one table's entries.
struct EntryLayout {
    table: &'static str,
    stride: u64,
    /// Offsets of the members read, each 8 bytes wide at most.
    members: Vec<(u64, u64)>,
}

/// Reads the four tables. `wanted_types` limits what is kept to fields
/// and sizes of those types (constants are kept when their name starts
/// with one of them), so a process's state stays small.
pub fn read(
    memory: &dyn RemoteMemory,
    symbols: &ExportedSymbols,
    wanted_types: &[&str],
) -> Result<VmStructs, VmStructsError> {
    let wanted = |name: &str| {
        wanted_types
            .iter()
            .any(|w| name == *w || name.strip_prefix(w).is_some_and(|r| r.starts_with("::")))
    };
    let mut names = NameCache::default();
    let mut found = VmStructs::default();

    let layout = entry_layout(
        memory,
        "structs",
        symbols.struct_stride,
        &[
            (symbols.struct_type_name_offset, 8),
            (symbols.struct_field_name_offset, 8),
            (symbols.struct_is_static_offset, 4),
            (symbols.struct_offset_offset, 8),
            (symbols.struct_address_offset, 8),
            (symbols.struct_type_string_offset, 8),
        ],
    )?;
    for_each_entry(memory, symbols.structs, &layout, |memory, values| {
        let type_name = names.get(memory, values[0], layout.table)?;
        if !wanted(&type_name) {
            return Ok(());
        }
        let field = names.get(memory, values[1], layout.table)?;
        let place = if values[2] as u32 != 0 {
            FieldPlace::Static(values[4])
        } else {
            FieldPlace::Offset(values[3])
        };
        if values[5] != 0 {
            let type_string = names.get(memory, values[5], layout.table)?;
            found
                .field_types
                .insert((type_name.clone(), field.clone()), type_string);
        }
        found.fields.insert((type_name, field), place);
        Ok(())
    })?;

    let layout = entry_layout(
        memory,
        "types",
        symbols.type_stride,
        &[(symbols.type_name_offset, 8), (symbols.type_size_offset, 8)],
    )?;
    for_each_entry(memory, symbols.types, &layout, |memory, values| {
        let type_name = names.get(memory, values[0], layout.table)?;
        if wanted(&type_name) {
            found.types.insert(type_name, values[1]);
        }
        Ok(())
    })?;

    for (table, base, stride, name_offset, value_offset, width) in [
        (
            "int constants",
            symbols.int_constants,
            symbols.int_stride,
            symbols.int_name_offset,
            symbols.int_value_offset,
            4,
        ),
        (
            "long constants",
            symbols.long_constants,
            symbols.long_stride,
            symbols.long_name_offset,
            symbols.long_value_offset,
            8,
        ),
    ] {
        let layout = entry_layout(
            memory,
            table,
            stride,
            &[(name_offset, 8), (value_offset, width)],
        )?;
        for_each_entry(memory, base, &layout, |memory, values| {
            let name = names.get(memory, values[0], table)?;
            if wanted(&name) {
                let value = if width == 4 {
                    i64::from(values[1] as u32 as i32)
                } else {
                    values[1] as i64
                };
                found.constants.insert(name, value);
            }
            Ok(())
        })?;
    }
    Ok(found)
}

/// Reads a table's stride and member offsets (each an exported u64) and
/// checks them: every member lies inside the entry.
fn entry_layout(
    memory: &dyn RemoteMemory,
    table: &'static str,
    stride_symbol: u64,
    members: &[(u64, u64)],
) -> Result<EntryLayout, VmStructsError> {
    let stride = read_u64(memory, stride_symbol)?;
    if stride == 0 {
        return Err(VmStructsError::NotInitialized { table });
    }
    if stride > MAX_STRIDE {
        return Err(VmStructsError::BadLayout {
            table,
            what: format!("stride {stride} is over {MAX_STRIDE}"),
        });
    }
    let mut read_members = Vec::with_capacity(members.len());
    for &(symbol, width) in members {
        let offset = read_u64(memory, symbol)?;
        if offset.checked_add(width).is_none_or(|end| end > stride) {
            return Err(VmStructsError::BadLayout {
                table,
                what: format!("a member at {offset} does not fit the {stride}-byte entry"),
            });
        }
        read_members.push((offset, width));
    }
    Ok(EntryLayout {
        table,
        stride,
        members: read_members,
    })
}

/// Calls `visit` with each entry's member values (zero-extended), until the
/// entry whose first member (its name) is null.
fn for_each_entry(
    memory: &dyn RemoteMemory,
    table_pointer: u64,
    layout: &EntryLayout,
    mut visit: impl FnMut(&dyn RemoteMemory, &[u64]) -> Result<(), VmStructsError>,
) -> Result<(), VmStructsError> {
    let table = layout.table;
    let base = read_u64(memory, table_pointer)?;
    if base == 0 {
        return Err(VmStructsError::NotInitialized { table });
    }
    let stride = layout.stride as usize;
    let mut chunk = vec![0u8; stride * ENTRIES_PER_READ];
    let mut values = vec![0u64; layout.members.len()];
    let mut index = 0usize;
    loop {
        if index >= MAX_ENTRIES {
            return Err(VmStructsError::TooManyEntries { table });
        }
        let address = base
            .checked_add((index * stride) as u64)
            .ok_or(VmStructsError::TooManyEntries { table })?;
        // The table's end is unknown until its terminator: read whole chunks
        // where possible, entry by entry where a chunk would cross into
        // unmapped memory.
        let entries = match memory.read(address, &mut chunk) {
            Ok(()) => ENTRIES_PER_READ,
            Err(_) => {
                memory.read(address, &mut chunk[..stride])?;
                1
            }
        };
        for entry in chunk[..entries * stride].chunks_exact(stride) {
            for (value, &(offset, width)) in values.iter_mut().zip(&layout.members) {
                let mut bytes = [0u8; 8];
                let (offset, width) = (offset as usize, width as usize);
                bytes[..width].copy_from_slice(&entry[offset..offset + width]);
                *value = u64::from_le_bytes(bytes);
            }
            if values[0] == 0 {
                return Ok(());
            }
            visit(memory, &values)?;
            index += 1;
        }
    }
}

/// Names by address: HotSpot's tables repeat each type name's literal.
#[derive(Default)]
struct NameCache {
    names: HashMap<u64, String>,
}

impl NameCache {
    fn get(
        &mut self,
        memory: &dyn RemoteMemory,
        address: u64,
        table: &'static str,
    ) -> Result<String, VmStructsError> {
        if let Some(name) = self.names.get(&address) {
            return Ok(name.clone());
        }
        let name = read_c_string(memory, address, MAX_NAME_BYTES)
            .ok_or(VmStructsError::BadName { table, address })?;
        self.names.insert(address, name.clone());
        Ok(name)
    }
}

/// A NUL-terminated UTF-8 string of at most `max` bytes, read without
/// crossing a page boundary in one read (the page after may be unmapped).
pub fn read_c_string(memory: &dyn RemoteMemory, address: u64, max: usize) -> Option<String> {
    const PAGE: u64 = 4096;
    let mut bytes = Vec::new();
    let mut at = address;
    while bytes.len() < max {
        let to_page_end = (PAGE - at % PAGE) as usize;
        let len = to_page_end.min(max - bytes.len()).min(64);
        let mut chunk = vec![0u8; len];
        memory.read(at, &mut chunk).ok()?;
        if let Some(nul) = chunk.iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&chunk[..nul]);
            return String::from_utf8(bytes).ok();
        }
        bytes.extend_from_slice(&chunk);
        at = at.checked_add(len as u64)?;
    }
    None
}

#[cfg(test)]
mod tests;
