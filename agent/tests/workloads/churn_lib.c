/* Test workload: a library forged_main.c loads, runs for a few
 * milliseconds and unloads, again and again (the code is unmapped under
 * the agent between a sample and its symbolization). */
__attribute__((noinline)) void kiln_churn_hot(void)
{
	volatile unsigned long counter = 0;
	while (counter < 2000000)
		counter++;
}
