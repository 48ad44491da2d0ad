#!/bin/bash
# controller-scale.sh - the controller's resync at scale, on the test bed's real API server
# (cluster mode: etcd + kube-apiserver v1.37 in the node, nothing else running): COUNT Nodes (as a
# kubelet registers them), their GpuNodes of GPUS GPUs each (as an agent reports them) and a slurmd
# pod bound to each Node (label app.kubernetes.io/name=slurmd, asking for the node's GPUs, as a
# Slinky NodeSet's; Pending, with the start time a kubelet reports: the controller's Drifted check
# reads it), created in bulk. Three processes are measured, each a fresh one per run:
#   the yardstick   `controller-scale resync` (kube-runtime's bare Controller over GpuNodes, a
#                   reconcile that only counts: the watch/list/queue machinery without API writes),
#                   printing its CPU time and RSS once every object is reconciled;
#   now             `mockgpu-controller run` (CONTROLLER_BIN), sampled from /proc likewise;
#   before          the same of BEFORE_BIN when set: another build of the controller (the one
#                   before a change), which must take the same command line and print the same CRD.
# They run interleaved, RUNS rounds of one run each (the controllers' order alternating from round
# to round), so that the machine's load changes hit all of them alike: first RUNS rounds with 0
# GpuNodes (the idle baselines), then RUNS with COUNT. Between those, one run of CONTROLLER_BIN
# converges the cluster (labels the Nodes, writes the GpuNodes' conditions, records Events: the
# first contact), so that the measured runs are what a full resync is: a controller (re)starting
# on a cluster that is already as it wants it, which writes nothing (each run prints its writes,
# from its mockgpu_controller_api_writes metric). Side by side, the API server's own latency for a
# full LIST of the same GpuNodes (kubectl's time to the headers and the server's
# apiserver_request_duration_seconds). Targets, for each controller in every round: RSS <= 8 KiB
# per GpuNode (over its idle median), CPU <= 1.5 x the yardstick's in the same round.
# Not in CI (minutes of two busy cores). Needs root and the Kubernetes binaries (tests/build-k8s.sh).
#   cargo build --release -p mockgpu-controller -p mockgpu-controller-scale -p mockgpu-testbed
#   sudo flock /tmp/mgtb-cluster.lock bench/controller-scale.sh
# Env: COUNT (5000), GPUS (8), RUNS (3), SCALE_BIN, CONTROLLER_BIN, CRI_BIN (target/release),
#      BEFORE_BIN (unset: no before), TB (/var/tmp/mgk8s-tb, as testbed.sh).
#      Output: stdout and bench/out/controller-scale.txt.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COUNT=${COUNT:-5000}; GPUS=${GPUS:-8}; RUNS=${RUNS:-3}
SCALE_BIN=${SCALE_BIN:-$REPO/target/release/controller-scale}
CONTROLLER_BIN=${CONTROLLER_BIN:-$REPO/target/release/mockgpu-controller}
BEFORE_BIN=${BEFORE_BIN:-}
export CRI_BIN=${CRI_BIN:-$REPO/target/release/mgtb-cri} CLUSTER=1 RUST_BACKTRACE=0
TESTBED=("bash" "$REPO/tests/testbed/testbed.sh")
# the bench starts no pod of the product images: the cluster comes up without them (no build)
export PRODUCT_IMAGES=${PRODUCT_IMAGES:-none}
OUT=$REPO/bench/out/controller-scale.txt
RSS_TARGET_KIB=8; CPU_TARGET_X=1.5
for v in COUNT GPUS RUNS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "$v must be a positive integer, not '${!v}'" >&2; exit 2; }
done
# the controllers measured, by name, and their binaries
CTLS=(now); declare -A BIN=([now]=$CONTROLLER_BIN)
[ -z "$BEFORE_BIN" ] || { CTLS+=(before); BIN[before]=$BEFORE_BIN; }
for b in "$SCALE_BIN" "${BIN[@]}" "$CRI_BIN"; do
  [ -x "$b" ] || { echo "no $b (cargo build --release -p mockgpu-controller -p mockgpu-controller-scale -p mockgpu-testbed)" >&2; exit 2; }
