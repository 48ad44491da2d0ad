#!/bin/bash
# controller-scale.sh - the controller's resync at scale, on the test bed's real API server
# (cluster mode: etcd + kube-apiserver v1.37 in the node, nothing else running): COUNT Nodes (as a
# kubelet registers them), their GpuNodes of GPUS GPUs each (as an agent reports them) and a slurmd
# pod bound to each Node (label app.kubernetes.io/name=slurmd, asking for the node's GPUs, as a
# Slinky NodeSet's; Pending, with the start time a kubelet reports: the controller's Drifted check
# reads it), created in bulk. Then RUNS resyncs with 0 GpuNodes (the idle baseline) and RUNS with COUNT, each a fresh
# process of `controller-scale resync` (kube-runtime's Controller over GpuNodes, a reconcile that
# only counts: the controller's watch/list/queue machinery without its API writes) printing its
# CPU time and RSS once every object is reconciled, and the same for `mockgpu-controller run`
# itself, sampled from /proc. Before those, one `mockgpu-controller run` converges the cluster
# (labels the Nodes, writes the GpuNodes' conditions, records Events: the first contact), so that
# the measured runs are what a full resync is: a controller (re)starting on a cluster that is
# already as it wants it, which writes nothing (each run prints its writes, from its
# mockgpu_controller_api_writes metric). Side by side, the API server's own latency for a full
# LIST of the same GpuNodes (kubectl's time to the headers and the server's
# apiserver_request_duration_seconds). Targets: resync CPU <= 1 s, <= 4 KiB RSS per GpuNode.
# Not in CI (minutes of two busy cores). Needs root and the Kubernetes binaries (tests/build-k8s.sh).
#   cargo build --release -p mockgpu-controller -p mockgpu-controller-scale -p mockgpu-testbed
#   sudo flock /tmp/mgtb-cluster.lock bench/controller-scale.sh
# Env: COUNT (5000), GPUS (8), RUNS (3), SCALE_BIN, CONTROLLER_BIN, CRI_BIN (target/release),
#      TB (/var/tmp/mgk8s-tb, as testbed.sh). Output: stdout and bench/out/controller-scale.txt.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COUNT=${COUNT:-5000}; GPUS=${GPUS:-8}; RUNS=${RUNS:-3}
SCALE_BIN=${SCALE_BIN:-$REPO/target/release/controller-scale}
CONTROLLER_BIN=${CONTROLLER_BIN:-$REPO/target/release/mockgpu-controller}
export CRI_BIN=${CRI_BIN:-$REPO/target/release/mgtb-cri} CLUSTER=1 RUST_BACKTRACE=0
TESTBED=("bash" "$REPO/tests/testbed/testbed.sh")
OUT=$REPO/bench/out/controller-scale.txt
for b in "$SCALE_BIN" "$CONTROLLER_BIN" "$CRI_BIN"; do
  [ -x "$b" ] || { echo "no $b (cargo build --release -p mockgpu-controller -p mockgpu-controller-scale -p mockgpu-testbed)" >&2; exit 2; }
done
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
# the real controller: `mockgpu-controller run` in the node's network namespace, sampled from
# outside (/proc/<pid>/stat, VmRSS) once its /metrics show it leads, has reconciled <expect>
# GpuNodes (the reconcile histogram's count) and has settled: its reconciles and writes unchanged
# for QUIET_S (the sampled CPU includes that idle second, a few ms). Converging (<converge> 1), it
# must also have labelled <expect> Nodes and written <expect> GpuNodes' conditions, and settle for
# CONVERGE_QUIET_S (its writes' echoes come back debounced). Then SIGTERM (it releases the Lease).
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
controller_run() {  # controller_run <expect> <converge 0|1>: one line like resync's
  local pid t0 end now first="" sig last="" since=0 m l n wl wc we ut stt tck quiet=$QUIET_S; tck=$(getconf CLK_TCK); t0=$(date +%s%N)
  [ "$2" = 0 ] || quiet=$CONVERGE_QUIET_S
  nsenter -t "$NODE_PID" -n -- env KUBECONFIG="$KUBECONFIG" "$CONTROLLER_BIN" run --namespace default --identity "bench-$t0" --listen 127.0.0.1:18080 \
    --kubeconfig "$KUBECONFIG" --stale-after 3600 > "$W/controller.log" 2>&1 &
  pid=$!; end=$(( $(date +%s) + 600 ))
  while :; do
    kill -0 "$pid" 2> /dev/null || { tail "$W/controller.log" >&2; echo "the controller exited" >&2; return 1; }
    [ "$(date +%s)" -lt "$end" ] || { kill "$pid"; echo "the controller did not settle on $1 GpuNodes in 600 s" >&2; return 1; }
    m=$(ctl_scrape || true); now=$(date +%s%N)
    if [ -n "$m" ]; then
      read -r l n wl wc we <<< "$m"
      sig="$n $wl $wc $we"
      [ "$sig" = "$last" ] || { last=$sig; since=$now; }
      if [ "$l" = 1 ] && [ "$n" -ge "$1" ] && { [ "$2" = 0 ] || { [ "$wl" -ge "$1" ] && [ "$wc" -ge "$1" ]; }; }; then
        [ -n "$first" ] || first=$now
        [ $(( now - since )) -lt $(( quiet * 1000000000 )) ] || break
      fi
    fi
    sleep 0.1
  done
  read -r ut stt < <(cut -d' ' -f14,15 "/proc/$pid/stat")    # utime, stime (clock ticks)
  echo "controller objects=$1 reconciled=$n reconciled_ms=$(( (first - t0) / 1000000 )) settled_ms=$(( (since - t0) / 1000000 )) cpu_ms=$(( (ut + stt) * 1000 / tck )) user_ms=$(( ut * 1000 / tck )) sys_ms=$(( stt * 1000 / tck )) rss_kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status") label_writes=$wl condition_writes=$wc event_writes=$we"
  kill -TERM "$pid"; wait "$pid" || true
}
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }     # field <name> < resync line
range() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%s-%s", lo, hi}'; }

