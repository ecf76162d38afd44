/* Test workload: runs a spin loop from anonymous executable memory, as JIT
 * code does, so the agent looks for a perf map to name it. Built static, so
 * it runs in a bare chroot. */
#include <string.h>
#include <sys/mman.h>

int main(void)
{
	/* inc %rax; jmp .-3 */
	static const unsigned char code[] = { 0x48, 0xff, 0xc0, 0xeb, 0xfb };
	void *page = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return 1;
	memcpy(page, code, sizeof(code));
	((void (*)(void))page)();
	return 0;
}
