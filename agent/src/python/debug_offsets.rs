//! CPython's own offsets table, `_Py_DebugOffsets`, which 3.13 and later
//! keep at the very start of `_PyRuntime` for debuggers and profilers: the
//! cookie `xdebugpy`, the version (`PY_VERSION_HEX`), then, per struct, its
//! size and the offsets of its fields, each a `uint64_t`. Pure: bytes in.
//!
//! The table itself grows between releases (3.14 adds fields in the middle
//! of its thread state and frame parts, 3.15 more), so where each field
//! lies in the table is written here per layout, from each release's
//! `pycore_debug_offsets.h` (3.13: `pycore_runtime.h`), keyed on the
//! version the table declares. A release newer than the newest layout is
//! read with that layout: a release that keeps the fields' places needs no
//! new agent, and one that moves them fails the checks below and is
//! refused.
//!
//! The table lacks one field the agent reads: `interpreters.main`, which
//! CPython has kept as the pointer after `interpreters.head` since 3.7.
//!
//! A process can forge its table, so every value is checked before use:
//! each offset lies within the size its struct declares, fits the 16 bits
//! the BPF program reads, and is aligned for what is read there. A table
//! that passes can still lie, but then it only makes the BPF program's and
//! the code readers' bounded reads return nonsense for that process.

use crate::abi::{self, PyEntryKind, PyPositionKind};

use super::offsets::VersionOffsets;

/// The first bytes of the table.
pub const COOKIE: &[u8; 8] = b"xdebugpy";
/// The first minor version that has the table.
pub const FIRST_MINOR: u8 = 13;
/// Bytes read from `_PyRuntime`: the longest known layout's fields this
/// reader uses, and well within `_PyRuntimeState` itself.
pub const TABLE_BYTES: usize = WORDS * 8;
const WORDS: usize = 94;

/// Largest struct size believed: far above any CPython struct read here.
const MAX_STRUCT_SIZE: u64 = 16 << 20;
/// `owner` of the frame each C call of the eval loop pushes first:
/// `FRAME_OWNED_BY_CSTACK` in 3.12 and 3.13, `FRAME_OWNED_BY_INTERPRETER`
/// from 3.14 (which took its number, 3; nothing is owned by `CSTACK`, now
/// 4, in 3.14, and 3.15 drops it).
const OWNER_OF_ENTRY_FRAMES: u8 = 3;
/// Low bits cleared from `f_executable`: a tagged `_PyStackRef` from 3.14
/// (tags use at most the two low bits); objects are 8-aligned at least, so
/// three bits never clear an address bit.
const STACK_REF_TAG_MASK: u8 = 7;

/// Why a `_Py_DebugOffsets` table was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DebugOffsetsError {
    /// Fewer bytes than a table.
    #[error("the table is {len} bytes, shorter than {TABLE_BYTES}")]
    Short {
        /// Bytes given.
        len: usize,
    },
    /// `_PyRuntime` does not start with the cookie.
    #[error("_PyRuntime does not start with the cookie \"xdebugpy\" (found {found:02x?})")]
    NoCookie {
        /// The first bytes found.
        found: [u8; 8],
    },
    /// A version that is not CPython 3.13 or later.
    #[error("the table declares version {version:#x}, not CPython 3.13 or later")]
    BadVersion {
        /// `PY_VERSION_HEX` as found.
        version: u64,
    },
    /// A struct size outside what any CPython has.
    #[error("the table gives {section} a size of {size} bytes")]
    BadSize {
        /// The struct.
        section: &'static str,
        /// The size found.
        size: u64,
    },
    /// An offset outside its struct, past 16 bits, or misaligned.
    #[error("the table puts {field} at {offset}, outside its {size}-byte struct or misaligned")]
    BadOffset {
        /// The field.
        field: &'static str,
        /// The offset found.
        offset: u64,
        /// Its struct's size from the table.
        size: u64,
    },
}

