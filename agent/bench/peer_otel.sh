#!/usr/bin/env bash
# Kiln's agent and the OpenTelemetry eBPF profiler side by side, both
# profiling the whole machine at once (docs/benchmarks.md, rows
# peer.reach and peer.cpu):
#
#   steady  20 programs (JVMs 17 and forky's 25, Node 20 and forky's 24,
#           Ruby 3.1, CPython 3.11 and forky's 3.13, stripped Go), each a
#           hot function under a named caller (the programs of the
#           privileged *_frames tests), niced; over SECONDS: each agent's
#           CPU and peak RSS, then the reach per runtime: the share of that
#           runtime's samples in which the hot function has its caller
#           somewhere rootward, from each agent's own store;
#   rust    a Rust build (cargo, release, a throw-away crate on registry
#           crates, cleaned and rebuilt in a loop) over CHURN_SECONDS;
#   go      a Go build (`go build -a` of the OTel profiler's own source with
#           an empty cache, in a loop) over CHURN_SECONDS.
#
# Agent CPU is each agent's own CPU time, not the machine's: utime+stime of
# its process from /proc/PID/stat plus the run_time_ns of its BPF programs
# (kernel.bpf_stats_enabled=1, /proc/PID/fdinfo), as % of one core, both
# deltas over the window (after WARMUP seconds: the peer loads and
# verifies many BPF programs first). Peak RSS is VmHWM since start. Other
# work on the machine changes what both agents see, so the load average is
# printed with every window. The machine-wide /tmp/kiln-sampling.lock is
# held only while the agents run.
#
# Each agent ships to a throw-away kiln-store of its own on 127.0.0.1: Kiln
# over WriteRaw (--store), the peer over OTLP gRPC. The peer is built once
# by lib.sh's build_otel_peer (outside the repository).
#
# PEER=none runs Kiln's agent alone (where the peer cannot be built: it is
# fetched from the Go module proxy); the Go build is then helm's
# (e2e/cluster/helm, modules from ./kiln-dev's cache), not the peer's.
#
# Usage (root): agent/bench/peer_otel.sh [steady|rust|go]...  (default: all)
#   env: KILN_AGENT (a release kiln-agent; else built here), KILN_STORE, PEER,
#        HZ (19), SECONDS_STEADY (60), CHURN_SECONDS (90), ROUNDS (2),
#        WARMUP (20), OTEL_PROFILER_VERSION, KEEP_DIR (/tmp/peer-otel-keep:
#        the last run's folded stacks, agent logs and Kiln's metrics)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=agent/bench/lib.sh
. "$here/lib.sh"
hz="${HZ:-19}"
steady_seconds="${SECONDS_STEADY:-60}"
churn_seconds="${CHURN_SECONDS:-90}"
rounds="${ROUNDS:-2}"
warmup="${WARMUP:-20}"
tools="${KILN_TOOLS_DIR:-/var/tmp/kiln-tools}"
keep="${KEEP_DIR:-/tmp/peer-otel-keep}"
modes=("$@")
[ "${#modes[@]}" -gt 0 ] || modes=(steady rust go)

peer=""
[ "${PEER:-otel}" = none ] || peer="$(build_otel_peer)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/kiln-target}"
if [ -z "${KILN_AGENT:-}" ]; then
  cargo build --release -q -p kiln-agent --manifest-path "$repo/Cargo.toml"
  KILN_AGENT="$CARGO_TARGET_DIR/release/kiln-agent"
fi
if [ -z "${KILN_STORE:-}" ]; then
  cargo build -q -p kiln-store --manifest-path "$repo/Cargo.toml"
  KILN_STORE="$CARGO_TARGET_DIR/debug/kiln-store"
fi

