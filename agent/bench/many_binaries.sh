#!/usr/bin/env bash
# Agent memory with many distinct binaries (docs/benchmarks.md, row
# binaries.rss): compiles N copies of a small C program
# without frame pointers, each with its own build id, runs them all (niced)
# next to Debian's xz and python3 keeping both cores busy, and profiles the
# whole host with the release agent's default .eh_frame unwinder. Reports
# the agent's CPU (process plus BPF run time) as % of one core, its RSS and
# peak RSS, and its unwinding metrics.
#
# Usage (root): agent/bench/many_binaries.sh [N] [SECONDS] [HZ]   default: 200 60 19
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
count="${1:-200}"
seconds="${2:-60}"
hz="${3:-19}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
# shellcheck source=agent/bench/lib.sh
. "$here/lib.sh"
use_release_agent
start_scratch
sysctl -q kernel.bpf_stats_enabled=1

cat >"$work/spin.c" <<'EOF'
#include <stdint.h>
#include <unistd.h>
volatile uint64_t sink;
__attribute__((noinline)) uint64_t work(uint64_t x) { for (int i = 0; i < 1000000; i++) x = x * 6364136223846793005ull + SEED; return x; }
__attribute__((noinline)) void loop(void) { for (;;) { sink = work(sink); usleep(20000); } }
int main(void) { loop(); return 0; }
EOF
for i in $(seq "$count"); do
  gcc -O2 -fomit-frame-pointer -DSEED="$i" -o "$work/spin-$i" "$work/spin.c"
done
for i in $(seq "$count"); do nice -n 19 "$work/spin-$i" & pids+=($!); done
head -c 300000000 /dev/urandom | base64 >"$work/input.txt"
bash -c "while :; do /usr/bin/xz -6 -T1 -c '$work/input.txt' >/dev/null; done" & pids+=($!)
/usr/bin/python3 -c 'while True: sum(i * i for i in range(100000))' & pids+=($!)
sleep 2

port=17999
"$agent" --all --frequency "$hz" --drain-interval 10s --output-dir "$work/out" \
  --metrics-addr "127.0.0.1:$port" 2>"$work/agent.log" &
apid=$!
sleep 5
ticks="$(getconf CLK_TCK)"
t0="$(awk '{ print $14 + $15 }' "/proc/$apid/stat")"
sleep "$seconds"
t1="$(awk '{ print $14 + $15 }' "/proc/$apid/stat")"
curl -s "http://127.0.0.1:$port/metrics" >"$work/metrics"
rss="$(awk '/^VmRSS:/ { print $2 }' "/proc/$apid/status")"
peak="$(awk '/^VmHWM:/ { print $2 }' "/proc/$apid/status")"
bpf=0
for fd in /proc/"$apid"/fdinfo/*; do
  v="$(awk '$1 == "run_time_ns:" { print $2 }' "$fd" 2>/dev/null || true)"
  [ -n "$v" ] && bpf=$((bpf + v))
done
kill -TERM "$apid"; wait "$apid" || true
awk -v dt="$((t1 - t0))" -v tk="$ticks" -v s="$seconds" -v b="$bpf" -v r="$rss" -v p="$peak" -v n="$count" -v hz="$hz" 'BEGIN {
  proc = 100 * dt / tk / s; bpf = 100 * b / 1e9 / (s + 5)
  printf "binaries=%d hz=%d agent_cpu=%.2f%%core (process %.2f%% + bpf %.3f%%) rss=%.1fMiB peak_rss=%.1fMiB\n",
    n, hz, proc + bpf, proc, bpf, r / 1024, p / 1024
}'
grep -E '^kiln_agent_(unwind|samples_total|frames_)' "$work/metrics" || true