done
# one cluster serves both controllers: the CRD applied (CONTROLLER_BIN's) must be BEFORE_BIN's too
if [ -n "$BEFORE_BIN" ] && ! cmp -s <("$CONTROLLER_BIN" crd) <("$BEFORE_BIN" crd); then
  echo "the GpuNode CRDs of CONTROLLER_BIN ($CONTROLLER_BIN) and BEFORE_BIN ($BEFORE_BIN) differ" >&2; exit 2
fi
mkdir -p "$REPO/bench/out"

"${TESTBED[@]}" bootstrap
trap '"${TESTBED[@]}" down' EXIT
"${TESTBED[@]}" up
"${TESTBED[@]}" control-plane
eval "$("${TESTBED[@]}" env)"
innet() { nsenter -t "$NODE_PID" -n -- env KUBECONFIG="$KUBECONFIG" "$@"; }
kc() { innet "$K8S_BIN/kubectl" --request-timeout=120s "$@"; }
scale() { innet "$SCALE_BIN" "$@"; }

LIST=/apis/mockgpu.io/v1alpha1/gpunodes
# sum and count of apiserver_request_duration_seconds for LISTs of gpunodes
list_metric() {
  kc get --raw /metrics | awk '/^apiserver_request_duration_seconds_(sum|count)\{/ && /resource="gpunodes"/ && /verb="LIST"/ {
    if ($1 ~ /_sum\{/) s += $2; else c += $2 } END {printf "%.6f %d\n", s, c}'
}
mean_ms_since() {  # mean_ms_since <"sum count" before>: mean server-side LIST duration since then
  local s0 c0 s1 c1; read -r s0 c0 <<< "$1"; read -r s1 c1 < <(list_metric)
  awk -v a="$s0" -v b="$s1" -v c="$c0" -v d="$c1" 'BEGIN {n = d - c; if (n > 0) printf "%.1f ms over %d LISTs", 1000 * (b - a) / n, n; else print "no LIST"}'
}
# a controller (<name>: now or before): `${BIN[name]} run` in the node's network namespace, sampled
# from outside (/proc/<pid>/stat, VmRSS) once its /metrics show it leads, has reconciled <expect>
# GpuNodes (the reconcile histogram's count) and has settled: its reconciles and writes unchanged
# for QUIET_S (the sampled CPU includes that idle second, a few ms). Converging (<converge> 1), it
# must also have labelled <expect> Nodes and written <expect> GpuNodes' conditions, and settle for
# CONVERGE_QUIET_S (its writes' echoes come back debounced). Then SIGTERM (it releases the Lease).
# 55a65f0's controller (before kube-runtime's stores) takes the same flags and has these metrics.
CTL_METRICS=http://127.0.0.1:18080/metrics
QUIET_S=${QUIET_S:-1}; CONVERGE_QUIET_S=${CONVERGE_QUIET_S:-5}
ctl_scrape() {  # "leader reconciles labels conditions events" from one scrape (empty if none)
  innet curl -sf "$CTL_METRICS" | awk '
    $1 == "mockgpu_controller_leader" {l = $2}
    $1 == "mockgpu_controller_reconcile_duration_seconds_count" {n = $2}
    $1 ~ /^mockgpu_controller_api_writes_total\{/ {
      if ($1 ~ /"node_labels"/) wl = $2; else if ($1 ~ /"gpunode_conditions"/) wc = $2; else if ($1 ~ /"event"/) we = $2 }
    END {if (l != "") printf "%d %d %d %d %d\n", l, n, wl, wc, we}'
}
controller_run() {  # controller_run <name> <expect> <converge 0|1>: one line like resync's
  local name=$1 expect=$2 converge=$3 log="$W/controller-$1.log"
  local pid t0 end now first="" sig last="" since=0 m l n wl wc we ut stt tck quiet=$QUIET_S; tck=$(getconf CLK_TCK); t0=$(date +%s%N)
  [ "$converge" = 0 ] || quiet=$CONVERGE_QUIET_S
  nsenter -t "$NODE_PID" -n -- env KUBECONFIG="$KUBECONFIG" "${BIN[$name]}" run --namespace default --identity "bench-$name-$t0" --listen 127.0.0.1:18080 \
    --kubeconfig "$KUBECONFIG" --stale-after 3600 > "$log" 2>&1 &
  pid=$!; end=$(( $(date +%s) + 600 ))
  while :; do
    kill -0 "$pid" 2> /dev/null || { tail "$log" >&2; echo "the controller ($name) exited" >&2; return 1; }
    [ "$(date +%s)" -lt "$end" ] || { kill "$pid"; echo "the controller ($name) did not settle on $expect GpuNodes in 600 s" >&2; return 1; }
    m=$(ctl_scrape || true); now=$(date +%s%N)
    if [ -n "$m" ]; then
      read -r l n wl wc we <<< "$m"
      sig="$n $wl $wc $we"
      [ "$sig" = "$last" ] || { last=$sig; since=$now; }
      if [ "$l" = 1 ] && [ "$n" -ge "$expect" ] && { [ "$converge" = 0 ] || { [ "$wl" -ge "$expect" ] && [ "$wc" -ge "$expect" ]; }; }; then
        [ -n "$first" ] || first=$now
        [ $(( now - since )) -lt $(( quiet * 1000000000 )) ] || break
      fi
    fi
    sleep 0.1
  done
  read -r ut stt < <(cut -d' ' -f14,15 "/proc/$pid/stat")    # utime, stime (clock ticks)
  echo "controller $name objects=$expect reconciled=$n reconciled_ms=$(( (first - t0) / 1000000 )) settled_ms=$(( (since - t0) / 1000000 )) cpu_ms=$(( (ut + stt) * 1000 / tck )) user_ms=$(( ut * 1000 / tck )) sys_ms=$(( stt * 1000 / tck )) rss_kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status") label_writes=$wl condition_writes=$wc event_writes=$we"
  kill -TERM "$pid"; wait "$pid" || true
}
order() {  # order <round>: the controllers in that round's order, reversed every other round
  if (( $1 % 2 )); then printf '%s\n' "${CTLS[@]}"; else printf '%s\n' "${CTLS[@]}" | tac; fi
}
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }     # field <name> < resync line
range() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%s-%s", lo, hi}'; }
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
per_node() {  # per_node <runs> <idle KiB>: each run's RSS over the idle process's, per GpuNode (KiB)
  field rss_kib < "$1" | awk -v i="$2" -v n="$COUNT" '{printf "%.2f\n", ($1 - i) / n}'
}
cpu_ratio() {  # cpu_ratio <controller's runs>: each round's CPU over the yardstick's in that round
  paste -d' ' <(field cpu_ms < "$1") <(field cpu_ms < "$W/full") | awk '{printf "%.2f\n", $1 / $2}'
}
verdict() {  # verdict <target> < values: PASS if every value is <= target, else FAIL and how many are not
  awk -v t="$1" '$1 > t {over++} END {if (over) printf "FAIL in %d of %d rounds", over, NR; else printf "PASS"}'
}
summary() {  # summary <name>: a controller's full resyncs, against the targets
  local f="$W/ctl-full-$1" i="$W/ctl-idle-$1" idle rss ratio writes
  idle=$(field rss_kib < "$i" | median); rss=$(per_node "$f" "$idle"); ratio=$(cpu_ratio "$f")
  writes=$(cat <(field label_writes < "$f") <(field condition_writes < "$f") <(field event_writes < "$f") | awk '{s += $1} END {print s + 0}')
  echo "  $1 (${BIN[$1]}):"
  echo "    CPU until all reconciled: $(field cpu_ms < "$f" | range) ms, $(range <<< "$ratio") x the yardstick's in the same round: $(verdict "$CPU_TARGET_X" <<< "$ratio") (target <= $CPU_TARGET_X x); idle process $(field cpu_ms < "$i" | range) ms"
  echo "    RSS per GpuNode:          $(range <<< "$rss") KiB over the idle median $idle KiB: $(verdict "$RSS_TARGET_KIB" <<< "$rss") (target <= $RSS_TARGET_KIB KiB); RSS idle $(field rss_kib < "$i" | range) KiB, with $COUNT $(field rss_kib < "$f" | range) KiB"
  echo "    all reconciled:           $(field reconciled_ms < "$f" | range) ms after start; writes: labels $(field label_writes < "$f" | range), conditions $(field condition_writes < "$f" | range), events $(field event_writes < "$f" | range)$([ "$writes" = 0 ] || echo " (NOT converged: a full resync writes nothing)")"
}

