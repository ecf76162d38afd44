/* Test workload: maps COUNT distinct files executable (as a process with
 * tens of thousands of mapped objects would), then spins in a named
 * function. Usage: many_mappings DIR COUNT */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((noinline)) void kiln_many_mappings_spin(void)
{
	volatile unsigned long counter = 0;
	for (;;)
		counter++;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	long count = strtol(argv[2], 0, 10);
	char page[4096] = { 0x7f, 'E', 'L', 'F' };
	char path[4096];
	for (long i = 0; i < count; i++) {
		snprintf(path, sizeof(path), "%s/obj-%ld", argv[1], i);
		int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0700);
		if (fd < 0 || write(fd, page, sizeof(page)) != sizeof(page))
			return 1;
		if (mmap(0, sizeof(page), PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
			return 1;
		close(fd);
	}
	/* Tell the test the mappings are in place. */
	snprintf(path, sizeof(path), "%s/ready", argv[1]);
	close(open(path, O_CREAT | O_WRONLY, 0600));
	kiln_many_mappings_spin();
	return 0;
}
