# shellcheck shell=bash
# shellcheck disable=SC2154 # a sourced file: it uses variables set by e2e/run.sh, which sources it after e2e/lib.sh and checks/0_setup.sh
# Check 8d: a store of three replicas on a real object store in the cluster (issue 50). A
# ProfileStore with `replicas: 3` (e2e/manifests/replicas.yaml) keeps its blocks in a bucket
# of SeaweedFS running in the cluster (e2e/manifests/seaweedfs.yaml; its image is built here
# from the `weed` binary that `./kiln-dev test` builds). While it runs, the suite's store
# `kiln` has its agents off, so the node's agents are this store's: they ship the annotated
# pod's profiles (relayed by its annotation) to the one replica they pick by node name. Then,
# for one closed range (it ends two agent windows before the first query, so every profile
# in it has been acknowledged):
#   - through a port-forward to each replica's pod in turn, `kiln query` counts the same
#     samples of the pod, and /api/v1/folded gives the same stacks, with no Kiln-Partial: the
#     two replicas that took none of the writes answer from the writer's unflushed head, which
#     they ask for as its peers (the check prints each replica's head and listed blocks);
#   - the writer's pod is deleted: it flushes its head to the bucket as it exits, and its
#     disk (an emptyDir) goes with it. The two others are asked again and again, both at
#     once, until the new pod is Ready and each has given the range's samples and stacks
#     again, complete. None may answer more than the range's samples, nor fewer without a
#     Kiln-Partial header: until they list the bucket again (every 15 s) and find the block
#     the writer flushed they hold none of the range, and say so (peers_unanswered=<writer>);
#   - then every replica, the new one too, gives the same samples and stacks, complete.
# Then the store and SeaweedFS are removed and `kiln` gets its agents back.

replicas_count=3
seaweedfs_image=localhost/kiln-e2e/seaweedfs:1
seaweedfs_binary="${KILN_E2E_WEED:-${KILN_TOOLS_DIR:-/var/tmp/kiln-tools}/seaweedfs/bin/weed}"
replicas_bucket=kiln-e2e
# How long after the writer's pod is deleted the others may take to answer the range complete
# again: they list the block it flushed as it exited within 15 s, and reach its new pod once
# their DNS answers forget the old pod's address (30 s on this cluster); 48 s measured.
replicas_catch_up_seconds=120

# SeaweedFS's image, made in setup so a missing binary stops the suite early.
build_seaweedfs_image() {
  local began=$SECONDS rootfs="$work_dir/seaweedfs-rootfs"
  [ -x "$seaweedfs_binary" ] \
    || fail "no SeaweedFS at $seaweedfs_binary (./kiln-dev test and ./kiln-dev e2e build it; KILN_E2E_WEED names another)"
  "$e2e_dir/images/rootfs.sh" "$rootfs" "$seaweedfs_binary=/usr/local/bin/weed" \
    || fail "cannot assemble SeaweedFS's root filesystem"
  # gzip level 1: its 166 MB in 2.5 s of CPU rather than 22 s, for a 10 % larger archive.
  load_image "$seaweedfs_image" "$rootfs" '["/usr/local/bin/weed"]' 1
  note "SeaweedFS image ($("$seaweedfs_binary" version 2>/dev/null | head -1)) in $((SECONDS - began)) s"
}

# create_bucket: whether `weed shell` in SeaweedFS's pod created the bucket (or found it).
create_bucket() {
  printf 's3.bucket.create -name %s\ns3.bucket.list\n' "$replicas_bucket" \
    | kubectl -n "$workload_ns" exec -i deployment/seaweedfs -- /usr/local/bin/weed shell \
        -master=127.0.0.1:9333.19333 -filer=127.0.0.1:8888.18888 2>/dev/null \
    | awk -v bucket="$replicas_bucket" '$1 == bucket { found = 1 } END { exit !found }'
}