"$CONTROLLER_BIN" crd | kc apply -f - > /dev/null
kc wait --for condition=established --timeout=60s crd/gpunodes.mockgpu.io > /dev/null
W=$(mktemp -d); trap 'rm -rf "$W"; "${TESTBED[@]}" down' EXIT
{
  echo "== controller-scale: $COUNT GpuNodes x $GPUS GPUs (and a slurmd pod each), $RUNS rounds, load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
  echo "   the yardstick: $SCALE_BIN resync; controllers: $(for c in "${CTLS[@]}"; do printf '%s=%s ' "$c" "${BIN[$c]}"; done)"
  echo "-- idle baselines (0 GpuNodes)"
  for r in $(seq "$RUNS"); do
    scale resync --expect 0 | tee -a "$W/idle"
    for c in $(order "$r"); do controller_run "$c" 0 0 | tee -a "$W/ctl-idle-$c"; done
  done
  scale create --count "$COUNT" --gpus "$GPUS"
  echo "-- the first contact: one run of now labels the $COUNT Nodes and writes the GpuNodes' conditions"
  controller_run now "$COUNT" 1 | tee "$W/ctl-converge"
  echo "object size (JSON, one GpuNode): $(kc get --raw "$LIST/bench-node-00000" | wc -c) bytes; full list: $(kc get --raw "$LIST" | wc -c) bytes; one slurmd pod: $(kc get --raw /api/v1/namespaces/bench-slurm/pods/slurm-worker-bench-node-00000 | wc -c) bytes"
  for r in $(seq "$RUNS"); do
    echo "-- $COUNT GpuNodes, round $r of $RUNS"
    m=$(list_metric); scale resync --expect "$COUNT" | tee -a "$W/full"
    echo "   apiserver, the resync's LIST pages: $(mean_ms_since "$m")"
    scale resync --expect "$COUNT" --strip-managed-fields | tee -a "$W/strip"
    for c in $(order "$r"); do controller_run "$c" "$COUNT" 0 | tee -a "$W/ctl-full-$c"; done
    # the API server's own latency for one full LIST (no pagination), as kubectl sees it and as it measures itself
    m=$(list_metric)
    # (klog's -v=6 line: "... 200 OK in 12 milliseconds", or structured: milliseconds=12)
    ms=$(kc get --raw "$LIST" -v=6 2>&1 > /dev/null | grep -F "$LIST" | grep -oE '(in [0-9]+ milliseconds|milliseconds=[0-9]+)' | tail -1 | grep -oE '[0-9]+')
    [ -n "$ms" ] || { echo "kubectl -v=6 printed no response time" >&2; exit 1; }
    echo "$ms" >> "$W/kubectl"
    echo "   kubectl get --raw $LIST (full list, one request): $ms ms to the response headers"
    echo "   apiserver_request_duration_seconds, that LIST: $(mean_ms_since "$m")"
  done
  idle=$(field rss_kib < "$W/idle" | median)
  echo "== summary ($RUNS rounds; ranges are min-max over them)"
  echo "the yardstick: kube-runtime's Controller alone over full GpuNodes (controller-scale resync, counting reconcile):"
  echo "  CPU $(field cpu_ms < "$W/full" | range) ms (idle process $(field cpu_ms < "$W/idle" | range) ms); listed $(field listed_ms < "$W/full" | range) ms, all reconciled $(field reconciled_ms < "$W/full" | range) ms"
  echo "  RSS per GpuNode $(per_node "$W/full" "$idle" | range) KiB over the idle median $idle KiB; managedFields dropped: $(per_node "$W/strip" "$idle" | range) KiB, CPU $(field cpu_ms < "$W/strip" | range) ms"
  echo "mockgpu-controller run, full resync of $COUNT GpuNodes, their Nodes and slurmd pods, converged:"
  for c in "${CTLS[@]}"; do summary "$c"; done
  echo "  first contact (now converging, once): CPU $(field cpu_ms < "$W/ctl-converge") ms, settled $(field settled_ms < "$W/ctl-converge") ms after start, writes: labels $(field label_writes < "$W/ctl-converge"), conditions $(field condition_writes < "$W/ctl-converge"), events $(field event_writes < "$W/ctl-converge")"
  echo "API server full LIST:  $(range < "$W/kubectl") ms to kubectl's response headers (the server's own duration, to the last byte: above)"
  scale delete-all
} | tee "$OUT"
