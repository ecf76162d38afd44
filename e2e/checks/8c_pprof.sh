# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 8c: a Go program's net/http/pprof endpoints, scraped by the node's agent over the pod
# IP (issue 52). The program (e2e/workload/pprof_known.go, e2e/manifests/pprof.yaml) allocates
# 1 MiB a second in main.allocateKnown, parks 25 goroutines in main.parked, and prints its own
# counts at every pprof request it serves. Through the port-forwarded store and `kiln query`:
#   - the heap in use (inuse_space) names main.allocateKnown;
#   - each goroutine profile counts what runtime.NumGoroutine() said inside the handler that
#     served it (within 2: a connection's goroutine may come or go between the two), with
#     main.parked's 25 in every one;
#   - the alloc_space deltas of a range of about a minute add up, under main.allocateKnown, to
#     what the program's counter says it allocated between the scrapes that bound them
#     (within 10 %);
#   - the mutex and block profiles' delay deltas of a range of about a minute add up, under
#     main.contendKnown (the mutex's holder, on whose stack Go puts the wait) and
#     main.blockKnown (the goroutine that waits on a channel), to the waits the program
#     measured between the scrapes that bound them (within 5 %, see pprof_delay_tolerance);
#   - all of them carry the pod's labels: namespace, pod, container, node, service_name and
#     the target's suite label.
# The target names its port (`pprof`); every scrape must come to <pod IP>:6060.
# It runs after check 6, so the scraping agents are the capabilities-mode ones.

pprof_image=localhost/kiln-e2e/go-pprof:1
pprof_workload=go-pprof
pprof_container=go
pprof_service=kiln-e2e-go
pprof_parked=25
# What main.allocateKnown keeps in use: its last 32 blocks of 64 KiB.
pprof_retained_bytes=$((32 * 65536))
# Seconds of scrapes the deltas are summed over. Around it the check spends the pod's start
# and first scrape (3-4 s here), up to one scrape interval for the bounding scrape, and a few
# seconds of queries: 79 s in all in a full suite run, under 90 s with room for a slower start.
pprof_range_seconds=75
pprof_tolerance_percent=10
# The delays: the program measures each wait as Go's profiles do (from the start of the wait
# to the Unlock or send that ends it), and every event is recorded, so what is left is one
# wait at each end of the range (a wait recorded by the runtime just before the scrape and
# added to the program's counter just after: at most 20 ms of mutex or 50 ms of block wait
# against about 75 s in the range, 0.1 %) and Go's conversion of CPU ticks to nanoseconds
# (its tick rate is estimated once at start). 5 % leaves room for both and still fails a
# profile stored whole (the process's total since start) or a scrape's delta lost.
pprof_delay_tolerance_percent=5
alloc_type='memory:alloc_space:bytes:space:bytes:delta'
inuse_type='memory:inuse_space:bytes:space:bytes'
goroutine_type='goroutine:goroutine:count:goroutine:count'
mutex_type='mutex:delay:nanoseconds:contentions:count:delta'
block_type='block:delay:nanoseconds:contentions:count:delta'

# The Go program, static, in an image of its own, made in setup so a missing Go stops the
# suite early.
build_pprof_image() {
  local began=$SECONDS rootfs="$work_dir/go-pprof-rootfs" binary="$work_dir/kiln-e2e-go-pprof"
  command -v go >/dev/null 2>&1 || fail "go is needed by the suite (the Go workload of check 8c)"
  (cd "$e2e_dir/workload" && CGO_ENABLED=0 go build -trimpath -o "$binary" pprof_known.go) \
    || fail "cannot build e2e/workload/pprof_known.go"
  "$e2e_dir/images/rootfs.sh" "$rootfs" "$binary=/usr/local/bin/kiln-e2e-go-pprof" \
    || fail "cannot assemble the Go workload's root filesystem"
  load_image "$pprof_image" "$rootfs" '["/usr/local/bin/kiln-e2e-go-pprof"]'
  note "Go workload image ($(go version | cut -d' ' -f3)) in $((SECONDS - began)) s"
}

# pprof_scrapes POD PROFILE: "unix_ms allocated goroutines host contended_ns blocked_ns" of
# each request for PROFILE the program served, oldest first.
pprof_scrapes() {
  kubectl -n "$workload_ns" logs "$1" | awk -v profile="profile=$2" '
    $1 == "scrape" && $2 == profile {
      for (i = 3; i <= NF; i++) { split($i, field, "="); value[field[1]] = field[2] }
      print value["unix_ms"], value["allocated"], value["goroutines"], value["host"],
        value["contended_ns"], value["blocked_ns"]
    }'
}

