/*
 * Benchmark workload for off-CPU profiling (agent/bench/off_cpu.sh): two
 * threads hand a byte back and forth through two pipes, so each hand-off
 * blocks one thread and wakes the other, paced to about RATE voluntary
 * context switches a second: two per round trip, and one for the sleep
 * that paces each burst of round trips (bursts every millisecond, or one
 * round trip per burst below 3000 a second). Past what the machine does,
 * it runs flat out. Usage: switch_rate RATE
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2];
static int pong[2];

__attribute__((noinline)) void *kiln_ponger(void *arg)
{
	(void)arg;
	char byte;
	while (read(ping[0], &byte, 1) == 1)
		if (write(pong[1], &byte, 1) != 1)
			break;
	return NULL;
}

__attribute__((noinline)) void kiln_round_trip(void)
{
	char byte = 1;
	if (write(ping[1], &byte, 1) != 1 || read(pong[0], &byte, 1) != 1)
		exit(1);
}

int main(int argc, char **argv)
{
	long rate = argc > 1 ? atol(argv[1]) : 1000;
	if (rate < 1)
		rate = 1;
	/* Round trips per 1 ms burst: two switches each, one for the sleep. */
	long per_burst = (rate / 1000 - 1) / 2;
	long every_ns = 1000000;
	if (per_burst < 1) {
		per_burst = 1;
		every_ns = 3000000000L / rate;
	}
	if (pipe(ping) != 0 || pipe(pong) != 0)
		return 1;
	pthread_t thread;
	pthread_create(&thread, NULL, kiln_ponger, NULL);
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (;;) {
		for (long i = 0; i < per_burst; i++)
			kiln_round_trip();
		next.tv_nsec += every_ns;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec += 1;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
}
