# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 8: runtimes as shipped. A JVM (this machine's OpenJDK 17, cut to java.base by jlink, as
# many real images are) and a Node (this machine's node 20) run in pods with no profiling
# flags; through the port-forwarded store and `kiln query`, the stacks of each must name its
# hot function under its caller. The agent reads HotSpot's and V8's own metadata, through
# /proc/PID/root, so nothing in the images helps it.
#
# The share is judged on the program's own thread, as the privileged tests judge the program's
# samples (agent/tests/privileged/java_frames.rs, node_frames.rs): HotSpot names its compiler,
# GC and VM threads, and only the launcher's threads keep the comm `java` (the primordial one
# waits), so `comm=java` is the thread running main(). Node 20 names every thread `node`; its
# helpers idle beside a loop that allocates nothing, so all of the pod's samples count.

jvm_image=localhost/kiln-e2e/jvm:1
node_image=localhost/kiln-e2e/node:1
# The JDK whose jlink, javac and java.base make the JVM image (Debian's openjdk-17-jdk).
jdk_home="${KILN_E2E_JDK:-/usr/lib/jvm/java-17-openjdk-amd64}"
jvm_hot='KilnE2e.kilnE2eHot(J)J'
jvm_caller='KilnE2e.kilnE2eCaller(J)J'
node_hot=kilnE2eHotJs
node_caller=kilnE2eCallerJs
# Samples of the program's thread each share is judged on (a second or two of CPU at 99 Hz).
runtime_min_samples=300
runtime_floor_percent=95

# load_image NAME ROOTFS ENTRYPOINT_JSON [GZIP_LEVEL]: writes ROOTFS as image NAME (nonroot),
# its layer gzip'd at GZIP_LEVEL (default 9), and loads it.
load_image() {
  local name="$1" rootfs="$2" entrypoint="$3" level="${4:-9}" archive
  archive="$work_dir/$(basename "${name%:*}").tar"
  SOURCE_DATE_EPOCH="$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)" \
    "$e2e_dir/images/oci-image.py" --name "$name" --rootfs "$rootfs" --output "$archive" \
    --entrypoint "$entrypoint" --user 65532:65532 --compress-level "$level" >/dev/null \
    || fail "cannot write the image $name"
  # shellcheck disable=SC2086 # KILN_E2E_LOAD_IMAGE is a command line
  ${KILN_E2E_LOAD_IMAGE:-$e2e_dir/images/load.sh} "$archive" >/dev/null \
    || fail "cannot load $archive into the nodes (set KILN_E2E_LOAD_IMAGE)"
  note "image $name ($(du -k "$archive" | cut -f1) KiB) loaded"
}

# The JVM and Node images, made in setup so a missing JDK or node stops the suite early.
build_runtime_images() {
  local began=$SECONDS node_binary
  [ -x "$jdk_home/bin/jlink" ] && [ -x "$jdk_home/bin/javac" ] \
    || fail "no jlink and javac in $jdk_home (Debian's openjdk-17-jdk; KILN_E2E_JDK names another JDK)"
  node_binary="$(command -v node)" || fail "node is needed by the suite (./kiln-dev test installs it)"

  local jvm_rootfs="$work_dir/jvm-rootfs" runtime="$work_dir/jvm-runtime"
  "$jdk_home/bin/jlink" --add-modules java.base --strip-debug --no-man-pages --no-header-files \
    --compress=2 --output "$runtime" || fail "jlink could not make a java.base runtime"
  mkdir -p "$jvm_rootfs/opt" "$jvm_rootfs/app"
  cp -a "$runtime" "$jvm_rootfs/opt/java"
  # The system libraries that libjvm and the launcher's libjli load (the runtime's own come
  # with it above).
  "$e2e_dir/images/rootfs.sh" "$jvm_rootfs" \
    "$runtime/lib/server/libjvm.so=/opt/java/lib/server/libjvm.so" \
    "$runtime/lib/libjli.so=/opt/java/lib/libjli.so" \
    || fail "cannot assemble the JVM's root filesystem"
  "$jdk_home/bin/javac" --release 17 -d "$jvm_rootfs/app" "$e2e_dir/workload/KilnE2e.java" \
    || fail "javac could not compile e2e/workload/KilnE2e.java"
  load_image "$jvm_image" "$jvm_rootfs" '["/opt/java/bin/java","-cp","/app","KilnE2e"]'

  local node_rootfs="$work_dir/node-rootfs"
  "$e2e_dir/images/rootfs.sh" "$node_rootfs" "$(readlink -f "$node_binary")=/usr/local/bin/node" \
    || fail "cannot assemble Node's root filesystem"
  install -D -m 0644 "$e2e_dir/workload/hot_loop.js" "$node_rootfs/app/hot_loop.js"
  load_image "$node_image" "$node_rootfs" '["/usr/local/bin/node","/app/hot_loop.js"]'
  note "runtime images ($("$jdk_home/bin/java" -version 2>&1 | head -1), node $("$node_binary" --version)) in $((SECONDS - began)) s"
}

