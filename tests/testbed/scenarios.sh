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
    CONTROLLER_BIN="$CONTROLLER_BIN" HELM="${HELM:-}" REPO="$REPO" SLURM_UID="$SLURM_UID" NODES="${NODES:-1}" \
    NVMLLIST="${NVMLLIST:-}" \
    MGTB_HOST_NETNS="$(readlink /proc/self/ns/net)" \
    "$SCENARIOS_BIN" --exact "$1" 9>&-
}
smoke_pod() { rust_scenario smoke-pod; }
smoke_slurm() { rust_scenario smoke-slurm; }
scenario_latency() { rust_scenario nri-latency; }

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
  [ -x "$AGENT_BIN" ] || fail "no agent binary at $AGENT_BIN (bash tests/build-bins.sh)"
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

