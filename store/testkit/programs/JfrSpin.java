// A second of CPU work for the Java Flight Recorder in kiln-testkit's
// real_inputs: `java -XX:StartFlightRecording=... JfrSpin.java` records it
// into a JFR file, a real profile format that is not pprof.
public class JfrSpin {
    public static void main(String[] args) {
        long end = System.nanoTime() + 300_000_000L;
        long acc = 0;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 10_000; i++) {
                acc = acc * 31 + i;
            }
        }
        System.out.println(acc);
    }
}
