# scenarios.sh - the test bed's steps, sourced by testbed.sh (which defines R, ST, LOGS, cri, innode,
# fail, log, timing, track, stop_kinds, wait_for ...). Each step runs in a subshell under `set -e`;
# state that later steps need is kept in files under $ST.
# shellcheck shell=bash

GPU_PROFILE=gb300

# ---------------------------------------------------------------------------------------------
# the scenarios written in Rust (tests/testbed/src/scenarios): `mgtb-scenarios --exact NAME` runs
# one against this test bed (`mgtb-scenarios --list` names them). The node's smoke-pod, smoke-slurm,
# nri-latency and isolation steps are four of them (cluster mode's isolation is cluster-isolation).

SCENARIOS_BIN=${SCENARIOS_BIN:-$(dirname "$CRI_BIN")/mgtb-scenarios}
CONTROLLER_BIN=${CONTROLLER_BIN:-$(dirname "$AGENT_BIN")/mockgpu-controller}   # slurmrestd-delete-node copies it into the node
# (fd 9, the run lock, is not inherited: the daemons a scenario starts would hold it)
# It runs in the node's network namespace, where cluster mode's API server listens.
rust_scenario() {
  nsenter -t "$(nodepid)" -n -- env TB="$TB" R="$R" LOGS="$LOGS" ST="$ST" CRI_SOCKET="$CRI_SOCKET" \
    MGTB_CGROUP_PARENT="$CGROUP_PARENT" AGENT_ARGS="$AGENT_ARGS" LAT_N="$LAT_N" \
    AGENT_RESTART_PAUSE="$AGENT_RESTART_PAUSE" LAT_MAX_RATIO="${LAT_MAX_RATIO:-}" \
    KUBECONFIG="${KCFG:-}" KUBECTL="${KUBECTL:-}" K8S_VERSION="${K8S_VERSION:-}" \
    CONTROLLER_BIN="$CONTROLLER_BIN" HELM="${HELM:-}" REPO="$REPO" \
    MGTB_HOST_NETNS="$(readlink /proc/self/ns/net)" \
    "$SCENARIOS_BIN" --exact "$1" 9>&-
}
smoke_pod() { rust_scenario smoke-pod; }
smoke_slurm() { rust_scenario smoke-slurm; }
scenario_latency() { rust_scenario nri-latency; }

# ---------------------------------------------------------------------------------------------
# the node's CPU layout, read from its sysfs, and what Slurm should make of the agent's GPUs
# (cluster mode's Slinky scenario; src/scenarios/slurm.rs has the node scenarios' own)