# start_seaweedfs: SeaweedFS in the workload namespace with one identity, whose key is made for
# this run and given to the store in its own Secret, and the store's bucket.
start_seaweedfs() {
  local secret_key
  secret_key="$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
  # Files, not --from-literal: the key stays off every command line.
  (
    umask 077
    jq -n --arg secret "$secret_key" '{identities: [{name: "kiln-e2e",
      credentials: [{accessKey: "kiln-e2e", secretKey: $secret}],
      actions: ["Admin", "Read", "Write", "List", "Tagging"]}]}' >"$work_dir/s3.json"
    printf 'AWS_ACCESS_KEY_ID=kiln-e2e\nAWS_SECRET_ACCESS_KEY=%s\n' "$secret_key" >"$work_dir/s3.env"
  )
  kubectl -n "$workload_ns" create secret generic seaweedfs-s3 --from-file=s3.json="$work_dir/s3.json" \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl -n "$system_ns" create secret generic "$replicas_store-s3" --from-env-file="$work_dir/s3.env" \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  rm -f -- "$work_dir/s3.json" "$work_dir/s3.env"
  kubectl apply -f "$e2e_dir/manifests/seaweedfs.yaml" >/dev/null
  kubectl -n "$workload_ns" rollout status deployment/seaweedfs --timeout=120s >/dev/null \
    || fail "SeaweedFS did not start"
  # The shell fails until the master has registered the filer and the volume server.
  retry 60 1 create_bucket || fail "weed shell did not create the bucket $replicas_bucket in 60 s"
}

# Each replica's port-forward: replica_urls[I] and replica_forwards[I] (its process) for pod
# <store>-I.
replica_urls=()
replica_forwards=()

# forward_replica I: a port-forward to replica I's pod, once its /readyz answers through it.
forward_replica() {
  local pod="$replicas_store-$1"
  kubectl -n "$system_ns" wait --for=condition=Ready "pod/$pod" --timeout=180s >/dev/null \
    || fail "replica $pod is not Ready"
  open_forward "$system_ns" "pod/$pod" "$store_port"
  replica_urls[$1]="$forward_url"
  replica_forwards[$1]="$forward_pid"
  retry 60 1 curl -fsS -o /dev/null "$forward_url/readyz" \
    || fail "$pod's /readyz did not answer 200 through its port-forward"
}

# replica_samples URL SELECTOR FROM TO: the samples `kiln query` counts at one replica.
replica_samples() {
  KILN_STORE="$1" "$kiln_cli" query --format json --from "$3" --to "$4" "$2" | jq -r '.total'
}

# replica_has_samples URL SELECTOR FROM: whether the replica answers some samples since FROM.
replica_has_samples() {
  local total
  total="$(replica_samples "$1" "$2" "$3" now 2>/dev/null)" || return 1
  [ "${total:-0}" -gt 0 ]
}

# replica_folded URL SELECTOR FROM TO: "samples stacks digest partial seconds" of one
# replica's /api/v1/folded: the stacks' sum and count, a digest of the lines, its Kiln-Partial
# header with spaces as + ("-": complete), and how long it took. Fails when the replica does
# not answer 200 within 60 s (a query may take 30 s, --query-timeout).
replica_folded() {
  local headers="$work_dir/replica.${1##*:}.headers" body="$work_dir/replica.${1##*:}.folded"
  local partial status seconds
  read -r status seconds < <(curl -sS -G --max-time 60 -D "$headers" -o "$body" -w '%{http_code} %{time_total}\n' \
    --data-urlencode "query=$2" --data-urlencode "from=$3" --data-urlencode "to=$4" "$1/api/v1/folded" \
    || echo "000 0")
  if [ "$status" != 200 ]; then
    printf 'HTTP %s from %s: %s\n' "$status" "$1" "$(head -c 300 "$body")" >&2
    return 1
  fi
  partial="$(tr -d '\r' <"$headers" | sed -n 's/^kiln-partial: *//Ip' | tr ' ' '+')"
  printf '%s %s %s %s %s\n' "$(awk '{ sum += $NF } END { printf "%.0f", sum }' "$body")" \
    "$(wc -l <"$body")" "$(sha256sum "$body" | cut -c1-16)" "${partial:--}" "$seconds"
}

# replica_metric URL NAME: the sum of a replica's /metrics samples of NAME (over its labels).
replica_metric() {
  curl -fsS "$1/metrics" | awk -v name="$2" '$1 == name || index($1, name "{") == 1 { sum += $NF }
    END { printf "%.0f\n", sum }'
}