"$CONTROLLER_BIN" crd | kc apply -f - > /dev/null
kc wait --for condition=established --timeout=60s crd/gpunodes.mockgpu.io > /dev/null
W=$(mktemp -d); trap 'rm -rf "$W"; "${TESTBED[@]}" down' EXIT
{
  echo "== controller-scale: $COUNT GpuNodes x $GPUS GPUs (and a slurmd pod each), $RUNS runs each, load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
  echo "-- idle baseline (0 GpuNodes)"
  for _ in $(seq "$RUNS"); do scale resync --expect 0 | tee -a "$W/idle"; controller_run 0 0 | tee -a "$W/ctl-idle"; done
  scale create --count "$COUNT" --gpus "$GPUS"
  echo "-- the first contact: one mockgpu-controller run labels the $COUNT Nodes and writes the GpuNodes' conditions"
  controller_run "$COUNT" 1 | tee "$W/ctl-converge"
  echo "object size (JSON, one GpuNode): $(kc get --raw "$LIST/bench-node-00000" | wc -c) bytes; full list: $(kc get --raw "$LIST" | wc -c) bytes; one slurmd pod: $(kc get --raw /api/v1/namespaces/bench-slurm/pods/slurm-worker-bench-node-00000 | wc -c) bytes"
  echo "-- $COUNT GpuNodes"
  for _ in $(seq "$RUNS"); do
    m=$(list_metric); scale resync --expect "$COUNT" | tee -a "$W/full"
    echo "   apiserver, the resync's LIST pages: $(mean_ms_since "$m")"
    scale resync --expect "$COUNT" --strip-managed-fields | tee -a "$W/strip"
    controller_run "$COUNT" 0 | tee -a "$W/ctl-full"
    # the API server's own latency for one full LIST (no pagination), as kubectl sees it and as it measures itself
    m=$(list_metric)
    # (klog's -v=6 line: "... 200 OK in 12 milliseconds", or structured: milliseconds=12)
    ms=$(kc get --raw "$LIST" -v=6 2>&1 > /dev/null | grep -F "$LIST" | grep -oE '(in [0-9]+ milliseconds|milliseconds=[0-9]+)' | tail -1 | grep -oE '[0-9]+')
    [ -n "$ms" ] || { echo "kubectl -v=6 printed no response time" >&2; exit 1; }
    echo "$ms" >> "$W/kubectl"
    echo "   kubectl get --raw $LIST (full list, one request): $ms ms to the response headers"
    echo "   apiserver_request_duration_seconds, that LIST: $(mean_ms_since "$m")"
  done
  idle=$(field rss_kib < "$W/idle" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  cidle=$(field rss_kib < "$W/ctl-idle" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  per_node() { field rss_kib < "$1" | awk -v i="$2" -v n="$COUNT" '{printf "%.2f\n", ($1 - i) / n}' | range; }
  echo "== summary ($RUNS runs; ranges are min-max)"
  echo "mockgpu-controller run, full resync of $COUNT GpuNodes, their Nodes and slurmd pods, converged:"
  echo "  CPU until all reconciled: $(field cpu_ms < "$W/ctl-full" | range) ms (target <= 1000 ms; idle process $(field cpu_ms < "$W/ctl-idle" | range) ms)"
  echo "  RSS per GpuNode:          $(per_node "$W/ctl-full" "$cidle") KiB over the idle median $cidle KiB (target <= 4 KiB); RSS idle $(field rss_kib < "$W/ctl-idle" | range) KiB, with $COUNT $(field rss_kib < "$W/ctl-full" | range) KiB"
  echo "  all reconciled:           $(field reconciled_ms < "$W/ctl-full" | range) ms after start; writes: labels $(field label_writes < "$W/ctl-full" | range), conditions $(field condition_writes < "$W/ctl-full" | range), events $(field event_writes < "$W/ctl-full" | range)"
  echo "  first contact (converging, once): CPU $(field cpu_ms < "$W/ctl-converge") ms, settled $(field settled_ms < "$W/ctl-converge") ms after start, writes: labels $(field label_writes < "$W/ctl-converge"), conditions $(field condition_writes < "$W/ctl-converge"), events $(field event_writes < "$W/ctl-converge")"
  echo "kube-runtime's Controller alone over full GpuNodes (controller-scale resync, counting reconcile; for reference):"
  echo "  CPU $(field cpu_ms < "$W/full" | range) ms (idle process $(field cpu_ms < "$W/idle" | range) ms); listed $(field listed_ms < "$W/full" | range) ms, all reconciled $(field reconciled_ms < "$W/full" | range) ms"
  echo "  RSS per GpuNode $(per_node "$W/full" "$idle") KiB over the idle median $idle KiB; managedFields dropped: $(per_node "$W/strip" "$idle") KiB, CPU $(field cpu_ms < "$W/strip" | range) ms"
  echo "API server full LIST:  $(range < "$W/kubectl") ms to kubectl's response headers (the server's own duration, to the last byte: above)"
  scale delete-all
} | tee "$OUT"
