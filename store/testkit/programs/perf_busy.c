/* A CPU-bound program for `perf record` in kiln-testkit's real_inputs:
 * main calls left and right, which both call mix, so a recording has
 * distinct stacks of several frames. Built with frame pointers so that
 * `perf record -g` unwinds it, and stripped in one build so that its
 * frames are addresses in a file with a build ID and no symbols.
 *
 * Usage: perf_busy SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) static unsigned long mix(unsigned long x) {
    for (int i = 0; i < 1000; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    }
    return x;
}

/* The additions after each call keep them from becoming tail calls, which
 * would leave left and right off the stacks. */
__attribute__((noinline)) static unsigned long left(unsigned long x) {
    return mix(x) + (x & 1);
}

__attribute__((noinline)) static unsigned long right(unsigned long x) {
    return mix(x + 7) + (x & 3);
}

static double since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0.5;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned long acc = 0;
    do {
        for (int i = 0; i < 1000; i++) {
            acc += (i & 1) ? left(acc) : right(acc);
        }
    } while (since(&start) < seconds);
    printf("%lu\n", acc);
    return 0;
}
