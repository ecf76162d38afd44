/* Test workload: forks short-lived children as fast as it can for SECONDS
 * seconds, then prints how many it forked. Usage: fork_storm SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 10;
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	long forked = 0;
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 > seconds)
			break;
		pid_t child = fork();
		if (child == 0) {
			/* Burn a little CPU so the child can be sampled. */
			volatile unsigned long spin = 0;
			for (int i = 0; i < 1000; i++)
				spin++;
			_exit(0);
		}
		if (child > 0) {
			forked++;
			waitpid(child, 0, 0);
		}
	}
	printf("%ld\n", forked);
	return 0;
}
