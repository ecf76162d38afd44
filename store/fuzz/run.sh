#!/usr/bin/env bash
# Fuzzes Kiln's parsers with AFL++ through cargo-afl, on stable Rust.
#
#   store/fuzz/run.sh [SECONDS] [TARGET...]
#   store/fuzz/run.sh --build-only   only the instrumented build (./kiln-dev test
#                                    runs it while the tests run)
#     SECONDS  per target (default 600); TARGET defaults to every target:
#              pprof folded multipart push_json otlp wal_record block
#              connect select_series otlp_revisions query_trees recorded
#              debuginfo symbol_cache
#   env: KILN_FUZZ_OUT (default /var/tmp/kiln-fuzz), KILN_FUZZ_MEMORY_MB
#        (the fuzzed process's memory limit, afl-fuzz -m; default 1024),
#        KILN_FUZZ_TARGET_DIR (the instrumented build, default
#        /var/tmp/kiln-target-fuzz)
#
# Needs cargo-afl (`./kiln-dev test` installs it). The seeds are written by
# the fuzz binary itself from the project's own encoders. Prints one line
# per target and fails if any input crashed or hung a target; those inputs
# stay under $KILN_FUZZ_OUT/<target>/default/{crashes,hangs}.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_only=false
if [ "${1:-}" = --build-only ]; then
  build_only=true
  shift
fi
seconds="${1:-600}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(pprof folded multipart push_json otlp wal_record block
    connect select_series otlp_revisions query_trees recorded debuginfo symbol_cache)
fi
out="${KILN_FUZZ_OUT:-/var/tmp/kiln-fuzz}"
memory_mb="${KILN_FUZZ_MEMORY_MB:-1024}"
export CARGO_TARGET_DIR="${KILN_FUZZ_TARGET_DIR:-/var/tmp/kiln-target-fuzz}"

(cd "$here" && cargo afl build --release --locked --quiet)
[ "$build_only" = false ] || exit 0
bin="$CARGO_TARGET_DIR/release/kiln-fuzz"
mkdir -p "$out"
rm -rf "$out/seeds"
"$bin" --write-seeds "$out/seeds"

failed=0
for target in "${targets[@]}"; do
  rm -rf "${out:?}/$target"
  # No UI, no CPU-governor or core-pattern checks (a shared VM), and stop
  # after $seconds whatever was found.
  AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
    AFL_NO_AFFINITY=1 KILN_FUZZ_TARGET="$target" \
    cargo afl fuzz -V "$seconds" -m "$memory_mb" -i "$out/seeds/$target" -o "$out/$target" \
    -- "$bin" >"$out/$target.log" 2>&1 || {
      echo "$target: afl-fuzz failed; see $out/$target.log" >&2
      tail -n 20 "$out/$target.log" >&2
      failed=1
      continue
    }
  dir="$out/$target/default"
  stat() { awk -F': *' -v k="$1" '$1 ~ "^"k" *$" {print $2}' "$dir/fuzzer_stats"; }
  crashes=$(find "$dir/crashes" -type f ! -name README.txt 2>/dev/null | wc -l)
  hangs=$(find "$dir/hangs" -type f 2>/dev/null | wc -l)
  echo "$target: $(stat execs_done) execs in $(stat run_time) s ($(stat execs_per_sec)/s)," \
    "corpus $(stat corpus_count), edges $(stat edges_found)/$(stat total_edges)," \
    "crashes $crashes, hangs $hangs"
  if [ "$crashes" -gt 0 ] || [ "$hangs" -gt 0 ]; then
    failed=1
  fi
done
exit "$failed"
