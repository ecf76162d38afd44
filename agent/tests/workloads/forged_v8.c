/* Test workload: a shared library named libnode.so.115 exporting V8's
 * postmortem v8dbg_* constants with garbage values (negative, huge, zero,
 * tags that contradict each other). Loaded by forged_main.c. */
#include <stdint.h>

const int32_t v8dbg_TaggedSize = 0x7fffffff;
const int32_t v8dbg_HeapObjectTagMask = -1;
const int32_t v8dbg_HeapObjectTag = 9;
const int32_t v8dbg_SmiTagMask = 0;
const int64_t v8dbg_SmiShiftSize = INT64_MIN;
const int64_t v8dbg_off_fp_function = INT64_MAX;
const int64_t v8dbg_off_fp_context = INT64_MIN;
const int32_t v8dbg_type_JSFunction__JS_FUNCTION_TYPE = -5;
const int32_t v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE = 1 << 30;
const int64_t v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object = -8;
const int64_t v8dbg_class_JSFunction__shared__SharedFunctionInfo = 1ll << 50;

__attribute__((noinline)) void kiln_forged_hot(void)
{
	for (;;)
		__asm__ volatile(".rept 64\n\tnop\n\t.endr");
}

void kiln_forged_setup(const char *mode)
{
	(void)mode;
}
