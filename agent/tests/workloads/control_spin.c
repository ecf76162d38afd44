/* Test workload: a well-behaved process whose hot function must still be
 * profiled while hostile processes are targeted next to it. */
__attribute__((noinline)) void kiln_hostile_control(void)
{
	volatile unsigned long counter = 0;
	for (;;)
		counter++;
}

int main(void)
{
	kiln_hostile_control();
	return 0;
}
