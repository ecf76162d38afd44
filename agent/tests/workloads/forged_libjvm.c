/* Test workload: a shared library named libjvm.so that exports HotSpot's
 * debugger tables (gHotSpotVMStructs, gHotSpotVMTypes, the constants, and
 * each entry member's offset and stride) with hostile contents, and a hot
 * function the forged code cache claims. Loaded by forged_main.c, which
 * calls kiln_forged_setup(mode) and then kiln_forged_hot().
 *
 * Modes:
 * - endless: the fields table never ends (no null terminator);
 * - unterminated: a type name runs into an unreadable page;
 * - stride: each table's stride is huge;
 * - segmap: valid tables; the code heap's segment map steps back one
 *   segment at a time across the whole hot function, and past its start;
 * - blob: valid tables; every pc leads to one code blob, an nmethod whose
 *   Method, ConstMethod, ConstantPool and Klass point at each other, whose
 *   symbols claim 64 KiB and end in an unreadable page, and whose frame
 *   size is absurd;
 * - overflow: valid tables whose code blob and method offsets are near
 *   2^64, so base + offset wraps.
 * Strings the agent must never show hold "KILN_FORGED". */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

struct struct_entry {
	const char *type_name;
	const char *field_name;
	const char *type_string;
	int32_t is_static;
	uint64_t offset;
	void *address;
};

struct type_entry {
	const char *type_name;
	uint64_t size;
};

struct int_entry {
	const char *name;
	int32_t value;
};

struct long_entry {
	const char *name;
	uint64_t value;
};

#define MAX_FIELDS 64
static struct struct_entry fields[MAX_FIELDS];
static struct type_entry types[8];
static struct int_entry ints[2];
static struct long_entry longs[2];

struct struct_entry *gHotSpotVMStructs = fields;
uint64_t gHotSpotVMStructEntryTypeNameOffset = offsetof(struct struct_entry, type_name);
uint64_t gHotSpotVMStructEntryFieldNameOffset = offsetof(struct struct_entry, field_name);
uint64_t gHotSpotVMStructEntryTypeStringOffset = offsetof(struct struct_entry, type_string);
uint64_t gHotSpotVMStructEntryIsStaticOffset = offsetof(struct struct_entry, is_static);
uint64_t gHotSpotVMStructEntryOffsetOffset = offsetof(struct struct_entry, offset);
uint64_t gHotSpotVMStructEntryAddressOffset = offsetof(struct struct_entry, address);
uint64_t gHotSpotVMStructEntryArrayStride = sizeof(struct struct_entry);
struct type_entry *gHotSpotVMTypes = types;
uint64_t gHotSpotVMTypeEntryTypeNameOffset = offsetof(struct type_entry, type_name);
uint64_t gHotSpotVMTypeEntrySizeOffset = offsetof(struct type_entry, size);
uint64_t gHotSpotVMTypeEntryArrayStride = sizeof(struct type_entry);
struct int_entry *gHotSpotVMIntConstants = ints;
uint64_t gHotSpotVMIntConstantEntryNameOffset = offsetof(struct int_entry, name);
uint64_t gHotSpotVMIntConstantEntryValueOffset = offsetof(struct int_entry, value);
uint64_t gHotSpotVMIntConstantEntryArrayStride = sizeof(struct int_entry);
struct long_entry *gHotSpotVMLongConstants = longs;
uint64_t gHotSpotVMLongConstantEntryNameOffset = offsetof(struct long_entry, name);
uint64_t gHotSpotVMLongConstantEntryValueOffset = offsetof(struct long_entry, value);
uint64_t gHotSpotVMLongConstantEntryArrayStride = sizeof(struct long_entry);

/* The code cache the tables describe. */
static uint64_t low_bound, high_bound;
static struct {
	int32_t len;
	int32_t pad;
	void **data;
} heaps_array;
static void *heaps_array_pointer = &heaps_array;
static void *heap_list[1];
/* A CodeHeap: VirtualSpace _memory at 0 (low, high), _segmap at 32 (its
 * low), _log2_segment_size at 64. */
