/* Test workload: JIT-like code that is mapped, run for a moment and
 * unmapped, again and again, at two addresses in turn, each time with
 * different bytes (so stale caches name stale code); a perf map names
 * both places. Built static, so it runs in a bare image. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void)
{
	unsigned char *places[2] = { (unsigned char *)0x7e0000000000ul,
				     (unsigned char *)0x7e0000100000ul };
	char path[64];
	snprintf(path, sizeof(path), "/tmp/perf-%d.map", getpid());
	FILE *map = fopen(path, "w");
	if (!map)
		return 1;
	fprintf(map, "%lx 1000 kiln_jit_churn_a\n%lx 1000 kiln_jit_churn_b\n",
		(unsigned long)places[0], (unsigned long)places[1]);
	fclose(map);
	for (unsigned long i = 0;; i++) {
		unsigned char *code = mmap(places[i % 2], 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
					   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		if (code == MAP_FAILED)
			return 1;
		/* Padding of i % 64 nops, then: push rbp; mov rbp,rsp;
		 * mov ecx,N; 1: dec ecx; jnz 1b; pop rbp; ret */
		unsigned pad = i % 64;
		memset(code, 0x90, pad);
		static const unsigned char body[] = { 0x55, 0x48, 0x89, 0xe5, 0xb9, 0x00, 0x00,
						      0x20, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0x5d, 0xc3 };
		memcpy(code + pad, body, sizeof(body));
		((void (*)(void))code)();
		munmap(code, 4096);
	}
}
