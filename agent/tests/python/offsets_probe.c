/*
 * Prints the struct offsets kiln-agent reads in a CPython process, computed
 * by the compiler from that version's own (internal) headers. The agent's
 * table (agent/src/python/offsets.rs) must print the same; see
 * agent/tests/python_offsets.rs.
 *
 * cc -DPy_BUILD_CORE -I$SRC/Include -I$SRC/Include/internal -I$SRC offsets_probe.c
 */
#define Py_BUILD_CORE 1
#include <stddef.h>
#include <stdio.h>
#include "Python.h"
#if PY_VERSION_HEX < 0x030B0000
#include "frameobject.h"
#else
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"

#define P(name, value) printf("%s %lu\n", name, (unsigned long)(value))

int main(void)
{
	P("version_minor", PY_MINOR_VERSION);
	P("runtime_interpreters_main", offsetof(_PyRuntimeState, interpreters.main));
#if PY_VERSION_HEX < 0x030B0000
	P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#else
	P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#endif
	P("tstate_next", offsetof(PyThreadState, next));
	P("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX < 0x030B0000
	P("tstate_frame", offsetof(PyThreadState, frame));
	P("cframe_current_frame", 0xffff);
	P("frame_previous", offsetof(PyFrameObject, f_back));
	P("frame_code", offsetof(PyFrameObject, f_code));
	P("frame_lasti", offsetof(PyFrameObject, f_lasti));
	P("frame_entry", 0);
#elif PY_VERSION_HEX < 0x030D0000
	P("tstate_frame", offsetof(PyThreadState, cframe));
	P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
	P("frame_previous", offsetof(_PyInterpreterFrame, previous));
	P("frame_code", offsetof(_PyInterpreterFrame, f_code));
	P("frame_lasti", offsetof(_PyInterpreterFrame, prev_instr));
#if PY_VERSION_HEX < 0x030C0000
	P("frame_entry", offsetof(_PyInterpreterFrame, is_entry));
#else
	P("frame_entry", offsetof(_PyInterpreterFrame, owner));
	P("owned_by_cstack", FRAME_OWNED_BY_CSTACK);
#endif
#else
	P("tstate_frame", offsetof(PyThreadState, current_frame));
	P("cframe_current_frame", 0xffff);
	P("frame_previous", offsetof(_PyInterpreterFrame, previous));
	P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
	P("frame_lasti", offsetof(_PyInterpreterFrame, instr_ptr));
	P("frame_entry", offsetof(_PyInterpreterFrame, owner));
	P("owned_by_cstack", FRAME_OWNED_BY_CSTACK);
#endif
#if PY_VERSION_HEX < 0x030B0000
	P("code_name", offsetof(PyCodeObject, co_name));
	P("code_adaptive", 0);
#else
	P("code_name", offsetof(PyCodeObject, co_qualname));
	P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#endif
	P("code_filename", offsetof(PyCodeObject, co_filename));
	P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX < 0x030A0000
	P("code_linetable", offsetof(PyCodeObject, co_lnotab));
#else
	P("code_linetable", offsetof(PyCodeObject, co_linetable));
#endif
	P("unicode_length", offsetof(PyASCIIObject, length));
	P("unicode_state", offsetof(PyASCIIObject, state));
	P("unicode_ascii_data", sizeof(PyASCIIObject));
	P("unicode_compact_data", sizeof(PyCompactUnicodeObject));
	P("bytes_size", offsetof(PyVarObject, ob_size));
	P("bytes_data", offsetof(PyBytesObject, ob_sval));
	return 0;
}