static uint64_t heap[16];
static unsigned char segment_map[1 << 16];
/* The nmethod's blob, its Method and what those point at: one arena. */
static uint64_t arena[4096] __attribute__((aligned(4096)));

__attribute__((noinline)) void kiln_forged_hot(void)
{
	/* Many distinct pcs, so each sample asks for a new blob. */
	for (;;)
		__asm__ volatile(".rept 4096\n\tnop\n\t.endr");
}

static int field_count;

static void add_field(const char *type, const char *field, const char *type_string,
		      uint64_t offset)
{
	fields[field_count++] = (struct struct_entry){ type, field, type_string, 0, offset, 0 };
}

static void add_static(const char *type, const char *field, void *address)
{
	fields[field_count++] = (struct struct_entry){ type, field, "address", 1, 0, address };
}

/* A page of text with no NUL, followed by an unreadable page. */
static char *unterminated(void)
{
	char *pages = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(pages, 'K', 4096);
	memcpy(pages, "KILN_FORGED", 11);
	mprotect(pages + 4096, 4096, PROT_NONE);
	return pages;
}

static void valid_tables(uint64_t blob_offset, uint64_t method_offset)
{
	add_static("CodeCache", "_heaps", &heaps_array_pointer);
	add_static("CodeCache", "_low_bound", &low_bound);
	add_static("CodeCache", "_high_bound", &high_bound);
	add_field("GrowableArrayBase", "_len", "int", 0);
	add_field("GrowableArray<int>", "_data", "int*", 8);
	add_field("CodeHeap", "_memory", "VirtualSpace", 0);
	add_field("CodeHeap", "_segmap", "VirtualSpace", 32);
	add_field("CodeHeap", "_log2_segment_size", "int", 64);
	add_field("VirtualSpace", "_low", "char*", 0);
	add_field("VirtualSpace", "_high", "char*", 8);
	add_field("HeapBlock", "_header", "HeapBlock::Header", 0);
	add_field("HeapBlock::Header", "_used", "bool", 8);
	add_field("CodeBlob", "_name", "char*", blob_offset + 0);
	add_field("CodeBlob", "_size", "int", blob_offset + 8);
	add_field("CodeBlob", "_frame_complete_offset", "int", blob_offset + 12);
	add_field("CodeBlob", "_frame_size", "int", blob_offset + 16);
	add_field("CodeBlob", "_code_begin", "address", blob_offset + 24);
	add_field("CodeBlob", "_code_end", "address", blob_offset + 32);
	add_field("nmethod", "_method", "Method*", blob_offset + 40);
	add_field("Method", "_constMethod", "ConstMethod*", method_offset);
	add_field("ConstMethod", "_constants", "ConstantPool*", method_offset + 8);
	add_field("ConstMethod", "_code_size", "u2", 16);
	add_field("ConstMethod", "_name_index", "u2", 18);
	add_field("ConstMethod", "_signature_index", "u2", 20);
	add_field("ConstantPool", "_pool_holder", "Klass*", method_offset + 24);
	add_field("ConstantPool", "_length", "int", 32);
	add_field("Klass", "_name", "Symbol*", method_offset + 40);
	add_field("Symbol", "_length", "u2", 0);
	add_field("Symbol", "_body", "u1", 8);
	types[0] = (struct type_entry){ "HeapBlock", 16 };
	types[1] = (struct type_entry){ "ConstMethod", 48 };
	types[2] = (struct type_entry){ "ConstantPool", 64 };
}