# runtime_stacks POD FROM: the pod's sample counts as folded stacks, each under a root frame
# `comm=NAME` (its thread's name).
runtime_stacks() {
  "$kiln_cli" query --format folded --group-by comm --from "$2" \
    "$samples_type{namespace=\"$workload_ns\",pod=\"$1\"}"
}

# runtime_shares COMM HOT CALLER LANGUAGE < FOLDED: prints "pod thread hot with_caller" sample
# counts: all of the pod's samples, those of the threads named COMM, and of those the ones
# naming HOT and HOT under CALLER. For java, CALLER must be the next Java method towards the
# root (frames between, such as the interpreter's or a call stub, are skipped); for js, CALLER
# must be on the stack somewhere towards the root.
# With a fifth argument "misses" it prints, instead, the thread's stacks that do not name HOT
# under CALLER.
runtime_shares() {
  awk -v comm="comm=$1" -v hot="$2" -v caller="$3" -v language="$4" -v misses="${5:-}" '
    # A Java method as the agent names it: Class.method(signature)...
    function java_frame(frame) { return frame ~ /^[A-Za-z_$][A-Za-z0-9_$\/.]*\.[A-Za-z_$<][A-Za-z0-9_$<>]*\(/ }
    {
      count = $NF
      stack = substr($0, 1, length($0) - length($NF) - 1)
      pod += count
      n = split(stack, frames, ";")
      if (frames[1] != comm) next
      thread += count
      at = 0
      for (i = n; i >= 2; i--) if (frames[i] == hot) { at = i; break }
      found = 0
      if (at) {
        named += count
        for (i = at - 1; i >= 2; i--) {
          if (language == "java" && java_frame(frames[i])) { found = frames[i] == caller; break }
          if (language == "js" && frames[i] == caller) { found = 1; break }
        }
      }
      if (found) with_caller += count
      else if (misses) print
    }
    END { if (!misses) printf "%d %d %d %d\n", pod, thread, named, with_caller }'
}

# enough_runtime_samples POD COMM FROM: whether the store holds enough samples of POD's thread.
enough_runtime_samples() {
  local stacks thread
  stacks="$(runtime_stacks "$1" "$3" 2>/dev/null)" || return 1
  thread="$(runtime_shares "$2" "" "" "" <<<"$stacks" | cut -d' ' -f2)"
  [ "${thread:-0}" -ge "$runtime_min_samples" ]
}

# heaviest N < FOLDED: the N folded lines with the most samples.
heaviest() {
  # awk, not head: sort must not be cut off mid-write (pipefail).
  awk '{ print $NF " " $0 }' | sort -n -r | awk -v n="$1" 'NR <= n' | cut -d' ' -f2-
}

# leaf_end: each line cut to its last 300 characters, the leaf end of a stack.
leaf_end() {
  awk '{ print (length($0) > 300 ? "..." substr($0, length($0) - 299) : $0) }'
}

# percent PART WHOLE: PART as a percentage of WHOLE, one decimal.
percent() {
  awk -v part="$1" -v whole="$2" 'BEGIN { printf "%.1f", whole ? 100 * part / whole : 0 }'
}

# judge_runtime NAME POD COMM HOT CALLER LANGUAGE FROM: asserts the floor on POD's stacks.
judge_runtime() {
  local name="$1" pod="$2" comm="$3" hot="$4" caller="$5" language="$6" since="$7"
  local stacks pod_samples thread named with_caller share
  stacks="$(runtime_stacks "$pod" "$since")"
  read -r pod_samples thread named with_caller < <(runtime_shares "$comm" "$hot" "$caller" "$language" <<<"$stacks")
  share="$(percent "$with_caller" "$thread")"
  note "$name ($pod): $pod_samples samples, $thread on the program's thread (comm=$comm);" \
    "of those $share % name $hot under $caller, $(percent "$named" "$thread") % name $hot"
  note "  hottest stack: $(heaviest 1 <<<"$stacks" | leaf_end)"
  if awk -v share="$share" -v floor="$runtime_floor_percent" 'BEGIN { exit !(share < floor) }'; then
    note "  the heaviest stacks of comm=$comm that do not name $hot under $caller:"
    runtime_shares "$comm" "$hot" "$caller" "$language" misses <<<"$stacks" \
      | heaviest 5 | leaf_end | sed 's/^/     /'
    fail "$name: only $share % of $pod's $thread samples on its thread (comm=$comm) name $hot under $caller (floor $runtime_floor_percent %)"
  fi
}

check_runtimes() {
  log "check 8: a JVM and a Node started without flags: their hot functions are named under their callers"
  local began=$SECONDS
  kubectl apply -f "$e2e_dir/manifests/runtimes.yaml" >/dev/null
  kubectl -n "$workload_ns" rollout status deployment/jvm --timeout=120s >/dev/null \
    || fail "the JVM workload did not start"
  kubectl -n "$workload_ns" rollout status deployment/node --timeout=120s >/dev/null \
    || fail "the Node workload did not start"
  forward_store
  local jvm_pod node_pod started since
  jvm_pod="$(pod_of jvm)"
  node_pod="$(pod_of node)"
  if [ -z "$jvm_pod" ] || [ -z "$node_pod" ]; then fail "the runtime pods are not running"; fi
  # Judge the steady state: from an agent window and a half after the later start, so no
  # window holds the JVM's class loading or Node's bootstrap.
  started="$(kubectl -n "$workload_ns" get pod "$jvm_pod" "$node_pod" -o json \
    | jq -r '[.items[].status.containerStatuses[0].state.running.startedAt | fromdateiso8601] | max')"
  since=$((started + agent_window_seconds * 3 / 2))
  [ "$(date +%s)" -ge "$since" ] || sleep $((since - $(date +%s)))
  retry 180 5 enough_runtime_samples "$jvm_pod" java "$since" \
    || fail "fewer than $runtime_min_samples samples of $jvm_pod's main thread reached the store within 3 minutes"
  retry 120 5 enough_runtime_samples "$node_pod" node "$since" \
    || fail "fewer than $runtime_min_samples samples of $node_pod's thread reached the store within 2 minutes"
  note "enough samples of both $((SECONDS - began)) s after the Deployments were applied"
  judge_runtime "OpenJDK 17 (jlink java.base), no flags" "$jvm_pod" java "$jvm_hot" "$jvm_caller" java "$since"
  judge_runtime "node $(node --version), no flags" "$node_pod" node "$node_hot" "$node_caller" js "$since"
  # Their CPU is not needed by the checks after this one.
  kubectl delete -f "$e2e_dir/manifests/runtimes.yaml" --wait=false >/dev/null
}