# scraped_since POD PROFILE UNIX_MS: whether the program served PROFILE at or after UNIX_MS.
scraped_since() {
  pprof_scrapes "$1" "$2" | awk -v since="$3" '$1 >= since { found = 1 } END { exit !found }'
}

# allocs_scraped_since POD UNIX_MS: whether the program served /allocs at or after UNIX_MS.
allocs_scraped_since() {
  scraped_since "$1" allocs "$2"
}

# check_delays POD PROFILE TYPE FUNCTION FIELD: the delay deltas of PROFILE stored under
# FUNCTION over a range of scrapes add up to the program's own counter (column FIELD of
# pprof_scrapes) between the scrapes that bound them, as for the allocations.
check_delays() {
  local pod="$1" profile="$2" type="$3" function="$4" field="$5"
  local first scrapes first_counted last_ms last_counted last_start deltas
  read -r first _ < <(pprof_scrapes "$pod" "$profile")
  [ -n "$first" ] || fail "the agent never scraped $pod's /debug/pprof/$profile (agent: $(agent_scrape_counters))"
  retry $((pprof_range_seconds + 30)) 1 scraped_since "$pod" "$profile" $((first + pprof_range_seconds * 1000)) \
    || fail "the agent stopped scraping $pod's /$profile (agent: $(agent_scrape_counters))"
  scrapes="$(pprof_scrapes "$pod" "$profile" | awk -v until=$((first + pprof_range_seconds * 1000)) \
    '{ print } $1 >= until { exit }')"
  first_counted="$(head -1 <<<"$scrapes" | cut -d' ' -f"$field")"
  read -r last_ms _ < <(tail -1 <<<"$scrapes")
  last_counted="$(tail -1 <<<"$scrapes" | cut -d' ' -f"$field")"
  last_start="$(tail -2 <<<"$scrapes" | head -1 | cut -d' ' -f1)"
  deltas=$(( $(wc -l <<<"$scrapes") - 1 ))
  local from=$((first / 1000)) to=$((last_start / 1000 + 2))
  local matchers="{namespace=\"$workload_ns\",pod=\"$pod\"}"
  retry 30 1 stored_since "$type" "$matchers" $((last_start / 1000)) "$to" \
    || fail "the $profile delta from $pod's scrape at $last_start ms is not in the store (agent: $(agent_scrape_counters))"
  local folded expected stored
  folded="$("$kiln_cli" query --format folded --from "$from" --to "$to" "$type$matchers")"
  expected=$((last_counted - first_counted))
  stored="$(sum_under "$function" <<<"$folded")"
  note "$profile delay, $deltas deltas stored from $from to $to (scrapes $(( (last_ms - first) / 1000 )) s apart):" \
    "$expected ns waited at $function by the program's measure, $stored ns stored under it" \
    "(ratio $(awk -v s="$stored" -v e="$expected" 'BEGIN { printf "%.4f", e ? s / e : 0 }'));" \
    "$(awk '{ sum += $NF } END { printf "%.0f\n", sum }' <<<"$folded") ns stored in all"
  if (( expected <= 0 || stored * 100 < expected * (100 - pprof_delay_tolerance_percent) \
        || stored * 100 > expected * (100 + pprof_delay_tolerance_percent) )); then
    fail "$pod's $profile delay deltas under $function add up to $stored ns, not the $expected ns it measured (within $pprof_delay_tolerance_percent %): $(sort -t' ' -k2 -n <<<"$folded" | tail -3)"
  fi
}

# pprof_total TYPE MATCHERS FROM TO: the store's total of TYPE{MATCHERS} in the range.
pprof_total() {
  "$kiln_cli" query --format json --from "$3" --to "$4" "$1$2" | jq -r '.total'
}

# stored_since TYPE MATCHERS FROM TO: whether the store holds TYPE{MATCHERS} in the range.
stored_since() {
  local total
  total="$(pprof_total "$@" 2>/dev/null)" || return 1
  [ "${total:-0}" -gt 0 ]
}

# sum_under FUNCTION < FOLDED: the values of the folded stacks that name FUNCTION.
sum_under() {
  awk -v function_name="$1" '
    { n = split(substr($0, 1, length($0) - length($NF) - 1), frames, ";")
      for (i = 1; i <= n; i++) if (frames[i] == function_name) { sum += $NF; break } }
    END { printf "%.0f\n", sum }'
}

