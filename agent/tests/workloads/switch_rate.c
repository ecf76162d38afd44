/*
 * Benchmark workload for off-CPU profiling (agent/bench/off_cpu.sh): pairs
 * of threads hand a byte back and forth through two pipes, so each hand-off
 * blocks one thread and wakes the other, paced to about RATE voluntary
 * context switches a second in all: two per round trip, and one for the
 * sleep that paces each burst of round trips (bursts every millisecond, or
 * one round trip per burst below 3000 a second per pair). Those are the
 * voluntary switches; where the woken thread preempts the waker on its
 * CPU, the waker's switch is counted as involuntary instead, so the total
 * is what the scheduler's tracepoint sees. More pairs reach higher rates.
 * Past what the machine does, it runs flat out.
 * Usage: switch_rate RATE [PAIRS]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct kiln_pair {
	int ping[2];
	int pong[2];
	long per_burst;
	long every_ns;
};

__attribute__((noinline)) void *kiln_ponger(void *arg)
{
	struct kiln_pair *pair = arg;
	char byte;
	while (read(pair->ping[0], &byte, 1) == 1)
		if (write(pair->pong[1], &byte, 1) != 1)
			break;
	return NULL;
}

__attribute__((noinline)) void kiln_round_trip(struct kiln_pair *pair)
{
	char byte = 1;
	if (write(pair->ping[1], &byte, 1) != 1 || read(pair->pong[0], &byte, 1) != 1)
		exit(1);
}

__attribute__((noinline)) void *kiln_pacer(void *arg)
{
	struct kiln_pair *pair = arg;
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (;;) {
		for (long i = 0; i < pair->per_burst; i++)
			kiln_round_trip(pair);
		next.tv_nsec += pair->every_ns;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec += 1;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	long rate = argc > 1 ? atol(argv[1]) : 1000;
	long pairs = argc > 2 ? atol(argv[2]) : 1;
	if (rate < 1)
		rate = 1;
	if (pairs < 1 || pairs > 64)
		pairs = 1;
	long pair_rate = rate / pairs > 0 ? rate / pairs : 1;
	/* Round trips per 1 ms burst: two switches each, one for the sleep. */
	long per_burst = (pair_rate / 1000 - 1) / 2;
	long every_ns = 1000000;
	if (per_burst < 1) {
		per_burst = 1;
		every_ns = 3000000000L / pair_rate;
	}
	struct kiln_pair *all = calloc((size_t)pairs, sizeof(*all));
	if (all == NULL)
		return 1;
	pthread_t thread;
	for (long p = 0; p < pairs; p++) {
		struct kiln_pair *pair = &all[p];
		pair->per_burst = per_burst;
		pair->every_ns = every_ns;
		if (pipe(pair->ping) != 0 || pipe(pair->pong) != 0)
			return 1;
		if (pthread_create(&thread, NULL, kiln_ponger, pair) != 0)
			return 1;
		if (p > 0 && pthread_create(&thread, NULL, kiln_pacer, pair) != 0)
			return 1;
	}
	kiln_pacer(&all[0]);
	return 0;
}
