/* The e2e suite's workload: burns CPU in one named function, so a profile
 * that caught it shows `kiln_e2e_hot_loop` on its stacks, while a second
 * thread sleeps in another, so its off-CPU profile shows
 * `kiln_e2e_sleeper` with all of the wall time. Built static (the image
 * holds nothing else), with frame pointers and symbols kept. Exits on
 * SIGTERM so a pod deletion is quick. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static volatile sig_atomic_t stopping;

static void stop(int signal_number) {
    (void)signal_number;
    stopping = 1;
}

/* Not inlined and not static, so the symbol survives and owns the samples. */
__attribute__((noinline)) uint64_t kiln_e2e_hot_loop(uint64_t seed) {
    uint64_t state = seed;
    for (uint32_t round = 0; round < 50000000u; round++) {
        /* xorshift: cheap, and the compiler cannot fold it away. */
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
    }
    return state;
}

/* Sleeps 100 ms at a time, all of its life: ten blocks a second, far
 * under any capture budget, so its off-CPU time is its wall time. */
__attribute__((noinline)) void kiln_e2e_sleeper(void) {
    const struct timespec pause = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
    while (!stopping) {
        nanosleep(&pause, NULL);
    }
}

static void *sleeper_main(void *unused) {
    (void)unused;
    kiln_e2e_sleeper();
    return NULL;
}

int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    pthread_t sleeper;
    if (pthread_create(&sleeper, NULL, sleeper_main, NULL) != 0) {
        fprintf(stderr, "kiln-e2e-workload: cannot start the sleeping thread\n");
        return 1;
    }
    uint64_t state = 0x9e3779b97f4a7c15u;
    fprintf(stderr, "kiln-e2e-workload: burning CPU in kiln_e2e_hot_loop\n");
    while (!stopping) {
        state = kiln_e2e_hot_loop(state);
    }
    fprintf(stderr, "kiln-e2e-workload: stopping (%llu)\n", (unsigned long long)state);
    return 0;
}
