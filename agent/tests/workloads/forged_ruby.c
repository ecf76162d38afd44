/* Test workload: a shared library named libruby.so.3.1 that exports what
 * the agent looks for in Debian's libruby (a thread-local ruby_current_ec
 * reached through a DTPMOD64 slot, ruby_version "3.1.2", rb_vm_exec) over
 * a hostile VM: an execution context whose VM stack holds control frames
 * to its very end, each naming a different iseq, which the hot loop moves
 * on every pass so every sample meets iseqs not seen before; each iseq
 * claims the largest instruction and line tables the agent accepts, in
 * memory that is mapped. Loaded by forged_main.c. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

__thread void *ruby_current_ec;
const char ruby_version[] = "3.1.2";

#define ISEQS 4096
#define FRAMES 4096
static uint64_t ec[8];
static uint64_t *vm_stack;
static uint64_t *iseqs;
static uint64_t body[32];
static uint64_t label[8];
static uint64_t flags_word;

__attribute__((noinline)) void rb_vm_exec(void)
{
	uint64_t *frames = vm_stack;
	for (uint64_t pass = 0;; pass++) {
		/* Control frames are 8 words: pc, sp, iseq, self, ep, ... */
		for (uint64_t i = 0; i < 64; i++)
			frames[i * 8 + 2] = (uint64_t)(uintptr_t)(iseqs + ((pass + i) % ISEQS) * 4);
		__asm__ volatile(".rept 64\n\tnop\n\t.endr" ::: "memory");
	}
}

void kiln_forged_hot(void)
{
	ruby_current_ec = ec;
	rb_vm_exec();
}

void kiln_forged_setup(const char *mode)
{
	(void)mode;
	size_t tables = 8 << 20;
	char *big = mmap(0, tables, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(big, 0x5a, tables);
	vm_stack = mmap(0, FRAMES * 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	iseqs = mmap(0, ISEQS * 32, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (int i = 0; i < ISEQS; i++) {
		iseqs[i * 4] = 0x1a | (7 << 12);	/* T_IMEMO, imemo_iseq */
		iseqs[i * 4 + 2] = (uint64_t)(uintptr_t)body;
	}
	/* A heap String "kiln_forged_ruby". */
	label[0] = 0x05 | (1 << 13);
	label[2] = 16;
	label[3] = (uint64_t)(uintptr_t)"kiln_forged_ruby";
	uint32_t *body32 = (uint32_t *)body;
	body32[1] = 0xffffffff;			/* iseq_size */
	body[1] = (uint64_t)(uintptr_t)big;	/* iseq_encoded */
	body[8] = (uint64_t)(uintptr_t)label;	/* pathobj */
	body[10] = (uint64_t)(uintptr_t)label;	/* label */
	body[11] = 3;				/* first_lineno: Fixnum 1 */
	body[15] = (uint64_t)(uintptr_t)big;	/* insns_info.body */
	body[16] = 0;				/* positions: succinct */
	body32[34] = 16 << 10;			/* insns_info.size */
	body[18] = (uint64_t)(uintptr_t)big;	/* succ_index_table */
	for (int i = 0; i < FRAMES; i++) {
		vm_stack[i * 8 + 0] = (uint64_t)(uintptr_t)big;
		vm_stack[i * 8 + 2] = (uint64_t)(uintptr_t)(iseqs + (i % ISEQS) * 4);
		vm_stack[i * 8 + 4] = (uint64_t)(uintptr_t)&flags_word;
	}
	ec[0] = (uint64_t)(uintptr_t)vm_stack;
	ec[1] = FRAMES * 8;
	ec[2] = (uint64_t)(uintptr_t)vm_stack;
}
