/*
 * Test workload for kiln-agent's off-CPU profiles: a known sleeping stack
 * and a known lock-waiting stack, each timing its own blocked wall time.
 *
 * It waits for a line on stdin (so the agent is attached first), then runs
 * ROUNDS rounds on three threads:
 * - kiln_sleeper: kiln_sleep_known() sleeps SLEEP_MS in nanosleep;
 * - kiln_holder: takes the mutex, lets the waiter go, keeps the mutex for
 *   HOLD_MS (a sleep under kiln_hold_lock()), releases it, rests REST_MS;
 * - kiln_waiter: waits for its turn, then kiln_lock_wait() blocks in
 *   pthread_mutex_lock until the holder releases the mutex.
 * It prints the wall time spent inside kiln_sleep_known's nanosleep calls
 * and kiln_lock_wait's pthread_mutex_lock calls, and the time the sleeper
 * and the waiter spent runnable but waiting for a CPU (schedstat; on a
 * busy machine, after each wakeup), in ns, and exits:
 *   sleep_ns=N lock_ns=N sleep_runnable_ns=N lock_runnable_ns=N
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define ROUNDS 100
#define SLEEP_MS 10
#define HOLD_MS 30
#define REST_MS 5

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static sem_t turn;
static uint64_t sleep_ns;
static uint64_t lock_ns;
static uint64_t sleep_runnable_ns;
static uint64_t lock_runnable_ns;

/* This thread's time runnable but not running, ns (schedstat's second field). */
static uint64_t runnable_ns(void)
{
	unsigned long long on_cpu = 0, waiting = 0;
	FILE *f = fopen("/proc/thread-self/schedstat", "r");
	if (!f)
		return 0;
	if (fscanf(f, "%llu %llu", &on_cpu, &waiting) != 2)
		waiting = 0;
	fclose(f);
	return waiting;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ms * 1000000L };
	while (nanosleep(&ts, &ts) != 0)
		;
}

__attribute__((noinline)) void kiln_sleep_known(void)
{
	uint64_t start = now_ns();
	sleep_ms(SLEEP_MS);
	sleep_ns += now_ns() - start;
}

__attribute__((noinline)) void kiln_hold_lock(void)
{
	sleep_ms(HOLD_MS);
}

__attribute__((noinline)) void kiln_lock_wait(void)
{
	uint64_t start = now_ns();
	pthread_mutex_lock(&lock);
	lock_ns += now_ns() - start;
	pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) void *kiln_sleeper(void *arg)
{
	(void)arg;
	uint64_t runnable = runnable_ns();
	for (int i = 0; i < ROUNDS * (HOLD_MS + REST_MS) / SLEEP_MS; i++)
		kiln_sleep_known();
	sleep_runnable_ns = runnable_ns() - runnable;
	return NULL;
}

__attribute__((noinline)) void *kiln_holder(void *arg)
{
	(void)arg;
	for (int i = 0; i < ROUNDS; i++) {
		pthread_mutex_lock(&lock);
		sem_post(&turn);
		kiln_hold_lock();
		pthread_mutex_unlock(&lock);
		sleep_ms(REST_MS);
	}
	return NULL;
}

__attribute__((noinline)) void *kiln_waiter(void *arg)
{
	(void)arg;
	for (int i = 0; i < ROUNDS; i++) {
		while (sem_wait(&turn) != 0)
			;
		uint64_t runnable = runnable_ns();
		kiln_lock_wait();
		lock_runnable_ns += runnable_ns() - runnable;
	}
	return NULL;
}

int main(void)
{
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	sem_init(&turn, 0, 0);
	pthread_t threads[3];
	pthread_create(&threads[0], NULL, kiln_sleeper, NULL);
	pthread_create(&threads[1], NULL, kiln_holder, NULL);
	pthread_create(&threads[2], NULL, kiln_waiter, NULL);
	for (int i = 0; i < 3; i++)
		pthread_join(threads[i], NULL);
	printf("sleep_ns=%llu lock_ns=%llu sleep_runnable_ns=%llu lock_runnable_ns=%llu\n",
	       (unsigned long long)sleep_ns, (unsigned long long)lock_ns,
	       (unsigned long long)sleep_runnable_ns, (unsigned long long)lock_runnable_ns);
	return 0;
}
