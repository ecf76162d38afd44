#!/usr/bin/env python3
"""How many cores of work this machine gives at once: N processes spin
for 3 s each; prints their summed loop count against one process's, and
the steal time /proc/stat counted meanwhile."""
import multiprocessing as mp, sys, time


def spin(q):
    end = time.time() + 3
    n = 0
    while time.time() < end:
        n += 1
    q.put(n)


def steal():
    fields = open("/proc/stat").readline().split()
    return int(fields[8]), sum(int(f) for f in fields[1:9])


one = None
for n in [int(a) for a in sys.argv[1:]]:
    q = mp.Queue()
    s0, t0 = steal()
    procs = [mp.Process(target=spin, args=(q,)) for _ in range(n)]
    for p in procs:
        p.start()
    total = sum(q.get() for _ in procs)
    for p in procs:
        p.join()
    s1, t1 = steal()
    one = one or total
    print(f"probe {n:2} spinners: {total / one:5.2f} x one spinner, steal {100 * (s1 - s0) / max(1, t1 - t0):.1f} % of CPU time")