# agent_scrape_counters: the node agent's scrape counters from its /metrics, through the API
# server's pod proxy.
agent_scrape_counters() {
  local agent_pod
  agent_pod="$(kubectl -n "$system_ns" get pods -l "app.kubernetes.io/instance=$store_name,app.kubernetes.io/component=agent" \
    -o jsonpath='{.items[0].metadata.name}')"
  kubectl get --raw "/api/v1/namespaces/$system_ns/pods/$agent_pod:7471/proxy/metrics" 2>/dev/null \
    | awk '/^kiln_agent_scrape(s_total|_errors_total)/ { printf "%s ", $0 }'
}

check_pprof() {
  log "check 8c: a Go program's pprof endpoints on the cluster: heap site, goroutines, allocation deltas, labels"
  local began=$SECONDS
  kubectl apply -f "$e2e_dir/manifests/pprof.yaml" >/dev/null
  kubectl -n "$workload_ns" rollout status "deployment/$pprof_workload" --timeout=120s >/dev/null \
    || fail "the Go workload did not start"
  kubectl -n "$workload_ns" wait --for=condition=Ready "profilingtarget/$pprof_workload" --timeout=60s >/dev/null \
    || fail "ProfilingTarget $pprof_workload is not Ready: $(condition "profilingtarget/$pprof_workload" "$workload_ns" Ready)"
  forward_store
  local pod node pod_ip
  pod="$(pod_of "$pprof_workload")"
  [ -n "$pod" ] || fail "the Go workload's pod is not running"
  node="$(kubectl -n "$workload_ns" get pod "$pod" -o jsonpath='{.spec.nodeName}')"
  pod_ip="$(kubectl -n "$workload_ns" get pod "$pod" -o jsonpath='{.status.podIP}')"

  # The agent's first /allocs is its baseline: the range starts there.
  retry 90 1 allocs_scraped_since "$pod" 0 \
    || fail "the agent did not scrape $pod's /debug/pprof/allocs within 90 s (agent: $(agent_scrape_counters))"
  local first
  read -r first _ < <(pprof_scrapes "$pod" allocs)
  note "first scrape of $pod ($pod_ip) $((SECONDS - began)) s after the apply"
  retry $((pprof_range_seconds + 30)) 1 allocs_scraped_since "$pod" $((first + pprof_range_seconds * 1000)) \
    || fail "the agent stopped scraping $pod's /allocs (agent: $(agent_scrape_counters))"

  # The program's /allocs requests s_0 .. s_m, s_m the first a range after s_0. The delta
  # between s_i and s_i+1 is stored at s_i's time, so [s_0, s_m-1] holds the deltas of
  # s_0 .. s_m: the program's counter at s_m minus at s_0. Scrapes are 5 s apart, so a
  # second's slack on either side (the agent times a scrape when its answer is in) takes in
  # no other.
  local scrapes last_start last_ms last_allocated first_allocated deltas hosts
  scrapes="$(pprof_scrapes "$pod" allocs | awk -v until=$((first + pprof_range_seconds * 1000)) \
    '{ print } $1 >= until { exit }')"
  read -r _ first_allocated _ < <(head -1 <<<"$scrapes")
  read -r last_ms last_allocated _ < <(tail -1 <<<"$scrapes")
  last_start="$(tail -2 <<<"$scrapes" | head -1 | cut -d' ' -f1)"
  deltas=$(( $(wc -l <<<"$scrapes") - 1 ))
  hosts="$(pprof_scrapes "$pod" allocs | cut -d' ' -f4 | sort -u | tr '\n' ' ')"
  [ "$hosts" = "$pod_ip:6060 " ] || fail "$pod was scraped at ${hosts}rather than its pod IP $pod_ip:6060"
  local from=$((first / 1000)) to=$((last_start / 1000 + 2))
  local matchers="{namespace=\"$workload_ns\",pod=\"$pod\"}"
  retry 30 1 stored_since "$alloc_type" "$matchers" $((last_start / 1000)) "$to" \
    || fail "the alloc_space delta from $pod's scrape at $last_start ms is not in the store (agent: $(agent_scrape_counters))"

  local allocs expected stored all_stored
  allocs="$("$kiln_cli" query --format folded --from "$from" --to "$to" "$alloc_type$matchers")"
  expected=$((last_allocated - first_allocated))
  stored="$(sum_under main.allocateKnown <<<"$allocs")"
  all_stored="$(awk '{ sum += $NF } END { printf "%.0f\n", sum }' <<<"$allocs")"
  note "alloc_space, $deltas deltas stored from $from to $to (scrapes $(( (last_ms - first) / 1000 )) s apart):" \
    "$expected bytes allocated by main.allocateKnown by the program's counter, $stored stored under it" \
    "(ratio $(awk -v s="$stored" -v e="$expected" 'BEGIN { printf "%.4f", e ? s / e : 0 }')); $all_stored bytes stored in all"
  if (( expected <= 0 || stored * 100 < expected * (100 - pprof_tolerance_percent) \
        || stored * 100 > expected * (100 + pprof_tolerance_percent) )); then
    fail "$pod's alloc_space deltas under main.allocateKnown add up to $stored bytes, not the $expected it allocated (within $pprof_tolerance_percent %)"
  fi

  # Each goroutine profile is a gauge at its scrape's time: one per 2 s window.
  local at goroutines mismatches=0 counts="" stored_count scrapes_judged=0
  while read -r at _ goroutines _; do
    stored_count="$(pprof_total "$goroutine_type" "$matchers" $((at / 1000)) $((at / 1000 + 2)))"
    counts+="$stored_count/$goroutines "
    scrapes_judged=$((scrapes_judged + 1))
    if (( stored_count < goroutines - 2 || stored_count > goroutines + 2 )); then
      mismatches=$((mismatches + 1))
    fi
  done < <(pprof_scrapes "$pod" goroutine | awk -v from=$((from * 1000)) -v to=$((to * 1000)) '$1 >= from && $1 < to')
  note "goroutines stored/counted by the program, per scrape: $counts"
  [ "$scrapes_judged" -gt 0 ] || fail "the program served no goroutine profile from $from to $to"
  [ "$mismatches" = 0 ] || fail "$mismatches of $pod's $scrapes_judged goroutine profiles differ from the program's count by more than 2"
  local parked
  parked="$("$kiln_cli" query --format folded --from "$from" --to "$to" "$goroutine_type$matchers" | sum_under main.parked)"
  note "main.parked: $parked goroutines in $scrapes_judged profiles ($pprof_parked parked in each)"
  [ "$parked" = $((pprof_parked * scrapes_judged)) ] \
    || fail "main.parked holds $parked goroutines over $scrapes_judged profiles, not $pprof_parked in each"

  local heap_at inuse in_use
  heap_at="$(pprof_scrapes "$pod" heap | awk -v until="$last_start" '$1 <= until { at = $1 } END { print at }')"
  [ -n "$heap_at" ] || fail "the program served no heap profile by $last_start ms"
  inuse="$("$kiln_cli" query --format folded --from $((heap_at / 1000)) --to $((heap_at / 1000 + 2)) "$inuse_type$matchers")"
  in_use="$(sum_under main.allocateKnown <<<"$inuse")"
  note "inuse_space at $heap_at ms: $in_use bytes under main.allocateKnown (it keeps $pprof_retained_bytes in use)," \
    "$(awk '{ sum += $NF } END { printf "%.0f\n", sum }' <<<"$inuse") in all"
  [ "${in_use:-0}" -gt 0 ] || fail "main.allocateKnown is on none of $pod's in-use heap stacks: $(head -5 <<<"$inuse")"

  # Mutex and block: scraped on the same cadence as allocs since the pod started, so their
  # ranges are about done too.
  check_delays "$pod" mutex "$mutex_type" main.contendKnown 5
  check_delays "$pod" block "$block_type" main.blockKnown 6

  local type series
  for type in "$inuse_type" "$alloc_type" "$goroutine_type" "$mutex_type" "$block_type"; do
    series="$("$kiln_cli" series --json --from "$from" --to "$to" "$type$matchers")"
    jq -e --arg ns "$workload_ns" --arg pod "$pod" --arg node "$node" --arg container "$pprof_container" \
      --arg service "$pprof_service" \
      'length >= 1 and all(.[]; .namespace == $ns and .pod == $pod and .container == $container
                            and .node == $node and .service_name == $service and .suite == "e2e-pprof")' \
      <<<"$series" >/dev/null \
      || fail "$type of $pod is not labelled namespace=$workload_ns pod=$pod container=$pprof_container node=$node service_name=$pprof_service suite=e2e-pprof: $(jq -c . <<<"$series")"
  done
  note "labels of all five: $(jq -c '.[0] | del(.__name__)' <<<"$series")"
  note "agent: $(agent_scrape_counters)"
  note "check 8c took $((SECONDS - began)) s"
  kubectl delete -f "$e2e_dir/manifests/pprof.yaml" --wait=false >/dev/null
}
