/*
 * The pod sandbox's first process: it holds the pod's namespaces open and
 * does nothing else. As PID 1 of a pod that shares its PID namespace it also
 * reaps orphans, and it exits on SIGINT or SIGTERM (PID 1 gets no default
 * signal handling, so without handlers it could only be killed).
 * Built static, so its image holds this one file.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

static void stop(int signal_number)
{
	(void)signal_number;
	_exit(0);
}

static void reap(int signal_number)
{
	int saved_errno = errno;
	(void)signal_number;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved_errno;
}

static int handle(int signal_number, void (*handler)(int))
{
	struct sigaction action;
	memset(&action, 0, sizeof(action));
	action.sa_handler = handler;
	action.sa_flags = SA_RESTART | (signal_number == SIGCHLD ? SA_NOCLDSTOP : 0);
	sigemptyset(&action.sa_mask);
	return sigaction(signal_number, &action, NULL);
}

int main(int argc, char **argv)
{
	(void)argv;
	if (argc != 1) {
		static const char usage[] = "pause takes no arguments\n";
		(void)!write(2, usage, sizeof(usage) - 1);
		return 2;
	}
	if (handle(SIGINT, stop) != 0 || handle(SIGTERM, stop) != 0 || handle(SIGCHLD, reap) != 0) {
		static const char failed[] = "pause: sigaction failed\n";
		(void)!write(2, failed, sizeof(failed) - 1);
		return 1;
	}
	for (;;)
		pause();
}
