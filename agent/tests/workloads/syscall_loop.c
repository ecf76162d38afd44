/*
 * Test workload for kiln-agent: spends its time in the kernel through raw
 * getppid syscalls issued from syscall_heavy_loop itself (inline asm, so the
 * user frame under the kernel frames is this function, not a libc wrapper).
 */
#include <stdint.h>

volatile uint64_t sink;

__attribute__((noinline)) void syscall_heavy_loop(void)
{
	for (;;) {
		long ret;
		__asm__ volatile("syscall"
				 : "=a"(ret)
				 : "a"(110L) /* __NR_getppid on x86_64 */
				 : "rcx", "r11", "memory");
		sink += (uint64_t)ret;
	}
}

int main(void)
{
	syscall_heavy_loop();
	return 0;
}