/// A table entry: the word of its struct's size and its own word, in
/// 8-byte words from the cookie.
#[derive(Debug, Clone, Copy)]
struct Field {
    name: &'static str,
    section: &'static str,
    size_word: usize,
    word: usize,
    /// Bytes read at the offset (and its alignment).
    width: u64,
}

const fn field(
    name: &'static str,
    section: &'static str,
    size_word: usize,
    word: usize,
    width: u64,
) -> Field {
    Field {
        name,
        section,
        size_word,
        word,
        width,
    }
}

/// Where the fields this agent uses lie in one release's table.
#[derive(Debug)]
struct Layout {
    interpreters_head: Field,
    threads_head: Field,
    tstate_next: Field,
    tstate_current_frame: Field,
    tstate_thread_id: Field,
    frame_previous: Field,
    frame_executable: Field,
    frame_instr_ptr: Field,
    frame_owner: Field,
    code_filename: Field,
    code_qualname: Field,
    code_linetable: Field,
    code_firstlineno: Field,
    code_adaptive: Field,
    object_type: Field,
    bytes_size: Field,
    bytes_data: Field,
    unicode_state: Field,
    unicode_length: Field,
    /// Words holding sizes, not offsets: `sizeof(PyASCIIObject)`, and
    /// `sizeof(PyCompactUnicodeObject)` where the table has it (3.15+).
    unicode_ascii_size: usize,
    unicode_compact_size: Option<usize>,
}

const RUNTIME: &str = "_PyRuntimeState";
const INTERP: &str = "PyInterpreterState";
const TSTATE: &str = "PyThreadState";
const FRAME: &str = "_PyInterpreterFrame";
const CODE: &str = "PyCodeObject";
const OBJECT: &str = "PyObject";
const BYTES: &str = "PyBytesObject";
const UNICODE: &str = "PyUnicodeObject";

/// 3.13 (`Include/internal/pycore_runtime.h`).
const LAYOUT_3_13: Layout = Layout {
    interpreters_head: field("interpreters.head", RUNTIME, 3, 5, 8),
    threads_head: field("threads.head", INTERP, 6, 9, 8),
    tstate_next: field("next", TSTATE, 19, 21, 8),
    tstate_current_frame: field("current_frame", TSTATE, 19, 23, 8),
    tstate_thread_id: field("thread_id", TSTATE, 19, 24, 8),
    frame_previous: field("previous", FRAME, 28, 29, 8),
    frame_executable: field("f_executable", FRAME, 28, 30, 8),
    frame_instr_ptr: field("instr_ptr", FRAME, 28, 31, 8),
    frame_owner: field("owner", FRAME, 28, 33, 1),
    code_filename: field("co_filename", CODE, 34, 35, 8),
    code_qualname: field("co_qualname", CODE, 34, 37, 8),
    code_linetable: field("co_linetable", CODE, 34, 38, 8),
    code_firstlineno: field("co_firstlineno", CODE, 34, 39, 4),
    code_adaptive: field("co_code_adaptive", CODE, 34, 43, 2),
    object_type: field("ob_type", OBJECT, 44, 45, 8),
    bytes_size: field("ob_size", BYTES, 64, 65, 8),
    bytes_data: field("ob_sval", BYTES, 64, 66, 1),
    unicode_state: field("state", UNICODE, 67, 68, 4),
    unicode_length: field("length", UNICODE, 67, 69, 8),
    unicode_ascii_size: 70,
    unicode_compact_size: None,
};

