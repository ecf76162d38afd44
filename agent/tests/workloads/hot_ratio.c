/*
 * Test workload for kiln-agent: two hot functions that burn thread CPU time
 * in a 3:1 ratio, measured with CLOCK_THREAD_CPUTIME_ID so the ratio holds
 * whatever the CPU, its frequency or the loop alignment. Each function keeps
 * its hot loop inside itself (no calls but a rare clock read), so a sample
 * lands in its own frame. Usage: hot_ratio [A_MS B_MS]
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

volatile uint64_t sink;

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void hot_three_parts(uint64_t budget_ns)
{
	uint64_t end = thread_cpu_ns() + budget_ns;
	uint64_t x = sink;
	do {
		for (int i = 0; i < 20000; i++)
			x = x * 6364136223846793005ull + (uint64_t)i;
	} while (thread_cpu_ns() < end);
	sink = x;
}

__attribute__((noinline)) void hot_one_part(uint64_t budget_ns)
{
	uint64_t end = thread_cpu_ns() + budget_ns;
	uint64_t x = sink + 1;
	do {
		for (int i = 0; i < 20000; i++)
			x = x * 2862933555777941757ull + (uint64_t)i;
	} while (thread_cpu_ns() < end);
	sink = x;
}

int main(int argc, char **argv)
{
	uint64_t a_ms = argc > 2 ? strtoull(argv[1], 0, 10) : 30;
	uint64_t b_ms = argc > 2 ? strtoull(argv[2], 0, 10) : 10;
	uint64_t rounds = argc > 3 ? strtoull(argv[3], 0, 10) : 0;
	for (uint64_t round = 0; rounds == 0 || round < rounds; round++) {
		hot_three_parts(a_ms * 1000000u);
		hot_one_part(b_ms * 1000000u);
	}
	return 0;
}
