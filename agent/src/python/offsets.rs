//! Struct offsets of each supported CPython minor version, in one table.
//!
//! Every number comes from the compiler: `agent/tests/python/offsets_probe.c`
//! prints `offsetof`/`sizeof` against that version's own internal headers,
//! and `agent/tests/python_offsets.rs` compiles it for each version and
//! compares with [`VersionOffsets::probe_lines`]. Within a minor version
//! CPython keeps these layouts (they are read by debuggers and profilers).

use crate::abi::{self, PyEntryKind, PyPositionKind};

/// What kiln-agent reads in one CPython minor version (x86-64, release build).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionOffsets {
    /// The `x` of `3.x`.
    pub minor: u8,
    /// `_PyRuntimeState.interpreters.main`.
    pub runtime_interpreters_main: u16,
    /// `PyInterpreterState.tstate_head` (3.9-3.10) / `threads.head`.
    pub interp_threads_head: u16,
    /// `PyThreadState.next`.
    pub tstate_next: u16,
    /// `PyThreadState.thread_id`.
    pub tstate_thread_id: u16,
    /// `PyThreadState.frame` / `cframe` (3.11-3.12) / `current_frame` (3.13).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame` (3.11-3.12), else [`abi::PY_NO_CFRAME`].
    pub cframe_current_frame: u16,
    /// `f_back` / `previous`.
    pub frame_previous: u16,
    /// `f_code` / `f_executable` (3.13).
    pub frame_code: u16,
    /// `f_lasti` (3.9-3.10) / `prev_instr` (3.11-3.12) / `instr_ptr` (3.13).
    pub frame_position: u16,
    /// `is_entry` (3.11) / `owner` (3.12+); 0 when unused.
    pub frame_entry: u16,
    /// How `frame_position` is read.
    pub position_kind: PyPositionKind,
    /// How eval-loop calls are told apart.
    pub entry_kind: PyEntryKind,
    /// `FRAME_OWNED_BY_CSTACK` (3.12+), else 0.
    pub owned_by_cstack: u8,
    /// `co_qualname` (3.11+) / `co_name`.
    pub code_name: u16,
    /// `co_filename`.
    pub code_filename: u16,
    /// `co_firstlineno` (an int).
    pub code_firstlineno: u16,
    /// `co_lnotab` (3.9) / `co_linetable` (bytes).
    pub code_linetable: u16,
    /// `co_code_adaptive` (3.11+): where the bytecode starts; else 0.
    pub code_adaptive: u16,
    /// `PyASCIIObject.length`.
    pub unicode_length: u16,
    /// `PyASCIIObject.state` (kind in bits 2-4, compact bit 5, ascii bit 6).
    pub unicode_state: u16,
    /// `sizeof(PyASCIIObject)`: data of compact ASCII strings.
    pub unicode_ascii_data: u16,
    /// `sizeof(PyCompactUnicodeObject)`: data of other compact strings.
    pub unicode_compact_data: u16,
    /// `PyVarObject.ob_size`.
    pub bytes_size: u16,
    /// `PyBytesObject.ob_sval`.
    pub bytes_data: u16,
}

/// Offsets shared by the versions whose frames are `PyFrameObject`s.
const V3_9: VersionOffsets = VersionOffsets {
    minor: 9,
    runtime_interpreters_main: 40,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_thread_id: 176,
    tstate_frame: 24,
    cframe_current_frame: abi::PY_NO_CFRAME,
    frame_previous: 24,
    frame_code: 32,
    frame_position: 104,
    frame_entry: 0,
    position_kind: PyPositionKind::Index,
    entry_kind: PyEntryKind::EveryFrame,
    owned_by_cstack: 0,
    code_name: 112,
    code_filename: 104,
    code_firstlineno: 40,
    code_linetable: 120,
    code_adaptive: 0,
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
};

const V3_10: VersionOffsets = VersionOffsets {
    minor: 10,
    frame_position: 96,
    ..V3_9
};

const V3_11: VersionOffsets = VersionOffsets {
    minor: 11,
    runtime_interpreters_main: 48,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_frame: 56,
    cframe_current_frame: 8,
    frame_previous: 48,
    frame_code: 32,
    frame_position: 56,
    frame_entry: 68,
    position_kind: PyPositionKind::Pointer,
    entry_kind: PyEntryKind::Flag,
    owned_by_cstack: 0,
    code_name: 128,
    code_filename: 112,
    code_firstlineno: 72,
    code_linetable: 136,
    code_adaptive: 184,
    ..V3_9
};

