#!/usr/bin/env python3
"""Samples one process's threads for a while: per thread name, CPU seconds
used in the window, and how often each was seen running or asleep, by
kernel wait channel, and the machine's busy cores and steal meanwhile.
Usage: thread_states.py PID SECONDS"""
import collections, os, sys, time

pid, seconds = int(sys.argv[1]), float(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")


def snapshot():
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            wchan = open(f"/proc/{pid}/task/{tid}/wchan").read().strip() or "-"
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (name, rest[0], wchan, int(rest[11]) + int(rest[12]))
    return out


def machine():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return f[3] + f[4], f[7], sum(f)  # idle+iowait, steal, all


m0 = machine()
first = snapshot()
states = collections.Counter()
samples = 0
end = time.time() + seconds
while time.time() < end:
    for name, state, wchan, _ in snapshot().values():
        key = (name.rstrip("0123456789-"), state, wchan if state != "R" else "")
        states[key] += 1
    samples += 1
    time.sleep(0.01)
last = snapshot()
m1 = machine()
all_ticks = max(1, m1[2] - m0[2])
cores = os.cpu_count()
print(f"machine: busy {cores * (1 - (m1[0] - m0[0]) / all_ticks):.2f} of {cores} cores, steal {100 * (m1[1] - m0[1]) / all_ticks:.1f} %")
cpu = collections.Counter()
threads = collections.Counter()
for tid, (name, _, _, ticks) in last.items():
    base = first.get(tid, (name, "", "", 0))[3]
    cpu[name.rstrip("0123456789-")] += (ticks - base) / tick
    threads[name.rstrip("0123456789-")] += 1
print(f"threads over {seconds}s, {samples} samples")
for name, secs in cpu.most_common():
    print(f"  cpu {name:24} {threads[name]:3} threads {secs:7.2f} s ({secs / seconds:.2f} cores)")
for (name, state, wchan), n in states.most_common(40):
    print(f"  seen {name:24} {state} {wchan:28} {n / samples:6.2f} threads on average")
