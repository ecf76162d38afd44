#!/usr/bin/env python3
"""Folds `perf script` output of sched_switch samples: counts each stack's
innermost user-space frames (where a thread went to sleep), top 40.
Usage: perf script -F comm,tid,ip,sym,dso | fold_switches.py [DEPTH]"""
import collections, re, sys

depth = int(sys.argv[1]) if len(sys.argv) > 1 else 10
counts = collections.Counter()
frames = []


def flush():
    user = [f for f in frames if "[kernel.kallsyms]" not in f]
    if frames:
        names = [re.sub(r"^\s*[0-9a-f]+\s+", "", f).split(" (")[0] for f in user[:depth]]
        counts[" <- ".join(names) or "(kernel only)"] += 1


for line in sys.stdin:
    if not line.strip():
        flush()
        frames = []
    elif line.startswith((" ", "\t")):
        frames.append(line.strip())
flush()
total = sum(counts.values())
print(f"{total} switches sampled")
for stack, n in counts.most_common(40):
    print(f"{100 * n / total:5.1f}%  {stack}")
