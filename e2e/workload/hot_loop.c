/* The e2e suite's workload: burns CPU in one named function, so a profile
 * that caught it shows `kiln_e2e_hot_loop` on its stacks. Built static
 * (the image holds nothing else), with frame pointers and symbols kept.
 * Exits on SIGTERM so a pod deletion is quick. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

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

int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    uint64_t state = 0x9e3779b97f4a7c15u;
    fprintf(stderr, "kiln-e2e-workload: burning CPU in kiln_e2e_hot_loop\n");
    while (!stopping) {
        state = kiln_e2e_hot_loop(state);
    }
    fprintf(stderr, "kiln-e2e-workload: stopping (%llu)\n", (unsigned long long)state);
    return 0;
}