work="$(mktemp -d)"
pids=()
service_pids=()
cleanup() {
  for p in "${pids[@]}" "${service_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The stacks, the stores' answers and the logs, for a second look.
  mkdir -p "$keep"
  cp "$work"/*.folded "$work"/*.raw "$work"/*.log "$work"/*.metrics "$keep"/ 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
sysctl -q kernel.bpf_stats_enabled=1
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

kiln_port=17481
peer_port=17482
metrics_port=17483
start_store() {
  "$KILN_STORE" --listen "127.0.0.1:$1" --data-dir "$work/store-$1" >"$work/store-$1.log" 2>&1 &
  service_pids+=($!)
  for _ in $(seq 150); do
    curl -sf "http://127.0.0.1:$1/api/v1/profile-types" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "kiln-store on port $1 did not start" >&2
  exit 1
}
start_store "$kiln_port"
[ -z "$peer" ] || start_store "$peer_port"

# --- the agents, as shipped: whole machine, no flags in any program ---
start_agents() {
  exec 9>/tmp/kiln-sampling.lock
  flock 9
  "$KILN_AGENT" --all --frequency "$hz" --store "http://127.0.0.1:$kiln_port" \
    --metrics-addr "127.0.0.1:$metrics_port" 2>"$work/kiln.log" 9>&- &
  kiln_pid=$!
  peer_pid=""
  if [ -n "$peer" ]; then
    "$peer" -samples-per-second "$hz" -collection-agent "127.0.0.1:$peer_port" \
      -disable-tls >"$work/peer.log" 2>&1 9>&- &
    peer_pid=$!
  fi
  sleep "$warmup"
  kill -0 "$kiln_pid" || { tail -20 "$work/kiln.log"; exit 1; }
  [ -z "$peer" ] || kill -0 "$peer_pid" || { tail -20 "$work/peer.log"; exit 1; }
}
stop_agents() {
  sleep 12 # the last window of each reaches its store
  curl -s "http://127.0.0.1:$metrics_port/metrics" >"$work/kiln.metrics" || true
  kill -TERM "$kiln_pid" $peer_pid 2>/dev/null || true
  wait "$kiln_pid" $peer_pid 2>/dev/null || true
  flock -u 9
}
# Processes created on the host since boot (forks and clones of threads
# alike, as /proc/stat counts them).
forks() { awk '$1 == "processes" { print $2 }' /proc/stat; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# Measures both agents over SECONDS; prints one line per agent.
measure_both() {
  local seconds="$1" label="$2" tk k0 k1 p0 p1 kb0 kb1 pb0 pb1 f0 f1
  tk="$(getconf CLK_TCK)"
  echo "$label: load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  k0="$(cpu_ticks "$kiln_pid")"; kb0="$(bpf_run_time_ns "$kiln_pid")"
  [ -z "$peer" ] || { p0="$(cpu_ticks "$peer_pid")"; pb0="$(bpf_run_time_ns "$peer_pid")"; }
  f0="$(forks)"
  window_from="$(date +%s)"
  sleep "$seconds"
  window_to="$(date +%s)"
  f1="$(forks)"
  new_processes=$((f1 - f0))
  k1="$(cpu_ticks "$kiln_pid")"; kb1="$(bpf_run_time_ns "$kiln_pid")"
  [ -z "$peer" ] || { p1="$(cpu_ticks "$peer_pid")"; pb1="$(bpf_run_time_ns "$peer_pid")"; }
  echo "$label: load average after: $(cut -d' ' -f1-3 /proc/loadavg); new processes on the host: $new_processes"
  report_agent "$label" kiln "$kiln_pid" "$((k1 - k0))" "$((kb1 - kb0))" "$tk" "$seconds"
  [ -z "$peer" ] ||
    report_agent "$label" otel-ebpf-profiler "$peer_pid" "$((p1 - p0))" "$((pb1 - pb0))" "$tk" "$seconds"
}
report_agent() {
  local label="$1" name="$2" pid="$3" dt="$4" db="$5" tk="$6" s="$7" peak
  peak="$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status")"
  awk -v l="$label" -v n="$name" -v dt="$dt" -v tk="$tk" -v s="$s" -v b="$db" -v p="$peak" -v np="$new_processes" 'BEGIN {
    proc = 100 * dt / tk / s; bpf = 100 * b / 1e9 / s
    printf "%s: %s cpu=%.2f%%core (process %.2f%% + bpf %.3f%%) peak_rss=%.1fMiB cpu_per_new_process=%.0fus\n",
      l, n, proc + bpf, proc, bpf, p / 1024, np ? (proc + bpf) / 100 * s * 1e6 / np : 0
  }'
}

# --- the programs (those of agent/tests/privileged/*_frames.rs) ---
# Runs ARGS (niced) chrooted in ROOT with DIR bind-mounted at /work, in a
# mount namespace of its own, as a container would; unshare, sh and chroot
# exec, so the pid is the program's.
run_in_root() {
  local runtime="$1" root="$2" dir="$3"
  shift 3
  mkdir -p "$root/work"
  run_program "$runtime" unshare -m --propagation private sh -c \
    'mount --bind "$1" "$2/work" && { [ ! -d "$2/proc" ] || mount -t proc proc "$2/proc"; } && shift 2 && exec chroot "$@"' \
    sh "$dir" "$root" "$root" "$@"
}
write_programs() {
  mkdir -p "$work/prog"
  cat >"$work/prog/KilnMain.java" <<'JAVA'
public class KilnMain {
    static long kilnHot(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; }
        return x;
    }
    static long kilnCaller(long n) { return kilnHot(n) + 1; }
    public static void main(String[] args) {
        long sink = 0;
        while (true) { sink += kilnCaller(50_000_000L); if (sink == 42) System.out.println(sink); }
    }
}
JAVA
  javac --release 17 -d "$work/prog" "$work/prog/KilnMain.java"
  cat >"$work/prog/kiln.js" <<'JS'
function kilnHotJs(n) {
  let x = 0;
  for (let i = 0; i < n; i++) { x = (x * 31 + i) % 1000003; }
  return x;
}
function kilnCallerJs() {
  let sum = 0;
  for (let round = 0; round < 20; round++) { sum += kilnHotJs(2000000); }
  return sum;
}
let sink = 0;
while (true) { sink += kilnCallerJs(); }
JS
  cat >"$work/prog/kiln.rb" <<'RUBY'
def kiln_rb_hot(n)
  x = 0
  i = 0
  while i < n
    x += i * i
    i += 1
  end
  x
end

def kiln_rb_caller
  10.times { kiln_rb_hot(20_000) }
end
loop { kiln_rb_caller }
RUBY
  cat >"$work/prog/kiln_work.py" <<'PY'
def kiln_py_hot(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def kiln_py_middle():
    return kiln_py_hot(20000) + kiln_py_hot(30000)


def kiln_py_outer():
    while True:
        kiln_py_middle()
PY
  printf 'import sys\nsys.path.insert(0, sys.argv[1])\nimport kiln_work\nkiln_work.kiln_py_outer()\n' \
    >"$work/prog/main.py"
  mkdir -p "$work/gosrc"
  cat >"$work/gosrc/main.go" <<'GO'
package main

import "os"

//go:noinline
func kilnGoHot(seed uint64) uint64 {
	x := seed
	for i := 0; i < 2000000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

//go:noinline
func kilnGoCaller(seed uint64) uint64 {
	return kilnGoHot(seed) ^ seed
}

func main() {
	var sink uint64
	for {
		sink = kilnGoCaller(sink)
		if sink == 42 {
			os.Exit(1)
		}
	}
}
GO
  (cd "$work/gosrc" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS='' GO111MODULE=off \
    go build -ldflags='-s -w' -o "$work/prog/kiln-go-stripped" main.go)
}

# runtime name -> pids, hot function, caller (substrings of frame names)
declare -A runtime_pids=()
declare -A runtime_hot=(
  [java17]=kilnHot [java25-forky]=kilnHot [node20]=kilnHotJs [node24-forky]=kilnHotJs
  [ruby3.1]=kiln_rb_hot [python3.11]=kiln_py_hot [python3.13-forky]=kiln_py_hot
  [go-stripped]=kilnGoHot
)
declare -A runtime_caller=(
  [java17]=kilnCaller [java25-forky]=kilnCaller [node20]=kilnCallerJs
  [node24-forky]=kilnCallerJs [ruby3.1]=kiln_rb_caller [python3.11]=kiln_py_middle
  [python3.13-forky]=kiln_py_middle [go-stripped]=kilnGoCaller
)
run_program() {
  local runtime="$1"
  shift
  nice -n 19 "$@" >/dev/null 2>&1 &
  pids+=($!)
  runtime_pids[$runtime]="${runtime_pids[$runtime]:-} $!"
}
start_programs() {
  local p="$work/prog" i
  local forky_java="$tools/debian-forky-java" forky_node="$tools/debian-forky-node"
  local forky_python="$tools/debian-forky-python"
  for i in 1 2 3; do
    run_program java17 /usr/lib/jvm/java-17-openjdk-amd64/bin/java -cp "$p" KilnMain
    run_program node20 /usr/bin/node "$p/kiln.js"
    run_program ruby3.1 /usr/bin/ruby3.1 "$p/kiln.rb"
    run_program python3.11 /usr/bin/python3.11 "$p/main.py" "$p"
    run_program go-stripped "$p/kiln-go-stripped"
  done
  # The chrooted forky runtimes where ./kiln-dev unpacked them, else one
  # more of the host's.
  if [ -x "$forky_java/usr/lib/jvm/java-25-openjdk-amd64/bin/java" ]; then
    run_in_root java25-forky "$forky_java" "$p" /usr/lib/jvm/java-25-openjdk-amd64/bin/java -cp /work KilnMain
  else
    run_program java17 /usr/lib/jvm/java-17-openjdk-amd64/bin/java -cp "$p" KilnMain
  fi
  if [ -x "$forky_node/usr/bin/node" ]; then
    run_in_root node24-forky "$forky_node" "$p" /usr/bin/node /work/kiln.js
  else
    run_program node20 /usr/bin/node "$p/kiln.js"
  fi
  if [ -x "$forky_python/usr/bin/python3.13" ]; then
    run_in_root python3.13-forky "$forky_python" "$p" /usr/bin/python3.13 /work/main.py /work
  else
    run_program python3.11 /usr/bin/python3.11 "$p/main.py" "$p"
  fi
  run_program python3.11 /usr/bin/python3.11 "$p/main.py" "$p"
  run_program go-stripped "$p/kiln-go-stripped"
  sleep 3
}

# Folded stacks of the window from the store on PORT, grouped by the pid
# label LABEL (Kiln: the sample label pid; the peer: the series label
# process.pid), one "pid=N;root;...;leaf COUNT" line per stack.
folded_by_pid() {
  local types
  types="$(curl -s "http://127.0.0.1:$1/api/v1/profile-types")"
  echo "store :$1 profile types: $types" >&2
  # Sample counts: both stores have them (Kiln's also has CPU time).
  local type="process_cpu:samples:count:cpu:nanoseconds:delta"
  curl -sG "http://127.0.0.1:$1/api/v1/folded" --data-urlencode "query=$type{}" \
    --data-urlencode "from=$window_from" --data-urlencode "to=$window_to" \
    --data-urlencode "group_by=$2" | tee "$work/folded-$1.raw" | grep -v '^{"error"' || {
    echo "store :$1 answered: $(head -c 400 "$work/folded-$1.raw")" >&2
  }
}
# The share of RUNTIME's samples naming its hot function with its caller
# rootward, from FOLDED (a file), as "share% of N samples".
reach_of() {
  local folded="$1" runtime="$2"
  awk -v pids="${runtime_pids[$runtime]}" -v hot="${runtime_hot[$runtime]}" \
    -v caller="${runtime_caller[$runtime]}" '
    BEGIN { n = split(pids, p, " "); for (i = 1; i <= n; i++) want[p[i]] = 1 }
    {
      count = $NF; stack = substr($0, 1, length($0) - length(count) - 1)
      k = split(stack, f, ";"); split(f[1], g, "="); if (!(g[2] in want)) next
      total += count; seen_caller = 0
      for (i = 2; i <= k; i++) {
        if (index(f[i], caller)) seen_caller = 1
        else if (seen_caller && index(f[i], hot)) { named += count; break }
      }
    }
    END { printf "%.1f%% of %.0f samples", total ? 100 * named / total : 0, total }' "$folded"
}

steady() {
  write_programs
  start_programs
  start_agents
  measure_both "$steady_seconds" "steady ${#pids[@]} programs hz=$hz ${steady_seconds}s"
  stop_agents
  folded_by_pid "$kiln_port" pid >"$work/kiln.folded"
  if [ -n "$peer" ]; then
    folded_by_pid "$peer_port" process.pid >"$work/peer.folded"
  else
    : >"$work/peer.folded"
  fi
  local runtime
  for runtime in java17 java25-forky node20 node24-forky ruby3.1 python3.11 python3.13-forky go-stripped; do
    [ -n "${runtime_pids[$runtime]:-}" ] || continue
    echo "reach $runtime (${runtime_hot[$runtime]} under ${runtime_caller[$runtime]}): kiln $(reach_of "$work/kiln.folded" "$runtime"); otel-ebpf-profiler $(reach_of "$work/peer.folded" "$runtime")"
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
}

# --- churn: a build running in a loop under both agents ---
rust_build_loop() {
  local crate="$work/churn-crate"
  mkdir -p "$crate/src"
  cat >"$crate/Cargo.toml" <<'TOML'
[package]
name = "kiln-churn"
version = "0.1.0"
edition = "2021"

[dependencies]
clap = { version = "4", features = ["derive"] }
regex = "1"
serde = { version = "1", features = ["derive"] }
TOML
  echo 'fn main() {}' >"$crate/src/main.rs"
  while true; do
    rm -rf "$crate/target"
    CARGO_TARGET_DIR="$crate/target" cargo build --offline --release -q \
      --manifest-path "$crate/Cargo.toml" >/dev/null 2>&1 || sleep 1
  done
}
go_build_loop() {
  local src
  if [ -z "$peer" ]; then
    # helm, offline, from the modules ./kiln-dev test keeps.
    while true; do
      rm -rf "$work/gocache"
      (cd "$repo/e2e/cluster/helm" && GOCACHE="$work/gocache" GOFLAGS=-mod=readonly \
        GOPROXY=off GOTOOLCHAIN=local GOMODCACHE="$tools/go/mod" CGO_ENABLED=0 \
        go build -a -o /dev/null helm.sh/helm/v3/cmd/helm >/dev/null 2>&1) || sleep 1
    done
  fi
  src="$(dirname "$peer")/src-${OTEL_PROFILER_VERSION:-v0.0.202633}"
  while true; do
    rm -rf "$work/gocache"
    (cd "$src" && GOCACHE="$work/gocache" GOFLAGS=-mod=mod CGO_ENABLED=0 \
      go build -a -o /dev/null . >/dev/null 2>&1) || sleep 1
  done
}
churn() {
  local kind="$1" round builder
  for round in $(seq "$rounds"); do
    start_agents
    # Without the lock's descriptor: a build left behind must not hold it.
    "${kind}_build_loop" 9>&- &
    builder=$!
    measure_both "$churn_seconds" "churn $kind build round $round ${churn_seconds}s hz=$hz"
    pkill_tree "$builder"
    stop_agents
    grep -E '^kiln_agent_(dropped_total|cached_processes|frames_|unwind_cache_bytes|symbol)' "$work/kiln.metrics" | grep -v ' 0$' | head -20 || true
  done
}
# Ends the build loop PID and every process under it: stopped first, so
# that it starts nothing new meanwhile.
pkill_tree() {
  local children child
  kill -STOP "$1" 2>/dev/null || true
  children="$(pgrep -P "$1" || true)"
  for child in $children; do pkill_tree "$child"; done
  kill -KILL "$1" 2>/dev/null || true
}

echo "peer_otel: $(nproc) CPUs, $(uname -r), kiln-agent $KILN_AGENT, peer ${peer:-none}"
for mode in "${modes[@]}"; do
  case "$mode" in
    steady) steady ;;
    rust | go) churn "$mode" ;;
    *) echo "unknown mode $mode (steady, rust, go)" >&2; exit 2 ;;
  esac
done
