/* Test workload: loads the forged runtime library given as argv[1] and
 * runs it: kiln_forged_setup(argv[2]), then its hot function forever.
 * With "churn" as argv[1], instead loads and unloads argv[2] and argv[3]
 * (two copies of one library) in turn, running kiln_churn_hot in each
 * while it is loaded. Dynamically linked: the image carries libc. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc > 3 && !strcmp(argv[1], "churn")) {
		for (unsigned long i = 0;; i++) {
			void *library = dlopen(argv[2 + i % 2], RTLD_NOW | RTLD_LOCAL);
			if (!library) {
				fprintf(stderr, "%s\n", dlerror());
				return 1;
			}
			void (*hot)(void) = (void (*)(void))dlsym(library, "kiln_churn_hot");
			if (!hot)
				return 1;
			hot();
			dlclose(library);
		}
	}
	if (argc < 3)
		return 2;
	void *library = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
	if (!library) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void (*setup)(const char *) = (void (*)(const char *))dlsym(library, "kiln_forged_setup");
	void (*hot)(void) = (void (*)(void))dlsym(library, "kiln_forged_hot");
	if (!setup || !hot)
		return 1;
	setup(argv[2]);
	hot();
	return 0;
}