/// 3.14 (`Include/internal/pycore_debug_offsets.h`): the interpreter state
/// gains `threads_main` and two generations, the thread state's part moves
/// with them, the frame gains `stackpointer` and `tlbc_index`, the code
/// object `co_tlbc`, and a set object part comes before the others.
const LAYOUT_3_14: Layout = Layout {
    interpreters_head: field("interpreters.head", RUNTIME, 3, 5, 8),
    threads_head: field("threads.head", INTERP, 6, 9, 8),
    tstate_next: field("next", TSTATE, 22, 24, 8),
    tstate_current_frame: field("current_frame", TSTATE, 22, 26, 8),
    tstate_thread_id: field("thread_id", TSTATE, 22, 27, 8),
    frame_previous: field("previous", FRAME, 31, 32, 8),
    frame_executable: field("f_executable", FRAME, 31, 33, 8),
    frame_instr_ptr: field("instr_ptr", FRAME, 31, 34, 8),
    frame_owner: field("owner", FRAME, 31, 36, 1),
    code_filename: field("co_filename", CODE, 39, 40, 8),
    code_qualname: field("co_qualname", CODE, 39, 42, 8),
    code_linetable: field("co_linetable", CODE, 39, 43, 8),
    code_firstlineno: field("co_firstlineno", CODE, 39, 44, 4),
    code_adaptive: field("co_code_adaptive", CODE, 39, 48, 2),
    object_type: field("ob_type", OBJECT, 50, 51, 8),
    bytes_size: field("ob_size", BYTES, 74, 75, 8),
    bytes_data: field("ob_sval", BYTES, 74, 76, 1),
    unicode_state: field("state", UNICODE, 77, 78, 4),
    unicode_length: field("length", UNICODE, 77, 79, 8),
    unicode_ascii_size: 80,
    unicode_compact_size: None,
};

/// 3.15: the thread state gains `base_frame`, two profiling fields and four
/// more after `thread_id`, an exception part follows it, the type part
/// grows and a heap type part follows, and the string part ends with
/// `sizeof(PyCompactUnicodeObject)`.
const LAYOUT_3_15: Layout = Layout {
    interpreters_head: field("interpreters.head", RUNTIME, 3, 5, 8),
    threads_head: field("threads.head", INTERP, 6, 9, 8),
    tstate_next: field("next", TSTATE, 22, 24, 8),
    tstate_current_frame: field("current_frame", TSTATE, 22, 26, 8),
    tstate_thread_id: field("thread_id", TSTATE, 22, 30, 8),
    frame_previous: field("previous", FRAME, 39, 40, 8),
    frame_executable: field("f_executable", FRAME, 39, 41, 8),
    frame_instr_ptr: field("instr_ptr", FRAME, 39, 42, 8),
    frame_owner: field("owner", FRAME, 39, 44, 1),
    code_filename: field("co_filename", CODE, 47, 48, 8),
    code_qualname: field("co_qualname", CODE, 47, 50, 8),
    code_linetable: field("co_linetable", CODE, 47, 51, 8),
    code_firstlineno: field("co_firstlineno", CODE, 47, 52, 4),
    code_adaptive: field("co_code_adaptive", CODE, 47, 56, 2),
    object_type: field("ob_type", OBJECT, 58, 59, 8),
    bytes_size: field("ob_size", BYTES, 86, 87, 8),
    bytes_data: field("ob_sval", BYTES, 86, 88, 1),
    unicode_state: field("state", UNICODE, 89, 90, 4),
    unicode_length: field("length", UNICODE, 89, 91, 8),
    unicode_ascii_size: 92,
    unicode_compact_size: Some(93),
};

/// The layout of the table of CPython 3.`minor` (13 or later).
fn layout_for(minor: u8) -> &'static Layout {
    match minor {
        0..=13 => &LAYOUT_3_13,
        14 => &LAYOUT_3_14,
        _ => &LAYOUT_3_15,
    }
}

