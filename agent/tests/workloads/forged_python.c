/* Test workload: a shared library named libpython3.13.so whose _PyRuntime
 * starts with a valid _Py_DebugOffsets table (cookie, 3.13's version,
 * sizes and offsets that pass every check) over hostile objects: the
 * thread list and the frame chain are cycles, and every string and line
 * table claims a huge length and runs into an unreadable page. Its hot
 * function is the eval loop, so the agent interleaves what it reads there.
 * Loaded by forged_main.c. Strings the agent must never show hold
 * "KILN_FORGED". */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

uint64_t _PyRuntime[1 << 12] __attribute__((aligned(4096)));
const uint32_t Py_Version = 0x030d00f0;
uint64_t PyCode_Type[64];

/* Objects: an interpreter, two thread states, a frame, a code object. */
static uint64_t objects[512] __attribute__((aligned(4096)));

__attribute__((noinline)) void _PyEval_EvalFrameDefault(void)
{
	for (;;)
		__asm__ volatile(".rept 256\n\tnop\n\t.endr");
}

void kiln_forged_hot(void)
{
	_PyEval_EvalFrameDefault();
}

/* An object at the end of a page whose next page is unreadable. */
static uint64_t *at_page_end(size_t bytes)
{
	char *pages = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(pages, 'K', 4096);
	memcpy(pages + 4096 - bytes, "KILN_FORGED", 11);
	mprotect(pages + 4096, 4096, PROT_NONE);
	return (uint64_t *)(pages + 4096 - bytes);
}

void kiln_forged_setup(const char *mode)
{
	(void)mode;
	uint64_t *t = _PyRuntime;
	memcpy(t, "xdebugpy", 8);
	t[1] = 0x030d00f0;
	/* Every struct 4 KiB; the words are 3.13's places in the table. */
	int sizes[] = { 3, 6, 19, 28, 34, 44, 64, 67 };
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(*sizes); i++)
		t[sizes[i]] = 4096;
	t[5] = 1024;	/* interpreters.head; main is the word after */
	t[9] = 0;	/* threads.head */
	t[21] = 0;	/* tstate next */
	t[23] = 8;	/* current_frame */
	t[24] = 16;	/* thread_id */
	t[29] = 0;	/* frame previous */
	t[30] = 8;	/* f_executable */
	t[31] = 16;	/* instr_ptr */
	t[33] = 24;	/* owner */
	t[35] = 16;	/* co_filename */
	t[37] = 24;	/* co_qualname */
	t[38] = 32;	/* co_linetable */
	t[39] = 40;	/* co_firstlineno */
	t[43] = 48;	/* co_code_adaptive */
	t[45] = 8;	/* ob_type */
	t[65] = 16;	/* bytes ob_size */
	t[66] = 32;	/* bytes ob_sval */
	t[68] = 32;	/* unicode state */
	t[69] = 16;	/* unicode length */
	t[70] = 48;	/* sizeof(PyASCIIObject) */

	uint64_t *interp = objects, *other = objects + 64, *mine = objects + 128,
		 *frame = objects + 192, *code = objects + 256;
	t[1024 / 8] = (uint64_t)(uintptr_t)interp;
	t[1032 / 8] = (uint64_t)(uintptr_t)interp;
	/* A cycle of two thread states; only the second is this thread. */
	interp[0] = (uint64_t)(uintptr_t)other;
	other[0] = (uint64_t)(uintptr_t)mine;
	other[2] = 1;
	mine[0] = (uint64_t)(uintptr_t)other;
	mine[1] = (uint64_t)(uintptr_t)frame;
	mine[2] = (uint64_t)pthread_self();
	/* A frame that is its own caller. */
	frame[0] = (uint64_t)(uintptr_t)frame;
	frame[1] = (uint64_t)(uintptr_t)code;
	frame[2] = (uint64_t)(uintptr_t)(code + 6);
	frame[3] = 0;
	/* A code object whose strings and line table run off the page. */
	uint64_t *string = at_page_end(64);
	string[1] = 0;
	string[2] = UINT64_MAX / 2;	/* length */
	string[4] = 0x64;		/* state: compact, ASCII, one byte a char */
	uint64_t *bytes = at_page_end(48);
	bytes[2] = UINT64_MAX / 2;	/* ob_size */
	code[1] = (uint64_t)(uintptr_t)PyCode_Type;
	code[2] = (uint64_t)(uintptr_t)string;
	code[3] = (uint64_t)(uintptr_t)string;
	code[4] = (uint64_t)(uintptr_t)bytes;
	code[5] = 1;
}
