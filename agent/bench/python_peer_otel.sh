#!/usr/bin/env bash
# Peer measurement for agent/bench/python_processes.sh: the OpenTelemetry
# eBPF profiler (Go module go.opentelemetry.io/ebpf-profiler) on the same
# workload (N niced CPython processes, each its own module with functions
# three calls deep), measured the same way: process CPU from
# /proc/PID/stat utime+stime plus the run_time_ns of its BPF programs
# (kernel.bpf_stats_enabled=1, read from /proc/PID/fdinfo), as % of one
# core, and VmRSS / VmHWM at the end.
#
# Differences from the Kiln script, which the numbers carry:
# - the OTel profiler has no pid filter: it profiles the whole machine
#   (every process, all CPUs), so its cost grows with what else runs here;
# - it takes longer to start (it loads and verifies many BPF programs), so
#   the window starts after WARMUP seconds (default 20) and both the process
#   CPU and the BPF run time are deltas over the window (Kiln's script
#   divides the BPF total since load by SECONDS+5);
# - it exports OTLP profiles over gRPC and will not start without a
#   collector that answers (it gives up after 5 tries to connect), so the
#   script runs a throw-away kiln-store on 127.0.0.1 (KILN_STORE, else
#   kiln-store built here with cargo, debug) and afterwards asks it for the
#   top functions of the Python processes (are hot_1..hot_N named?) and
#   the samples in the window.
#
# The profiler is built (once, by lib.sh's build_otel_peer) from the Go module proxy into
# /var/tmp/kiln-tools/otel-ebpf-profiler, outside the repository; nothing of
# it is kept here. The module ships its eBPF object prebuilt
# (support/ebpf/tracer.ebpf.amd64), so no clang is needed.
#
# Usage (root): agent/bench/python_peer_otel.sh [N] [SECONDS] [HZ] [PYTHON]
#   default: 20 60 19 /usr/bin/python3
#   env: OTEL_PROFILER_VERSION (default v0.0.202633), KILN_STORE, WARMUP
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/lib.sh"
repo="$(cd "$here/../.." && pwd)"
count="${1:-20}"
seconds="${2:-60}"
hz="${3:-19}"
python="${4:-/usr/bin/python3}"
version="${OTEL_PROFILER_VERSION:-v0.0.202633}"
warmup="${WARMUP:-20}"

bin="$(build_otel_peer)"

work="$(mktemp -d)"
pids=()
spid=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$spid" ] && kill "$spid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
sysctl -q kernel.bpf_stats_enabled=1
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

# --- the collector: a throw-away kiln-store ---
if [ -z "${KILN_STORE:-}" ]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
  cargo build -q -j 1 -p kiln-store --manifest-path "$repo/Cargo.toml"
  KILN_STORE="$CARGO_TARGET_DIR/debug/kiln-store"
fi
sport=17471
"$KILN_STORE" --listen "127.0.0.1:$sport" --data-dir "$work/store" >"$work/store.log" 2>&1 &
spid=$!
for _ in $(seq 150); do
  curl -sf "http://127.0.0.1:$sport/api/v1/profile-types" >/dev/null 2>&1 && break
  sleep 0.2
done
collector="127.0.0.1:$sport"

# --- the workload: the same program as python_processes.sh ---
start_python_workload "$count" "$python" "$work"
sleep 2

GOMAXPROCS="${PEER_GOMAXPROCS:-}" "$bin" -samples-per-second "$hz" -collection-agent "$collector" \
  -disable-tls >"$work/peer.log" 2>&1 &
apid=$!

nprogs() { cat /proc/"$1"/fdinfo/* 2>/dev/null | grep -c '^prog_id:' || true; }

sleep "$warmup"
kill -0 "$apid" || { echo "peer exited during warm-up:"; tail -20 "$work/peer.log"; exit 1; }
ticks="$(getconf CLK_TCK)"
w0="$(date +%s)"
t0="$(awk '{ print $14 + $15 }' "/proc/$apid/stat")"
b0="$(bpf_run_time_ns "$apid")"
sleep "$seconds"
t1="$(awk '{ print $14 + $15 }' "/proc/$apid/stat")"
b1="$(bpf_run_time_ns "$apid")"
w1="$(date +%s)"
rss="$(awk '/^VmRSS:/ { print $2 }' "/proc/$apid/status")"
peak="$(awk '/^VmHWM:/ { print $2 }' "/proc/$apid/status")"
progs="$(nprogs "$apid")"
btotal="$b1"
sleep 8 # let the last reports reach the collector
kill -TERM "$apid"; wait "$apid" || true

awk -v dt="$((t1 - t0))" -v tk="$ticks" -v s="$seconds" -v b="$((b1 - b0))" -v r="$rss" -v p="$peak" \
  -v n="$count" -v hz="$hz" -v v="$version" -v np="$progs" -v bt="$btotal" 'BEGIN {
  proc = 100 * dt / tk / s; bpf = 100 * b / 1e9 / s
  printf "peer=otel-ebpf-profiler@%s python_processes=%d hz=%d cpu=%.2f%%core (process %.2f%% + bpf %.3f%%) rss=%.1fMiB peak_rss=%.1fMiB bpf_prog_fds=%d bpf_total_since_load=%.2fs\n",
    v, n, hz, proc + bpf, proc, bpf, r / 1024, p / 1024, np, bt / 1e9
}'
"$python" --version
grep -E -i 'level=(error|warn)' "$work/peer.log" | sort | uniq -c | sort -rn | head -5 || true

if [ -n "$spid" ]; then
  # samples of the Python processes in the measured window, and their top functions
  q="process_cpu{process.pid=~\"$(IFS='|'; echo "${pids[*]}")\"}"
  top="$(curl -sG "http://127.0.0.1:$sport/api/v1/top" --data-urlencode "query=$q" \
    --data-urlencode "from=$w0" --data-urlencode "to=$w1" --data-urlencode "limit=12")"
  echo "store top (window, the workload pids): $top" | head -c 3000; echo
  all="$(curl -sG "http://127.0.0.1:$sport/api/v1/top" --data-urlencode "query=$q" \
    --data-urlencode "from=now-1h" --data-urlencode "to=now" --data-urlencode "limit=5000")"
  for f in hot middle outer; do
    named="$(grep -o "\"name\":\"${f}_[0-9]*\"" <<<"$all" | sort -u | wc -l || true)"
    echo "python functions named ${f}_1..${f}_$count in the store: $named of $count"
  done
  curl -s "http://127.0.0.1:$sport/metrics" | grep -E '^kiln_otlp_export_requests_total' || true
fi