# replica_replaced POD UID: whether POD is a new pod (not UID) and Ready.
replica_replaced() {
  kubectl -n "$system_ns" get pod "$1" -o json 2>/dev/null | jq -e --arg old "$2" \
    '.metadata.uid != $old and .metadata.deletionTimestamp == null
     and any(.status.conditions[]?; .type == "Ready" and .status == "True")' >/dev/null
}

# answers_alike NAME URL SELECTOR FROM TO SAMPLES DIGEST: whether the store at URL (NAME in
# what it prints) answers SAMPLES and the stacks of DIGEST, complete, both through
# `kiln query` and /api/v1/folded; prints its answer.
answers_alike() {
  local samples answer total stacks digest partial seconds
  samples="$(replica_samples "$2" "$3" "$4" "$5")" || return 1
  answer="$(replica_folded "$2" "$3" "$4" "$5")" || return 1
  read -r total stacks digest partial seconds <<<"$answer"
  note "$1: kiln query $samples samples; /api/v1/folded $total samples in $stacks stacks" \
    "(digest $digest) in $seconds s, Kiln-Partial: $partial"
  [ "$samples" = "$6" ] && [ "$total" = "$6" ] && [ "$digest" = "$7" ] && [ "$partial" = - ]
}

# replicas_agree SELECTOR FROM TO SAMPLES DIGEST: whether every replica's pod answers as
# answers_alike asks.
replicas_agree() {
  local i agreed=0
  for i in $(seq 0 $((replicas_count - 1))); do
    answers_alike "$replicas_store-$i" "${replica_urls[$i]}" "$@" || agreed=1
  done
  return "$agreed"
}

# wait_until UNIX_SECONDS: sleeps until then.
wait_until() {
  local now
  now="$(date +%s)"
  [ "$now" -ge "$1" ] || sleep $(($1 - now))
}

# delete_writer I SELECTOR FROM TO SAMPLES DIGEST: deletes replica I's pod, then asks the two
# others, both at once (a query started while a peer's address leads nowhere waits for it most
# of --query-timeout), until the new pod is Ready and each has answered SAMPLES in the stacks
# of DIGEST, complete. An answer above SAMPLES, below it without Kiln-Partial, or of other
# stacks fails the check.
delete_writer() {
  local writer="$1" selector="$2" from="$3" to="$4" samples="$5" digest="$6"
  local victim="$replicas_store-$1" old_uid deleted_at i survivors=()
  for i in $(seq 0 $((replicas_count - 1))); do
    [ "$i" = "$writer" ] || survivors+=("$i")
  done
  old_uid="$(kubectl -n "$system_ns" get pod "$victim" -o jsonpath='{.metadata.uid}')"
  close_forward "${replica_forwards[$writer]}"
  kubectl -n "$system_ns" delete pod "$victim" --wait=false >/dev/null
  deleted_at="$(date +%s)"
  local -A answers=() short=() same=() complete=()
  local back="" asked polling answer total got_digest partial seconds
  while :; do
    asked=$(($(date +%s) - deleted_at))
    polling=()
    for i in "${survivors[@]}"; do
      replica_folded "${replica_urls[$i]}" "$selector" "$from" "$to" >"$work_dir/survivor.$i" 2>&1 &
      polling+=("$!")
    done
    wait "${polling[@]}" || true
    for i in "${survivors[@]}"; do
      answer="$(cat "$work_dir/survivor.$i")"
      read -r total _ got_digest partial seconds <<<"$answer"
      [[ "$total" =~ ^[0-9]+$ ]] || fail "$replicas_store-$i did not answer, asked $asked s after $victim was deleted: $answer"
      note "+$asked s: $replicas_store-$i answered $total samples in $seconds s, Kiln-Partial: $partial"
      answers[$i]=$((${answers[$i]:-0} + 1))
      if [ "$total" -gt "$samples" ]; then
        fail "$replicas_store-$i answered $total samples, more than the range's $samples, asked $asked s after $victim was deleted"
      elif [ "$total" -lt "$samples" ]; then
        [ "$partial" != - ] || fail "$replicas_store-$i answered $total of the range's $samples samples," \
          "not marked partial, asked $asked s after $victim was deleted"
        short[$i]=$((${short[$i]:-0} + 1))
      elif [ "$got_digest" != "$digest" ]; then
        fail "$replicas_store-$i answered the range's $samples samples in other stacks (digest $got_digest, not $digest)"
      else
        same[$i]="${same[$i]:-$asked}"
        [ "$partial" != - ] || complete[$i]="${complete[$i]:-$asked}"
      fi
    done
    if [ -z "$back" ] && replica_replaced "$victim" "$old_uid"; then
      back="$(ready_since "$victim" "$deleted_at")"
    fi
    if [ -n "$back" ] && [ "${#complete[@]}" = "${#survivors[@]}" ]; then
      break
    fi
    [ $(($(date +%s) - deleted_at)) -lt "$replicas_catch_up_seconds" ] \
      || fail "$replicas_catch_up_seconds s after $victim was deleted: its new pod ${back:+Ready after $back s}${back:-not Ready};" \
        "complete answers from replicas ${!complete[*]} of ${survivors[*]}"
    sleep 1
  done
  note "$victim deleted: its new pod Ready $back s after the delete"
  for i in "${survivors[@]}"; do
    note "$replicas_store-$i: ${answers[$i]} answers, ${short[$i]:-0} of them short and marked partial;" \
      "the range's $samples samples again in the answer asked at +${same[$i]} s, complete at +${complete[$i]} s"
  done
}

