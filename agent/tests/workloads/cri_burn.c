/* The workload of the CRI end-to-end test: burns CPU in a hot function whose
 * name says which pod runs it, so the store can be asked for exactly it. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void kiln_e2e_hot_annotated(void) {
    for (unsigned long i = 0; i < 2000000; i++) sink += i * i;
}

__attribute__((noinline)) void kiln_e2e_hot_plain(void) {
    for (unsigned long i = 0; i < 2000000; i++) sink ^= i * 7;
}

static void stop(int signal_number) {
    (void)signal_number;
    _exit(0);
}

int main(int argc, char **argv) {
    signal(SIGTERM, stop);
    if (argc > 1 && strcmp(argv[1], "pause") == 0) {
        for (;;) pause();
    }
    int annotated = argc > 1 && strcmp(argv[1], "annotated") == 0;
    for (;;) {
        if (annotated) kiln_e2e_hot_annotated();
        else kiln_e2e_hot_plain();
        /* Leave the loaded two-core machine some room: about half a core. */
        usleep(2000);
    }
}
