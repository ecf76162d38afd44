#!/usr/bin/env bash
# Issue 13's many-core check: kiln-store loaded over HTTP /ingest from
# growing numbers of client processes, one or more builds in turn on the
# same machine, then a look at where its threads run and sleep under load.
# Meant for a machine with more cores than the project's 2; needs no cargo
# there: give it the binaries.
#
# Usage: store/bench/cores.sh LOAD_BIN NAME=STORE_BIN [NAME=STORE_BIN ...]
#   LOAD_BIN   the write_load bench binary
#              (cargo bench -p kiln-store --bench write_load --no-run)
#   STORE_BIN  a release kiln-store, named NAME in the output
# Knobs (environment):
#   KILN_CORES_WRITERS   client counts (default "1 2 4 8 12 16 24 32")
#   KILN_CORES_SECONDS   seconds per point (default 6)
#   KILN_CORES_EXTRA     more points, "NAME:CLIENTS:ENV=V,ENV=V ..." (e.g.
#                        KILN_BENCH_WORKLOADS=100, KILN_HEAD_SHARDS=16,
#                        TMPDIR=<a tmpfs> for the WAL off the disk)
#   KILN_CORES_PROBE     spinner counts for core_probe.py (e.g. "1 8 16")
#   KILN_CORES_DIAG      clients for the diagnosis of the first build (default
#                        32; empty: none): thread states from /proc, an
#                        on-CPU perf profile and an off-CPU one (sched_switch
#                        with DWARF stacks, folded), if `perf` ($PERF) runs
#   KILN_CORES_DIAG_ENV  environment of the diagnosed load ("ENV=V ENV=V")
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { sed -n '2,26p' "$0"; exit 2; }
load_bin=$1; shift
perf=${PERF:-perf}
nproc
lscpu | grep -E 'Model name|^CPU\(s\)|Thread\(s\)'

load() { # label store_bin clients seconds [ENV=V ...]
  local label=$1 store=$2 w=$3 s=$4; shift 4
  env "$@" KILN_BENCH_STORE_BIN="$store" KILN_BENCH_PROTOCOL=ingest \
    KILN_BENCH_WRITERS="$w" KILN_BENCH_CLIENT_PROCESSES=1 KILN_BENCH_SECONDS="$s" \
    "$load_bin" | awk -v p="$label w=$w | " '{ print p $0; fflush() }'
}
bin_of() { # NAME -> its STORE_BIN
  local pair
  for pair in "${builds[@]}"; do [ "${pair%%=*}" = "$1" ] && echo "${pair#*=}"; done
}

builds=("$@")
[ -n "${KILN_CORES_PROBE:-}" ] && python3 "$here/core_probe.py" $KILN_CORES_PROBE
for pair in "${builds[@]}"; do
  for w in ${KILN_CORES_WRITERS:-1 2 4 8 12 16 24 32}; do
    load "${pair%%=*}" "${pair#*=}" "$w" "${KILN_CORES_SECONDS:-6}"
  done
done
for extra in ${KILN_CORES_EXTRA:-}; do
  IFS=: read -r name w envs <<<"$extra"
  load "$name,${envs//,/ }" "$(bin_of "$name")" "$w" "${KILN_CORES_SECONDS:-6}" ${envs//,/ }
done

clients=${KILN_CORES_DIAG-32}
[ -n "$clients" ] || exit 0
name=${builds[0]%%=*} store=${builds[0]#*=}
load "diag-$name" "$store" "$clients" 14 ${KILN_CORES_DIAG_ENV:-} &
loader=$!
sleep 3
pid=$(pgrep -n -f "$store")
python3 "$here/thread_states.py" "$pid" 3 &
sampler=$!
if $perf --version >/dev/null 2>&1; then
  mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
  data=$(mktemp -d)
  $perf record -F 499 -g -p "$pid" -o "$data/on.data" -- sleep 3 2>&1 | tail -1
  $perf record -e sched:sched_switch -c 200 --call-graph dwarf,4096 -p "$pid" \
    -o "$data/off.data" -- sleep 1 2>&1 | tail -1
fi
wait "$loader" "$sampler"
if [ -n "${data:-}" ]; then
  echo "== on-CPU, by symbol"
  $perf report -i "$data/on.data" --no-children --sort sym --stdio -g none \
    --percent-limit 0.5 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
  echo "== off-CPU: where threads went to sleep (innermost user frames)"
  $perf script -i "$data/off.data" -F comm,tid,ip,sym,dso 2>/dev/null \
    | python3 "$here/fold_switches.py" 12 | head -30
  rm -rf "$data"
else
  echo "no perf ($perf): thread states only"
fi
