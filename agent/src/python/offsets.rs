//! Struct offsets of CPython 3.9 to 3.13, in one table. From 3.13 on the
//! agent reads CPython's own table instead ([`super::debug_offsets`]); the
//! 3.13 row stays as the reference that reader is checked against.
//!
//! Every number comes from the compiler: `agent/tests/python/offsets_probe.c`
//! prints `offsetof`/`sizeof` against that version's own internal headers,
//! and `agent/tests/privileged/python_offsets.rs` compiles it for each version and
//! compares with [`VersionOffsets::probe_lines`]. Within a minor version
//! CPython keeps these layouts (they are read by debuggers and profilers).

use crate::abi::{self, PyEntryKind, PyPositionKind};

/// What kiln-agent reads in one CPython minor version (x86-64, release build).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionOffsets {
    /// The `x` of `3.x`.
    pub minor: u8,
    /// What the BPF program reads to walk a thread's frames (`runtime` is
    /// 0 here; [`VersionOffsets::kernel_entry`] fills it in per process).
    pub frames: abi::PythonProcess,
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
    /// `PyObject.ob_type`: what tells a code object from anything else.
    pub object_type: u16,
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
    frames: abi::PythonProcess {
        runtime: 0,
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
        position_kind: PyPositionKind::Index as u8,
        entry_kind: PyEntryKind::EveryFrame as u8,
        owned_by_cstack: 0,
        code_tag_mask: 0,
    },
    code_name: 112,
    code_filename: 104,
    code_firstlineno: 40,
    code_linetable: 120,
    code_adaptive: 0,
    object_type: 8,
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
};

const V3_10: VersionOffsets = VersionOffsets {
    minor: 10,
    frames: abi::PythonProcess {
        frame_position: 96,
        ..V3_9.frames
    },
    ..V3_9
};

const V3_11: VersionOffsets = VersionOffsets {
    minor: 11,
    frames: abi::PythonProcess {
        runtime: 0,
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
        position_kind: PyPositionKind::Pointer as u8,
        entry_kind: PyEntryKind::Flag as u8,
        owned_by_cstack: 0,
        code_tag_mask: 0,
    },
    code_name: 128,
    code_filename: 112,
    code_firstlineno: 72,
    code_linetable: 136,
    code_adaptive: 184,
    ..V3_9
};

const V3_12: VersionOffsets = VersionOffsets {
    minor: 12,
    frames: abi::PythonProcess {
        runtime: 0,
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
        position_kind: PyPositionKind::Pointer as u8,
        entry_kind: PyEntryKind::Shim as u8,
        owned_by_cstack: 3,
        code_tag_mask: 0,
    },
    code_name: 128,
    code_filename: 112,
    code_firstlineno: 68,
    code_linetable: 136,
    code_adaptive: 192,
    object_type: 8,
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_data: 40,
    unicode_compact_data: 56,
    bytes_size: 16,
    bytes_data: 32,
};

const V3_13: VersionOffsets = VersionOffsets {
    minor: 13,
    frames: abi::PythonProcess {
        runtime_interpreters_main: 640,
        interp_threads_head: 7344,
        tstate_thread_id: 152,
        tstate_frame: 72,
        cframe_current_frame: abi::PY_NO_CFRAME,
        ..V3_12.frames
    },
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
            ..self.frames
        }
    }

    /// Whether frames record an instruction index (3.9-3.10) rather than a
    /// pointer into the bytecode.
    pub fn position_is_index(&self) -> bool {
        self.frames.position_kind == PyPositionKind::Index as u8
    }

    /// The table as `name value` lines, in the order and names the offsets
    /// probe prints them (`agent/tests/python/offsets_probe.c`).
    pub fn probe_lines(&self) -> Vec<(&'static str, u64)> {
        let f = &self.frames;
        let mut lines = vec![
            ("version_minor", u64::from(self.minor)),
            (
                "runtime_interpreters_main",
                f.runtime_interpreters_main.into(),
            ),
            ("interp_threads_head", f.interp_threads_head.into()),
            ("tstate_next", f.tstate_next.into()),
            ("tstate_thread_id", f.tstate_thread_id.into()),
            ("tstate_frame", f.tstate_frame.into()),
            ("cframe_current_frame", f.cframe_current_frame.into()),
            ("frame_previous", f.frame_previous.into()),
            ("frame_code", f.frame_code.into()),
            ("frame_lasti", f.frame_position.into()),
            ("frame_entry", f.frame_entry.into()),
        ];
        if f.entry_kind == PyEntryKind::Shim as u8 {
            lines.push(("owned_by_cstack", f.owned_by_cstack.into()));
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
            assert_eq!(!version.position_is_index(), pointer);
            assert_eq!(version.code_adaptive != 0, pointer);
            let cframe = (11..=12).contains(&version.minor);
            assert_eq!(
                version.frames.cframe_current_frame != abi::PY_NO_CFRAME,
                cframe
            );
            assert_eq!(version.kernel_entry(7).runtime, 7);
        }
    }
}