# ready_since POD UNIX_SECONDS: the seconds from UNIX_SECONDS to POD's last Ready transition.
ready_since() {
  local ready_at
  ready_at="$(kubectl -n "$system_ns" get pod "$1" -o json \
    | jq -r '.status.conditions[] | select(.type == "Ready") | .lastTransitionTime | fromdateiso8601')"
  echo $((ready_at - $2))
}

check_replicas() {
  log "check 8d: three store replicas on SeaweedFS: the same complete answer at each, and one's pod deleted"
  local began=$SECONDS since pod
  since="$(date +%s)"
  pod="$(pod_of annotated)"
  [ -n "$pod" ] || fail "the annotated workload pod is not running"
  # The oldest store with agents enabled owns the node's agents: with `kiln`'s off, they are
  # the replicated store's.
  patch_store '{"spec":{"agent":{"enabled":false}}}'
  start_seaweedfs
  note "SeaweedFS serves bucket $replicas_bucket $((SECONDS - began)) s into the check"
  kubectl apply -f "$e2e_dir/manifests/replicas.yaml" >/dev/null
  kubectl -n "$system_ns" wait --for=condition=Available "profilestore/$replicas_store" --timeout=180s >/dev/null \
    || fail "ProfileStore $replicas_store is not Available: $(condition "profilestore/$replicas_store" "$system_ns" Available)"
  kubectl -n "$system_ns" rollout status "statefulset/$replicas_store" --timeout=180s >/dev/null \
    || fail "the $replicas_count replicas of $replicas_store did not roll out"
  kubectl -n "$system_ns" wait --for=condition=AgentsReady "profilestore/$replicas_store" --timeout=180s >/dev/null \
    || fail "$replicas_store's agents are not ready: $(condition "profilestore/$replicas_store" "$system_ns" AgentsReady)"
  note "$replicas_count replicas and the node's agents ready $((SECONDS - began)) s into the check;" \
    "--peers: $(kubectl -n "$system_ns" get statefulset "$replicas_store" -o json \
      | jq -r '.spec.template.spec.containers[0].args[] | select(startswith("--peers=")) | ltrimstr("--peers=")')"
  local i
  for i in $(seq 0 $((replicas_count - 1))); do
    forward_replica "$i"
  done

  local selector="$samples_type{namespace=\"$workload_ns\",pod=\"$pod\"}"
  retry 120 2 replica_has_samples "${replica_urls[0]}" "$selector" "$since" \
    || fail "no profile of $pod reached $replicas_store within 2 minutes"
  # From here on by its full name: a replica resolves a short type from what it can read, and
  # one whose peer holding all of it is away has nothing to resolve it from.
  local full_type
  full_type="$(curl -fsS "${replica_urls[0]}/api/v1/profile-types" \
    | jq -r --arg short "$samples_type" '[.profile_types[].id | select(startswith($short + ":"))] | first // empty')"
  [ -n "$full_type" ] || fail "$replicas_store lists no $samples_type profile type"
  selector="$full_type{namespace=\"$workload_ns\",pod=\"$pod\"}"
  # A range closed two agent windows before it is asked for: every profile in it is
  # acknowledged by then.
  local first_seen to
  first_seen="$(date +%s)"
  to=$((first_seen + agent_window_seconds))
  note "first profile of $pod $((SECONDS - began)) s into the check; the range is $since to $to" \
    "($(date -u -d "@$since" +%T) to $(date -u -d "@$to" +%T) UTC), asked from $(date -u -d "@$((to + 2 * agent_window_seconds))" +%T)"
  wait_until $((to + 2 * agent_window_seconds))

  # The replica the agents ship to took every profile; the others took none.
  local writer="" most=0 ingested
  for i in $(seq 0 $((replicas_count - 1))); do
    ingested="$(replica_metric "${replica_urls[$i]}" kiln_ingested_profiles_total)"
    note "$replicas_store-$i: took $ingested profiles; head $(replica_metric "${replica_urls[$i]}" kiln_head_profiles) profiles," \
      "$(replica_metric "${replica_urls[$i]}" kiln_pending_uploads) pending uploads, $(replica_metric "${replica_urls[$i]}" kiln_blocks) blocks listed"
    if [ "$ingested" -gt "$most" ]; then
      most="$ingested"
      writer="$i"
    fi
  done
  [ -n "$writer" ] || fail "no replica of $replicas_store took a profile"

  # The same answer through each replica's pod.
  local answer samples stacks digest
  answer="$(replica_folded "${replica_urls[$writer]}" "$selector" "$since" "$to")" \
    || fail "$replicas_store-$writer did not answer"
  read -r samples stacks digest _ <<<"$answer"
  [ "$samples" -gt 0 ] || fail "$replicas_store-$writer holds no samples of $pod from $since to $to"
  replicas_agree "$selector" "$since" "$to" "$samples" "$digest" \
    || fail "the replicas of $replicas_store do not all give $replicas_store-$writer's complete answer ($samples samples, digest $digest)"
  # And through the Service, as a user port-forwards to it (kubectl picks one of its pods).
  open_forward "$system_ns" "svc/$replicas_store" "$store_port"
  retry 60 1 curl -fsS -o /dev/null "$forward_url/readyz" \
    || fail "svc/$replicas_store's /readyz did not answer 200 through the port-forward"
  answers_alike "svc/$replicas_store" "$forward_url" "$selector" "$since" "$to" "$samples" "$digest" \
    || fail "svc/$replicas_store does not give the replicas' complete answer ($samples samples, digest $digest)"
  close_forward "$forward_pid"
  note "all $replicas_count replicas and the Service: $samples samples in $stacks stacks, complete," \
    "$((SECONDS - began)) s into the check"

  delete_writer "$writer" "$selector" "$since" "$to" "$samples" "$digest"
  forward_replica "$writer"
  retry 60 2 replicas_agree "$selector" "$since" "$to" "$samples" "$digest" \
    || fail "$replicas_store-$writer is back, but the replicas do not all give the range's $samples samples, complete"
  note "after the restart all $replicas_count replicas give the same $samples samples, complete"

  stop_forward
  kubectl -n "$system_ns" delete profilestore "$replicas_store" --wait=true --timeout=120s >/dev/null \
    || fail "ProfileStore $replicas_store was not deleted within 2 minutes"
  kubectl -n "$system_ns" delete secret "$replicas_store-s3" --ignore-not-found >/dev/null
  kubectl delete -f "$e2e_dir/manifests/seaweedfs.yaml" --wait=false >/dev/null
  kubectl -n "$workload_ns" delete secret seaweedfs-s3 --ignore-not-found >/dev/null
  patch_store '{"spec":{"agent":{"enabled":true}}}'
  note "check 8d took $((SECONDS - began)) s"
}
