// The e2e suite's JVM workload (check 8): a hot method called by a named caller, forever, run
// by a plain `java -cp /app KilnE2e` with no profiling flags. The hot method loops long enough
// per call for the JIT to compile it on stack replacement while its caller stays interpreted,
// so the agent's walk crosses a compiled frame and an interpreted one.
public class KilnE2e {
    static long kilnE2eHot(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) {
            x = (x * 31 + i) % 1000003;
        }
        return x;
    }

    static long kilnE2eCaller(long n) {
        return kilnE2eHot(n) + 1;
    }

    public static void main(String[] args) {
        long sink = 0;
        while (true) {
            sink += kilnE2eCaller(50_000_000L);
            // Never true in practice; keeps the JIT from dropping the work.
            if (sink == 42) {
                System.out.println(sink);
            }
        }
    }
}