/// The offsets a `_Py_DebugOffsets` table gives, as the agent's own
/// [`VersionOffsets`] (with `minor` from the table's version), for the BPF
/// program and the code readers alike.
pub fn parse(table: &[u8]) -> Result<VersionOffsets, DebugOffsetsError> {
    if table.len() < TABLE_BYTES {
        return Err(DebugOffsetsError::Short { len: table.len() });
    }
    let word = |index: usize| -> u64 {
        let at = index * 8;
        table
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(u64::MAX, u64::from_le_bytes)
    };
    if &table[..8] != COOKIE {
        let mut found = [0u8; 8];
        found.copy_from_slice(&table[..8]);
        return Err(DebugOffsetsError::NoCookie { found });
    }
    let version = word(1);
    let major = version >> 24;
    let minor = (version >> 16) & 0xff;
    if major != 3 || !(u64::from(FIRST_MINOR)..100).contains(&minor) {
        return Err(DebugOffsetsError::BadVersion { version });
    }
    let minor = minor as u8;
    let layout = layout_for(minor);
    let offset = |f: Field| -> Result<u16, DebugOffsetsError> {
        let size = word(f.size_word);
        if !(1..=MAX_STRUCT_SIZE).contains(&size) {
            return Err(DebugOffsetsError::BadSize {
                section: f.section,
                size,
            });
        }
        let offset = word(f.word);
        let inside = offset.checked_add(f.width).is_some_and(|end| end <= size);
        let aligned = offset % f.width == 0;
        match u16::try_from(offset) {
            Ok(value) if inside && aligned && value < u16::MAX => Ok(value),
            _ => Err(DebugOffsetsError::BadOffset {
                field: f.name,
                offset,
                size,
            }),
        }
    };
    // A string's data follows its header: a size, not an offset, bounded by
    // the string part's own size.
    let string_size = |index: usize, name: &'static str| -> Result<u16, DebugOffsetsError> {
        let size = word(index);
        u16::try_from(size)
            .ok()
            .filter(|&s| (16..=512).contains(&s) && s % 8 == 0)
            .ok_or(DebugOffsetsError::BadSize {
                section: name,
                size,
            })
    };
    // The table names the interpreters' list head (newest first); the main
    // interpreter, whose threads a program without subinterpreters runs
    // on, is the pointer after it in `struct pyinterpreters`, as in every
    // release since 3.7.
    let interpreters_main = offset(Field {
        name: "interpreters.main",
        ..layout.interpreters_head
    })?
    .checked_add(8)
    .filter(|&main| u64::from(main) + 8 <= word(layout.interpreters_head.size_word))
    .ok_or(DebugOffsetsError::BadOffset {
        field: "interpreters.main",
        offset: word(layout.interpreters_head.word).saturating_add(8),
        size: word(layout.interpreters_head.size_word),
    })?;
    let ascii_data = string_size(layout.unicode_ascii_size, "PyASCIIObject")?;
    let compact_data = match layout.unicode_compact_size {
        Some(index) => string_size(index, "PyCompactUnicodeObject")?,
        // `PyCompactUnicodeObject` adds `utf8_length` and `utf8` to the
        // ASCII header in every release that has the table.
        None => ascii_data + 16,
    };
    Ok(VersionOffsets {
        minor,
        frames: abi::PythonProcess {
            runtime: 0,
            runtime_interpreters_main: interpreters_main,
            interp_threads_head: offset(layout.threads_head)?,
            tstate_next: offset(layout.tstate_next)?,
            tstate_thread_id: offset(layout.tstate_thread_id)?,
            tstate_frame: offset(layout.tstate_current_frame)?,
            cframe_current_frame: abi::PY_NO_CFRAME,
            frame_previous: offset(layout.frame_previous)?,
            frame_code: offset(layout.frame_executable)?,
            frame_position: offset(layout.frame_instr_ptr)?,
            frame_entry: offset(layout.frame_owner)?,
            position_kind: PyPositionKind::Pointer as u8,
            entry_kind: PyEntryKind::Shim as u8,
            owned_by_cstack: OWNER_OF_ENTRY_FRAMES,
            code_tag_mask: if minor >= 14 { STACK_REF_TAG_MASK } else { 0 },
        },
        code_name: offset(layout.code_qualname)?,
        code_filename: offset(layout.code_filename)?,
        code_firstlineno: offset(layout.code_firstlineno)?,
        code_linetable: offset(layout.code_linetable)?,
        code_adaptive: offset(layout.code_adaptive)?,
        object_type: offset(layout.object_type)?,
        unicode_length: offset(layout.unicode_length)?,
        unicode_state: offset(layout.unicode_state)?,
        unicode_ascii_data: ascii_data,
        unicode_compact_data: compact_data,
        bytes_size: offset(layout.bytes_size)?,
        bytes_data: offset(layout.bytes_data)?,
    })
}

#[cfg(test)]
mod tests;