void kiln_forged_setup(const char *mode)
{
	uint64_t hot = (uint64_t)(uintptr_t)kiln_forged_hot & ~(uint64_t)4095;
	/* The heap covers the hot function's pages. */
	low_bound = hot;
	high_bound = hot + (1 << 16) * 16;
	heap[0] = hot;
	heap[1] = high_bound;
	heap[4] = (uint64_t)(uintptr_t)segment_map;
	heap[8] = 4;
	heap_list[0] = heap;
	heaps_array.len = 1;
	heaps_array.data = heap_list;

	if (!strcmp(mode, "endless")) {
		/* 1 MiB of entries, none null. */
		size_t size = 1 << 20;
		struct struct_entry *endless =
			mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		for (size_t i = 0; i < size / sizeof(*endless); i++)
			endless[i] = (struct struct_entry){ "CodeCache", "KILN_FORGED", "int", 0, i, 0 };
		gHotSpotVMStructs = endless;
		return;
	}
	if (!strcmp(mode, "unterminated")) {
		add_field(unterminated(), "_len", "int", 0);
		return;
	}
	if (!strcmp(mode, "stride")) {
		gHotSpotVMStructEntryArrayStride = 1ull << 40;
		gHotSpotVMTypeEntryArrayStride = 1ull << 40;
		return;
	}
	if (!strcmp(mode, "segmap")) {
		valid_tables(0, 0);
		/* Every segment says "one back", and the hot function lies
		 * 60,000 segments into the heap: each pc is a walk of 60,000
		 * steps, and segment 0 steps before the heap. */
		low_bound = heap[0] = hot - 60000 * 16;
		memset(segment_map, 1, sizeof(segment_map));
		return;
	}

	/* blob and overflow: one block at the heap's start for every pc. */
	for (size_t i = 0; i < sizeof(segment_map); i++)
		segment_map[i] = i < 255 ? i : 1 + (i % 254);
	uint64_t block = hot;
	uint64_t blob_address = block + 16;
	uint64_t *blob = arena;
	uint64_t *method = arena + 256;
	uint64_t blob_offset = (uint64_t)(uintptr_t)blob - blob_address;
	uint64_t method_offset = 0;
	if (!strcmp(mode, "overflow")) {
		/* Offsets near 2^64: base + offset wraps around. */
		blob_offset = (uint64_t)(uintptr_t)blob - blob_address;
		method_offset = UINT64_MAX - 15;
	}
	valid_tables(blob_offset, method_offset);
	char *symbol = unterminated() + 4096 - 64;
	memcpy(symbol, "\xe8\x03\0\0\0\0\0\0KILN_FORGED", 19);
	blob[0] = (uint64_t)(uintptr_t)"nmethod";
	((uint32_t *)blob)[2] = 1 << 30;		/* _size */
	((int32_t *)blob)[3] = 0;			/* _frame_complete_offset */
	((int32_t *)blob)[4] = 0x7fffffff;		/* _frame_size: absurd */
	blob[3] = blob_address;			/* _code_begin */
	blob[4] = high_bound;			/* _code_end */
	if (!strcmp(mode, "overflow"))
		blob[5] = UINT64_MAX & ~(uint64_t)7; /* _method near 2^64 */
	else
		blob[5] = (uint64_t)(uintptr_t)method;
	/* Method -> ConstMethod = itself -> ConstantPool = itself -> holder =
	 * itself, whose name is the endless symbol. */
	method[0] = (uint64_t)(uintptr_t)method;
	method[1] = (uint64_t)(uintptr_t)method;
	((uint16_t *)method)[8] = 0xffff;
	((uint16_t *)method)[9] = 1;
	((uint16_t *)method)[10] = 2;
	method[3] = (uint64_t)(uintptr_t)method;
	((uint32_t *)method)[8] = 0xffffffff;
	method[5] = (uint64_t)(uintptr_t)symbol;
	/* Pool slots 1 and 2 (after the 64-byte pool): the symbol too. */
	method[8 + 1] = (uint64_t)(uintptr_t)symbol;
	method[8 + 2] = (uint64_t)(uintptr_t)symbol;
}