MOCK=/run/mockgpu/fs                 # the agent's tree, as the node sees it
cpus_of() { tr ',' '\n' | awk -F- 'NF {b = (NF > 1) ? $2 : $1; for (i = $1; i <= b; i++) print i}'; }  # cpus_of < "0-2,8": one id a line
canon() { cpus_of | sort -n | paste -sd, -; }            # canon < "0-2,8": "0,1,2,8"
ranges() { sort -n | awk 'NR == 1 {s = p = $1; next} $1 == p + 1 {p = $1; next}
  {o = o sep (s == p ? s : s "-" p); sep = ","; s = p = $1} END {if (NR) print o sep (s == p ? s : s "-" p)}'; }  # ranges < ids: "0-2,8"

node_sockets() {  # node_sockets > file: "<rank> <canonical cpu list>" per socket (physical_package_id), in Slurm's order
  local online; online=$(innode cat /sys/devices/system/cpu/online)
  # shellcheck disable=SC2016,SC2046 # $c is expanded by the inner sh; the CPU ids are words
  innode sh -c 'for c; do echo "$(cat "/sys/devices/system/cpu/cpu$c/topology/physical_package_id" 2>/dev/null || echo 0) $c"; done' \
    sh $(cpus_of <<< "$online") | sort -k1,1n -k2,2n \
    | awk 'BEGIN {r = 0} NR > 1 && $1 != p {print r++, l; l = ""} {l = (l == "" ? "" : l ",") $2; p = $1} END {if (NR) print r, l}'
}

gpus_by_minor() {  # "<minor> <bus id>" of every GPU the agent serves
  innode sh -c "grep -H '^Device Minor:' $MOCK/proc/driver/nvidia/gpus/*/information" \
    | sed -E 's#^.*/gpus/([^/]+)/information:Device Minor:[[:space:]]*([0-9]+)$#\2 \1#' | sort -n
}

gpu_socket() {  # gpu_socket <bus id>: rank of the socket whose CPUs are exactly the GPU's local_cpulist
  # (node_sockets in $ST/sockets), or "all"; anything else is what slurmctld rejects
  local cpus r l; cpus=$(innode cat "$MOCK/sys/bus/pci/drivers/nvidia/$1/local_cpulist" | canon)
  while read -r r l; do [ "$l" = "$cpus" ] && { echo "$r"; return 0; }; done < "$ST/sockets"
  [ "$cpus" = "$(awk '{print $2}' "$ST/sockets" | paste -sd, - | canon)" ] && { echo all; return 0; }
  fail "GPU $1: local_cpulist ($cpus) is neither one whole socket nor all CPUs of the node"
}

gres_sockets() {  # the (S:...) sinfo shows for the served GPUs (exits on a GPU that is not on one socket)
  local m b s ranks=""; node_sockets > "$ST/sockets" || exit 1
  while read -r m b; do
    s=$(gpu_socket "$b") || exit 1
    [ "$s" != all ] || s=$(cut -d' ' -f1 "$ST/sockets")
    ranks="$ranks $s"
  done < <(gpus_by_minor)
  tr ' ' '\n' <<< "$ranks" | grep . | sort -un | ranges
}

# ---------------------------------------------------------------------------------------------
# mockgpu

profile_yaml() {  # profile_yaml <gpus>: the agent's --profile-file (a built-in base + overrides)
  printf '# test bed profile\nbase: %s\ngpus: %s\n' "$GPU_PROFILE" "$1"
}

write_profile() {  # write_profile <gpus> [YAML line]: atomically, so the agent never reads half a file
  { profile_yaml "$1"; [ -z "${2:-}" ] || echo "$2"; } > "$R/etc/mockgpu/profile.yaml.tmp"
  mv -f "$R/etc/mockgpu/profile.yaml.tmp" "$R/etc/mockgpu/profile.yaml"
}

fuse_mounted() { grep -qE ' /run/mockgpu/fs [^ ]+ .* - fuse' "/proc/$(nodepid)/mountinfo"; }
nri_lines() { wc -l < "$LOGS/containerd.log"; }
nri_registered_since() { tail -n +"$(( $1 + 1 ))" "$LOGS/containerd.log" | grep -c 'registered as' > /dev/null; }

start_agent() {
  # shellcheck disable=SC2086 # AGENT_ARGS: extra flags, split on spaces
  spawn agent "$LOGS/agent.log" RUST_LOG=info /opt/mockgpu/mockgpu-agent serve \
    --profile-file /etc/mockgpu/profile.yaml --node-name "$NODE" \
    --dir /run/mockgpu --nri-socket /run/nri/nri.sock --trusted-namespaces default $AGENT_ARGS
  echo "$SPAWNED" > "$ST/agent.pid"
}

agent_ready() {  # agent_ready <containerd log line count before start>
  fuse_mounted && [ -s "$R/run/mockgpu/lib/libmockfs.so" ] && [ -s "$R/run/mockgpu/ld.so.preload" ] \
    && nri_registered_since "$1"
}

agent_up() {
  [ -x "$AGENT_BIN" ] || fail "no agent binary at $AGENT_BIN (cargo build --release -p mockgpu-agent)"
  "$AGENT_BIN" serve --help > "$LOGS/agent-serve-help.txt" 2>&1 || fail "mockgpu-agent has no 'serve' command yet"
  mkdir -p "$R/opt/mockgpu"
  cp -f "$AGENT_BIN" "$R/opt/mockgpu/mockgpu-agent.new"; mv -f "$R/opt/mockgpu/mockgpu-agent.new" "$R/opt/mockgpu/mockgpu-agent"
  write_profile 4
  local n0 t; n0=$(nri_lines); t=$(date +%s%N)
  start_agent
  wait_for 30 "agent ready (FUSE at /run/mockgpu/fs, shim, ld.so.preload, NRI registered)" agent_ready "$n0" \
    || { tail -20 "$LOGS/agent.log"; exit 1; }
  timing agent-ready "$(ms "$t") ms"
  ls "$R/run/mockgpu" > /dev/null
}

run_scenarios() {
  sstep seed-verification rust_scenario seed-verification
  sstep exec-slurmd rust_scenario exec-slurmd
  sstep only-gpu-containers rust_scenario only-gpu-containers
  sstep consumers-lspci-hwloc rust_scenario consumers-lspci-hwloc
  sstep live-change rust_scenario live-change
  sstep agent-restart rust_scenario agent-restart
  sstep agent-surge rust_scenario agent-surge
  sstep runtime-restart rust_scenario runtime-restart
  sstep slurmrestd-delete-node rust_scenario slurmrestd-delete-node
  sstep constrain-devices rust_scenario constrain-devices
}

# opening each /dev/nvidia<m> read-write in a job: "<m> ok" or "<m> <the shell's error>" (cluster
# mode's Slinky scenario; constrain-devices has the same in slurm.rs)
OPEN_GPUS='for m in 0 1 2 3; do if e=$( (exec 3<> /dev/nvidia$m) 2>&1); then echo "$m ok"; else echo "$m ${e##*: }"; fi; done'
