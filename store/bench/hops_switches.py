#!/usr/bin/env python3
"""Sorts a store's sched_switch samples by what the switching thread waited
for (issue 50): the blocking pool (its lock, its idle threads), an ingest's
WAL, apply-turn and ingest-turn waits, the async workers parking and being
woken, the WAL writer; a switch away from a runnable thread is preemption,
whatever its stack. Prints each kind's share of all the switches.
Usage: perf script -F comm,tid,ip,sym,trace | hops_switches.py"""
import collections, re, sys

# First match wins, over the innermost user frames of a voluntary switch;
# each is (kind, thread name or None, how many innermost frames to look
# at, words that must all appear there).
KINDS = [
    ("WAL writer: fsync", "kiln-wal", 12, ["sync_data"]),
    ("WAL writer: waiting for appends", "kiln-wal", 12, ["Channel<T>::recv"]),
    ("WAL writer: other", "kiln-wal", 12, [""]),
    ("spawn_blocking: the pool's lock", None, 6, ["blocking::pool::Spawner::spawn_task"]),
    ("ingest on the pool: waiting for the WAL fsync", None, 30, ["append_frame_blocking"]),
    ("ingest on the pool: waiting for the shard's apply turn", None, 30, ["apply_turn_blocking"]),
    ("ingest on the pool: waiting for an ingest turn", None, 30, ["ingest_turn_blocking"]),
    ("ingest on the pool: waiting for the cut gate", None, 30, ["blocking_read"]),
    ("async worker: parked", None, 30, ["multi_thread::worker::Context::park"]),
    ("blocking pool: its lock, taken by a pool thread", None, 6, ["lock_contended", "blocking::pool::Inner::run"]),
    ("blocking pool: idle thread, waiting for a task", None, 6, ["blocking::pool::Inner::run"]),
    ("waking a parked async worker", None, 12, ["Unparker::unpark"]),
    ("malloc: an arena's lock", None, 6, ["__lll_lock_wait_private"]),
    ("a std RwLock (head shard, view)", None, 6, ["RwLock>::read_contended"]),
    ("a std RwLock (head shard, view)", None, 6, ["RwLock>::write_contended"]),
    ("other lock contention", None, 6, ["lock_contended"]),
]


def user_frames(frames):
    """The frames below the kernel's entry (syscall or interrupt)."""
    start = 0
    for i, frame in enumerate(frames):
        if frame.startswith(("entry_SYSCALL", "asm_")):
            start = i + 1
    return frames[start:]


def kind_of(comm, state, frames):
    if state.startswith("R"):
        return "preempted (runnable), any stack"
    user = user_frames(frames)
    for kind, thread, depth, words in KINDS:
        if thread is not None and thread != comm:
            continue
        text = "\n".join(user[:depth])
        if all(w in text for w in words):
            return kind
    return "other: " + " <- ".join(f[:60] for f in user[:3])


counts = collections.Counter()
header, stack = None, []


def flush():
    if header is None:
        return
    comm = header.split()[0]
    state = re.search(r"prev_state=(\S+)", header)
    frames = [re.sub(r"^\s*[0-9a-f]+\s+", "", f).split(" (")[0] for f in stack]
    counts[kind_of(comm, state.group(1) if state else "", frames)] += 1


for line in sys.stdin:
    if not line.strip():
        flush()
        header, stack = None, []
    elif line.startswith((" ", "\t")):
        stack.append(line.strip())
    else:
        flush()
        header, stack = line, []
flush()
total = sum(counts.values())
print(f"{total} switches recorded")
for kind, n in counts.most_common(20):
    print(f"{100 * n / max(total, 1):5.1f}%  {n:6d}  {kind}")