const V3_12: VersionOffsets = VersionOffsets {
    minor: 12,
    runtime_interpreters_main: 48,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_thread_id: 136,
    tstate_frame: 56,
    cframe_current_frame: 0,
    frame_previous: 8,
    frame_code: 0,
    frame_position: 56,
    frame_entry: 70,
    position_kind: PyPositionKind::Pointer,
    entry_kind: PyEntryKind::Shim,
    owned_by_cstack: 3,
    code_name: 128,
    code_filename: 112,
    code_firstlineno: 68,
    code_linetable: 136,
    code_adaptive: 192,
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_data: 40,
    unicode_compact_data: 56,
    bytes_size: 16,
    bytes_data: 32,
};

const V3_13: VersionOffsets = VersionOffsets {
    minor: 13,
    runtime_interpreters_main: 640,
    interp_threads_head: 7344,
    tstate_thread_id: 152,
    tstate_frame: 72,
    cframe_current_frame: abi::PY_NO_CFRAME,
    code_adaptive: 200,
    ..V3_12
};

/// Every supported version, oldest first.
pub const SUPPORTED: [VersionOffsets; 5] = [V3_9, V3_10, V3_11, V3_12, V3_13];

/// The offsets of CPython 3.`minor`, if supported.
pub fn for_minor(minor: u8) -> Option<&'static VersionOffsets> {
    SUPPORTED.iter().find(|v| v.minor == minor)
}

impl VersionOffsets {
    /// The `python_processes` map value for a process whose `_PyRuntime` is
    /// at `runtime`.
    pub fn kernel_entry(&self, runtime: u64) -> abi::PythonProcess {
        abi::PythonProcess {
            runtime,
            runtime_interpreters_main: self.runtime_interpreters_main,
            interp_threads_head: self.interp_threads_head,
            tstate_next: self.tstate_next,
            tstate_thread_id: self.tstate_thread_id,
            tstate_frame: self.tstate_frame,
            cframe_current_frame: self.cframe_current_frame,
            frame_previous: self.frame_previous,
            frame_code: self.frame_code,
            frame_position: self.frame_position,
            frame_entry: self.frame_entry,
            position_kind: self.position_kind as u8,
            entry_kind: self.entry_kind as u8,
            owned_by_cstack: self.owned_by_cstack,
            reserved: 0,
        }
    }

    /// The table as `name value` lines, in the order and names the offsets
    /// probe prints them (`agent/tests/python/offsets_probe.c`).
    pub fn probe_lines(&self) -> Vec<(&'static str, u64)> {
        let mut lines = vec![
            ("version_minor", u64::from(self.minor)),
            (
                "runtime_interpreters_main",
                self.runtime_interpreters_main.into(),
            ),
            ("interp_threads_head", self.interp_threads_head.into()),
            ("tstate_next", self.tstate_next.into()),
            ("tstate_thread_id", self.tstate_thread_id.into()),
            ("tstate_frame", self.tstate_frame.into()),
            ("cframe_current_frame", self.cframe_current_frame.into()),
            ("frame_previous", self.frame_previous.into()),
            ("frame_code", self.frame_code.into()),
            ("frame_lasti", self.frame_position.into()),
            ("frame_entry", self.frame_entry.into()),
        ];
        if self.entry_kind == PyEntryKind::Shim {
            lines.push(("owned_by_cstack", self.owned_by_cstack.into()));
        }
        lines.extend([
            ("code_name", self.code_name.into()),
            ("code_adaptive", self.code_adaptive.into()),
            ("code_filename", self.code_filename.into()),
            ("code_firstlineno", self.code_firstlineno.into()),
            ("code_linetable", self.code_linetable.into()),
            ("unicode_length", self.unicode_length.into()),
            ("unicode_state", self.unicode_state.into()),
            ("unicode_ascii_data", self.unicode_ascii_data.into()),
            ("unicode_compact_data", self.unicode_compact_data.into()),
            ("bytes_size", self.bytes_size.into()),
            ("bytes_data", self.bytes_data.into()),
        ]);
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_is_found_by_its_minor_and_no_other() {
        for version in &SUPPORTED {
            assert_eq!(for_minor(version.minor), Some(version));
        }
        assert_eq!(for_minor(8), None);
        assert_eq!(for_minor(14), None);
    }

    #[test]
    fn position_and_entry_kinds_follow_the_frame_layouts() {
        for version in &SUPPORTED {
            let pointer = version.minor >= 11;
            assert_eq!(version.position_kind == PyPositionKind::Pointer, pointer);
            assert_eq!(version.code_adaptive != 0, pointer);
            let cframe = (11..=12).contains(&version.minor);
            assert_eq!(version.cframe_current_frame != abi::PY_NO_CFRAME, cframe);
        }
    }
}
