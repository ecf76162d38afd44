#!/usr/bin/env bash
# Issue 50's "ingest past 8 cores", measured where no many-core machine is
# lent: two builds of kiln-store (A, B) under the same load from the
# write_load bench, alternated A B A B so drift shows, with per build and
# round the store's uploads/s, CPU seconds and context switches per 1,000
# uploads, then where its threads went to sleep (off-CPU shares: every
# sched_switch of the store's threads with DWARF stacks, sorted by what
# they waited for, hops_switches.py). Needs root for perf; needs no cargo.
#
# Usage: store/bench/hops.sh LOAD_BIN A=STORE_BIN B=STORE_BIN
#   LOAD_BIN   the write_load bench binary
#              (cargo bench -p kiln-store --bench write_load --no-run)
#   STORE_BIN  a release kiln-store, named A or B (any name) in the output
# Knobs (environment):
#   KILN_HOPS_ROUNDS     A/B rounds per load (default 2)
#   KILN_HOPS_SECONDS    seconds of load per run (default 12)
#   KILN_HOPS_LOADS      loads, "PROTOCOL:CLIENTS ..." (default
#                        "ingest:8 write_raw:32": HTTP /ingest from 8 client
#                        processes, gRPC WriteRaw from 32 writers)
#   KILN_HOPS_OFFCPU     seconds of sched_switch recording per build and
#                        load, in runs of their own (default 2; 0: none)
# CPU per upload is write_load's own (the store's utime + stime over its
# load window); switches per upload are `perf stat`'s count over the
# middle of the window, over the window's uploads/s.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 3 ] || { sed -n '2,24p' "$0"; exit 2; }
load_bin=$1; shift
builds=("$@")
seconds=${KILN_HOPS_SECONDS:-12}
perf=${PERF:-perf}
nproc
uptime
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
data=$(mktemp -d -t kiln-hops.XXXXXX)

store_pid() { # STORE_BIN -> the pid of the store write_load started
  local pid='' tries=0
  while [ -z "$pid" ] && [ $tries -lt 100 ]; do
    pid=$(pgrep -n -f "^$1 ") || true
    tries=$((tries + 1))
    [ -n "$pid" ] || sleep 0.1
  done
  echo "$pid"
}

run() { # NAME STORE_BIN PROTOCOL CLIENTS -> one line of figures
  local name=$1 store=$2 protocol=$3 clients=$4 log=$data/run.txt stat=$data/stat.txt
  env KILN_BENCH_STORE_BIN="$store" KILN_BENCH_PROTOCOL="$protocol" \
    KILN_BENCH_WRITERS="$clients" KILN_BENCH_CLIENT_PROCESSES=1 \
    KILN_BENCH_SECONDS="$seconds" "$load_bin" >"$log" 2>&1 &
  local loader=$! pid
  pid=$(store_pid "$store")
  # The store starts, then the load warms up; count the middle of it.
  sleep 3
  local window=$((seconds - 5))
  $perf stat -x, -e task-clock,context-switches -p "$pid" -o "$stat" -- sleep "$window" \
    >/dev/null 2>&1
  wait "$loader"
  local rate cpu accepted switches
  rate=$(grep -o 'profiles/s=[0-9]*' "$log" | cut -d= -f2)
  accepted=$(grep -o '^accepted=[0-9]*' "$log" | cut -d= -f2)
  cpu=$(grep -o 'server cpu=[0-9.]*' "$log" | cut -d= -f2)
  switches=$(awk -F, '$3 == "context-switches" { print $1 }' "$stat")
  awk -v n="$name" -v p="$protocol" -v c="$clients" -v r="$rate" -v a="$accepted" \
    -v cpu="$cpu" -v s="$switches" -v w="$window" 'BEGIN {
      printf "%-4s %-9s clients=%-3s uploads/s=%-6s cpu_s_per_1000=%.3f switches_per_1000=%.0f (switches/s %.0f)\n",
        n, p, c, r, 1000 * cpu / a, 1000 * (s / w) / r, s / w }'
  grep -E '^(accepted|server|client)' "$log" | sed 's/^/     /'
}

offcpu() { # NAME STORE_BIN PROTOCOL CLIENTS
  local name=$1 store=$2 protocol=$3 clients=$4
  env KILN_BENCH_STORE_BIN="$store" KILN_BENCH_PROTOCOL="$protocol" \
    KILN_BENCH_WRITERS="$clients" KILN_BENCH_CLIENT_PROCESSES=1 \
    KILN_BENCH_SECONDS="$seconds" "$load_bin" >"$data/offcpu-run.txt" 2>&1 &
  local loader=$! pid
  pid=$(store_pid "$store")
  sleep 4
  $perf record -e sched:sched_switch -c 1 --call-graph dwarf,8192 -p "$pid" \
    -o "$data/off.data" -- sleep "${KILN_HOPS_OFFCPU:-2}" >/dev/null 2>&1
  wait "$loader"
  echo "== off-CPU, $name, $protocol from $clients clients"
  $perf script -i "$data/off.data" -F comm,tid,ip,sym,trace 2>/dev/null \
    | python3 "$here/hops_switches.py"
}

for spec in ${KILN_HOPS_LOADS:-ingest:8 write_raw:32}; do
  protocol=${spec%%:*} clients=${spec#*:}
  for _ in $(seq "${KILN_HOPS_ROUNDS:-2}"); do
    for pair in "${builds[@]}"; do
      run "${pair%%=*}" "${pair#*=}" "$protocol" "$clients"
    done
  done
  if [ "${KILN_HOPS_OFFCPU:-2}" != 0 ]; then
    for pair in "${builds[@]}"; do
      offcpu "${pair%%=*}" "${pair#*=}" "$protocol" "$clients"
    done
  fi
done
uptime
rm -rf "$data"
