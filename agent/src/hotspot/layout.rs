//! The offsets, sizes and addresses the agent uses, taken by name from
//! [`VmStructs`]: one struct checked once per JVM, so the per-frame code
//! reads fields without looking names up.

use super::vmstructs::{VmStructs, VmStructsError};

/// Types (and constant prefixes) whose entries are kept from the tables.
pub const WANTED_TYPES: &[&str] = &[
    "CodeCache",
    "CodeHeap",
    "VirtualSpace",
    "GrowableArrayBase",
    "GrowableArray<int>",
    "HeapBlock",
    "CodeBlob",
    "CompiledMethod",
    "nmethod",
    "Method",
    "ConstMethod",
    "ConstMethodFlags",
    "ConstantPool",
    "Klass",
    "Symbol",
    "PcDesc",
    "frame",
];

/// Words from an interpreted frame's frame pointer to its bytecode
/// pointer: JDK 9 and later (a mirror slot was added), then JDK 8. The
/// right one points into the method's bytecodes.
pub const INTERPRETER_BCP_SLOTS: [i64; 2] = [-8, -7];

/// Where a code blob's instructions are: JDK 8-22 keep pointers, JDK 23
/// and later offsets from the blob (its code ends where its data begins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeBounds {
    Pointers { begin: u64, end: u64 },
    Offsets { code: u64, data: u64 },
}

/// An integer field: its offset and width in bytes.
pub type IntegerField = (u64, u8);

/// Where HotSpot keeps what the unwinder and the namer read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JvmLayout {
    /// `CodeCache::_heaps`: the address of a `GrowableArray<CodeHeap*>*`.
    pub code_heaps: u64,
    /// `CodeCache::_low_bound` / `_high_bound`: addresses of the bounds.
    pub code_low_bound: u64,
    pub code_high_bound: u64,
    pub array_len: u64,
    pub array_data: u64,
    pub heap_memory: u64,
    pub heap_segmap: u64,
    pub heap_log2_segment_size: u64,
    pub space_low: u64,
    pub space_high: u64,
    pub heap_block_size: u64,
    pub block_used: u64,
    pub blob_name: u64,
    pub blob_size: u64,
    pub blob_frame_complete_offset: IntegerField,
    pub blob_frame_size: IntegerField,
    pub blob_code: CodeBounds,
    pub nmethod_method: u64,
    pub method_const_method: u64,
    pub const_method_constants: u64,
    pub const_method_flags: Option<IntegerField>,
    pub const_method_code_size: u64,
    pub const_method_name_index: u64,
    pub const_method_signature_index: u64,
    pub const_method_size: u64,
    pub pool_holder: u64,
    pub pool_length: u64,
    pub pool_source_file_index: Option<u64>,
    pub pool_size: u64,
    pub klass_name: u64,
    pub symbol_length: u64,
    pub symbol_body: u64,
    /// Words from an interpreted frame's frame pointer to its `Method*`,
    /// and its caller's unextended stack pointer.
    pub interpreter_method_slot: i64,
    pub interpreter_sender_sp_slot: i64,
    /// `ConstMethod` flag: a line number table follows the bytecodes.
    pub has_line_number_table: Option<u32>,
    /// Where inlined methods are recorded.
    pub inline: Option<super::inline::InlineLayout>,
}

impl JvmLayout {
    /// The layout from the tables; a missing entry names itself.
    pub fn from_vmstructs(tables: &VmStructs) -> Result<JvmLayout, VmStructsError> {
        Ok(JvmLayout {
            code_heaps: tables.address("CodeCache", "_heaps")?,
            code_low_bound: tables.address("CodeCache", "_low_bound")?,
            code_high_bound: tables.address("CodeCache", "_high_bound")?,
            array_len: tables.offset("GrowableArrayBase", "_len")?,
            array_data: tables.offset("GrowableArray<int>", "_data")?,
            heap_memory: tables.offset("CodeHeap", "_memory")?,
            heap_segmap: tables.offset("CodeHeap", "_segmap")?,
            heap_log2_segment_size: tables.offset("CodeHeap", "_log2_segment_size")?,
            space_low: tables.offset("VirtualSpace", "_low")?,
            space_high: tables.offset("VirtualSpace", "_high")?,
            heap_block_size: tables.size("HeapBlock")?,
            block_used: tables
                .offset("HeapBlock::Header", "_used")?
                .wrapping_add(tables.offset("HeapBlock", "_header")?),
            blob_name: tables.offset("CodeBlob", "_name")?,
            blob_size: tables.offset("CodeBlob", "_size")?,
            blob_frame_complete_offset: tables
                .integer_field("CodeBlob", "_frame_complete_offset")?,
            blob_frame_size: tables.integer_field("CodeBlob", "_frame_size")?,
            blob_code: match tables.offset("CodeBlob", "_code_begin") {
                Ok(begin) => CodeBounds::Pointers {
                    begin,
                    end: tables.offset("CodeBlob", "_code_end")?,
                },
                Err(_) => CodeBounds::Offsets {
                    code: tables.offset("CodeBlob", "_code_offset")?,
                    data: tables.offset("CodeBlob", "_data_offset")?,
                },
            },
            // JDK 8-20 keep the method in CompiledMethod, later ones in nmethod.
            nmethod_method: tables
                .offset_of_any(&[("nmethod", "_method"), ("CompiledMethod", "_method")])?,
            method_const_method: tables.offset("Method", "_constMethod")?,
            const_method_constants: tables.offset("ConstMethod", "_constants")?,
            // A u2 until JDK 20, then a u4 inside ConstMethodFlags.
            const_method_flags: tables
                .integer_field("ConstMethod", "_flags")
                .or_else(|_| tables.integer_field("ConstMethod", "_flags._flags"))
                .ok(),
            const_method_code_size: tables.offset("ConstMethod", "_code_size")?,
            const_method_name_index: tables.offset("ConstMethod", "_name_index")?,
            const_method_signature_index: tables.offset("ConstMethod", "_signature_index")?,
            const_method_size: tables.size("ConstMethod")?,
            pool_holder: tables.offset("ConstantPool", "_pool_holder")?,
            pool_length: tables.offset("ConstantPool", "_length")?,
            pool_source_file_index: tables
                .offset("ConstantPool", "_source_file_name_index")
                .ok(),
            pool_size: tables.size("ConstantPool")?,
            klass_name: tables.offset("Klass", "_name")?,
            symbol_length: tables.offset("Symbol", "_length")?,
            symbol_body: tables.offset("Symbol", "_body")?,
            // x86_64's interpreter frame (frame_x86.hpp); exported by few
            // releases, and the same in all of them but the bytecode
            // pointer's, which JDK 9 moved (see `INTERPRETER_BCP_SLOTS`).
            interpreter_method_slot: tables
                .constant("frame::interpreter_frame_method_offset")
                .unwrap_or(-3),
            interpreter_sender_sp_slot: tables
                .constant("frame::interpreter_frame_sender_sp_offset")
                .unwrap_or(-1),
            has_line_number_table: tables
                .constant("ConstMethod::_has_linenumber_table")
                .or_else(|_| tables.constant("ConstMethodFlags::_misc_has_linenumber_table"))
                .ok()
                .and_then(|v| u32::try_from(v).ok()),
            inline: super::inline::InlineLayout::from_vmstructs(tables),
        })
    }
}
