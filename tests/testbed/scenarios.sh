# scenarios.sh - the test bed's steps, sourced by testbed.sh (which defines R, ST, LOGS, cri, innode,
# fail, log, timing, track, stop_kinds, wait_for ...). Each step runs in a subshell under `set -e`;
# state that later steps need is kept in files under $ST.
# shellcheck shell=bash

GPU_PROFILE=gb300
SLURMD_POD=slurm-0

# ---------------------------------------------------------------------------------------------
# the scenarios written in Rust (tests/testbed/src/scenarios): `mgtb-scenarios --exact NAME` runs
# one against this test bed (`mgtb-scenarios --list` names them). The node's smoke-pod and
# isolation steps are two of them (cluster.sh has its own isolation).

SCENARIOS_BIN=${SCENARIOS_BIN:-$(dirname "$CRI_BIN")/mgtb-scenarios}
# (fd 9, the run lock, is not inherited: the daemons a scenario starts would hold it)
# It runs in the node's network namespace, where cluster mode's API server listens.
rust_scenario() {
  nsenter -t "$(nodepid)" -n -- env TB="$TB" R="$R" LOGS="$LOGS" ST="$ST" CRI_SOCKET="$CRI_SOCKET" \
    MGTB_CGROUP_PARENT="$CGROUP_PARENT" AGENT_ARGS="$AGENT_ARGS" LAT_N="$LAT_N" \
    AGENT_RESTART_PAUSE="$AGENT_RESTART_PAUSE" LAT_MAX_RATIO="${LAT_MAX_RATIO:-}" \
    KUBECONFIG="${KCFG:-}" KUBECTL="${KUBECTL:-}" K8S_VERSION="${K8S_VERSION:-}" \
    CONTROLLER_BIN="$CONTROLLER_BIN" HELM="${HELM:-}" REPO="$REPO" \
    "$SCENARIOS_BIN" --exact "$1" 9>&-
}
smoke_pod() { rust_scenario smoke-pod; }
scenario_latency() { rust_scenario nri-latency; }
isolation() { rust_scenario isolation; }

# ---------------------------------------------------------------------------------------------
# helpers

ctr_up() {  # ctr_up <key> <mgtb-cri up args...>: start a container; its POD/CTR/PID/... go to $ST/<key>.env
  local out; out=$(cri up "${@:2}") || fail "mgtb-cri up ${*:2}"
  echo "$out" > "$ST/$1.env"
  sed "s/^/  $1: /" <<< "$out"
  # StartContainer returns before runc's init has exec'd the container's program: until then
  # /proc/PID/environ is runc's, not the container's
  wait_for 10 "container $1 to exec its program" execd "$(ctr "$1" PID)" || fail "container $1 (pid $(ctr "$1" PID)) never left runc init"
}
execd() { [ "$(cat "/proc/$1/comm" 2>/dev/null)" != 'runc:[2:INIT]' ]; }
ctr() { sed -n "s/^$2=//p" "$ST/$1.env"; }   # ctr <key> <VAR>
cexec() { cri exec "$(ctr "$1" CTR)" -- "${@:2}"; }   # cexec <key> <cmd...>

environ_of() { tr '\0' '\n' < "/proc/$1/environ"; }
has_mount()  { awk -v m="$2" '$5 == m {f=1} END {exit !f}' "/proc/$1/mountinfo"; }

# ---------------------------------------------------------------------------------------------
# the node's CPU layout, read from its sysfs, and what Slurm should make of the agent's GPUs

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

slurm_hw() { innode slurmd -C | sed -n 1p | grep -oE "(^| )$1=[0-9]+" | cut -d= -f2; }  # slurm_hw CoresPerSocket

slurm_cores() {  # slurm_cores <rank|all>: the Cores= slurmd derives for a GPU on that socket (socket-major core ids)
  local c lo hi; c=$(slurm_hw CoresPerSocket)
  case $1 in
    all) lo=0; hi=$(( $(slurm_hw Boards) * $(slurm_hw SocketsPerBoard) * c - 1 )) ;;
    *) lo=$(( $1 * c )); hi=$(( lo + c - 1 )) ;;
  esac
  if [ "$lo" = "$hi" ]; then echo "$lo"; else echo "$lo-$hi"; fi
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

assert_injected() {  # assert_injected <key> [GPU minors]: the plugin's adjustment is in the container
  local pid minors=${2:-0 1 2 3} m; pid=$(ctr "$1" PID)
  grep -qE '^LD_PRELOAD=(.*:)?/run/mockgpu/lib/libmockfs\.so(:.*)?$' <<< "$(environ_of "$pid")" \
    || fail "$1: no LD_PRELOAD=/run/mockgpu/lib/libmockfs.so in /proc/$pid/environ"
  has_mount "$pid" /run/mockgpu || fail "$1: /run/mockgpu is not mounted"
  grep -E ' /run/mockgpu .* master:' "/proc/$pid/mountinfo" > /dev/null || fail "$1: /run/mockgpu is not rslave"
  has_mount "$pid" /etc/ld.so.preload || fail "$1: /etc/ld.so.preload is not mounted"
  local d; for d in $(for m in $minors; do echo "nvidia$m"; done) nvidiactl nvidia-uvm; do
    cexec "$1" test -c "/dev/$d" || fail "$1: /dev/$d is not a character device"
  done
  for m in 0 1 2 3; do
    [[ " $minors " == *" $m "* ]] && continue
    ! cexec "$1" test -e "/dev/nvidia$m" || fail "$1: /dev/nvidia$m was injected, but the container holds GPUs $minors only"
  done
}

assert_untouched() {  # assert_untouched <key>: no mount, no LD_PRELOAD, no devices
  local pid; pid=$(ctr "$1" PID)
  local env; env=$(environ_of "$pid")
  ! grep -q '^LD_PRELOAD=' <<< "$env" || fail "$1: LD_PRELOAD was injected"
  ! grep -q '^MOCKFS' <<< "$env" || fail "$1: MOCKFS_* was injected"
  ! grep -qE ' /run/mockgpu | /etc/ld.so.preload ' "/proc/$pid/mountinfo" || fail "$1: a mockgpu mount was injected"
  [ -z "$(cexec "$1" ls /dev | grep '^nvidia' || true)" ] || fail "$1: /dev/nvidia* was injected"
}

# ---------------------------------------------------------------------------------------------
# Slurm: slurmctld + munged in the node (loopback-only network), slurmd in a container

slurm_write_conf() {  # slurm_write_conf fake|nvidia [constrain]: constrain adds ConstrainDevices
  local h hw proctrack=proctrack/linuxproc task=task/none; h=$(hostname)
  if [ "${2:-}" = constrain ]; then proctrack=proctrack/cgroup; task=task/cgroup; fi
  # the host's real CPU layout (as slurmd -C sees it), so the node is not invalidated
  hw=$(innode slurmd -C | sed -n 1p | grep -oE '(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=[0-9]+' | tr '\n' ' ')
  cat > "$R/etc/slurm/slurm.conf" <<EOF
ClusterName=mgtb
SlurmctldHost=$h(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldParameters=enable_configless
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
MpiDefault=none
ProctrackType=$proctrack
TaskPlugin=$task
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
ReturnToService=2
GresTypes=gpu
NodeName=$NODE NodeHostname=$h NodeAddr=127.0.0.1 ${hw}RealMemory=1000 Gres=gpu:nvidia_gb300:4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  case $1 in
    # hand-made: the device files come from the CRI request, the type from gres.conf
    fake) printf 'AutoDetect=off\nName=gpu Type=nvidia_gb300 File=/dev/nvidia[0-3]\n' > "$R/etc/slurm/gres.conf" ;;
    nvidia) printf 'AutoDetect=nvidia\n' > "$R/etc/slurm/gres.conf" ;;
  esac
  # Slurm's cgroup plugin for the node's hierarchy: cgroup/v2 refuses a hybrid host ("Hybrid mode
  # is not supported"), so a cgroup v1 host gets cgroup/v1 (the devices controller's deny list;
  # on v2 Slurm attaches a BPF device program: either way a refused open fails with EPERM)
  if [ "${2:-}" = constrain ]; then
    local plugin=cgroup/v1
    [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && plugin=cgroup/v2
    printf 'CgroupPlugin=%s\nConstrainDevices=yes\n' "$plugin" > "$R/etc/slurm/cgroup.conf"
  else
    rm -f "$R/etc/slurm/cgroup.conf"
  fi
}

slurm_ctl_up() {
  slurm_ctl_down
  innode sh -c 'rm -rf /var/lib/slurm/slurmctld /var/log/slurm /run/munge
    mkdir -p /var/lib/slurm/slurmctld /var/log/slurm /run/munge && chown munge:munge /run/munge'
  : > "$LOGS/munged.log"; : > "$LOGS/slurmctld.out"
  spawn munged "$LOGS/munged.log" setpriv --reuid=munge --regid=munge --clear-groups munged -F
  wait_for 10 munged test -S "$R/run/munge/munge.socket.2"
  spawn slurmctld "$LOGS/slurmctld.out" slurmctld -D -f /etc/slurm/slurm.conf
  wait_for 20 slurmctld innode scontrol ping
}

slurm_ctl_down() { stop_kinds TERM slurmctld munged; }

slurmd_up() {  # slurmd_up <key> <extra mgtb-cri up args...>: a Slinky-shaped slurmd container
  # (configless as in Slinky: slurm.conf and gres.conf come from slurmctld, not from a mount)
  cri down "$SLURMD_POD" > /dev/null
  ctr_up "$1" --pod "$SLURMD_POD" --name slurmd --image localhost/slurmd:1 --privileged \
    --pod-label app.kubernetes.io/name=slurmd --pod-label app.kubernetes.io/component=worker \
    --pod-annotation kubectl.kubernetes.io/default-container=slurmd \
    --mount /run/munge:/run/munge \
    "${@:2}" -- /bin/sh -c "mkdir -p /var/spool/slurmd && exec slurmd -D -N $NODE --conf-server 127.0.0.1:6817"
}

sinfo_node() { innode sinfo -h -N -o '%N %T %G'; }
node_idle() { grep -qE "^$NODE idle " <<< "$(sinfo_node)"; }
srun_() { innode timeout 60 srun -D / -N1 "$@"; }

slurm_logs() {  # print what helps when a Slurm step fails
  echo "--- sinfo:"; sinfo_node || true
  echo "--- slurmd (container log):"; tail -20 "$R/var/log/pods/default_$SLURMD_POD/slurmd/"*.log 2>/dev/null || true
  echo "--- slurmctld:"; tail -20 "$R/var/log/slurm/slurmctld.log" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------
# smoke: the infrastructure without mockgpu

smoke_slurm() {
  slurm_write_conf fake
  slurm_ctl_up
  local t; t=$(date +%s%N)
  slurmd_up slurm-fake --device /dev/null:/dev/nvidia0 --device /dev/null:/dev/nvidia1 \
    --device /dev/null:/dev/nvidia2 --device /dev/null:/dev/nvidia3
  wait_for 30 "slurmd to register idle" node_idle || { slurm_logs; exit 1; }
  timing smoke-slurmd-idle "$(ms "$t") ms"
  local s; s=$(sinfo_node); echo "  sinfo: $s"
  [[ $s == *gpu:nvidia_gb300:4* ]] || { slurm_logs; fail "sinfo shows no gpu:nvidia_gb300:4"; }
  s=$(srun_ --gres=gpu:2 env | grep '^CUDA_VISIBLE_DEVICES=') || { slurm_logs; fail "srun --gres=gpu:2"; }
  echo "  srun --gres=gpu:2: $s"
  [ "$s" = CUDA_VISIBLE_DEVICES=0,1 ] || fail "want CUDA_VISIBLE_DEVICES=0,1"
  if srun_ --gres=gpu:5 true > "$LOGS/srun-gpu5.log" 2>&1; then fail "srun --gres=gpu:5 was not refused"; fi
  echo "  srun --gres=gpu:5 refused: $(head -1 "$LOGS/srun-gpu5.log")"
  cri down "$SLURMD_POD" > /dev/null
  slurm_ctl_down
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
  sstep seed-verification scenario_seed
  sstep exec-slurmd scenario_exec_slurmd
  sstep only-gpu-containers rust_scenario only-gpu-containers
  sstep consumers-lspci-hwloc rust_scenario consumers-lspci-hwloc
  sstep live-change rust_scenario live-change
  sstep agent-restart rust_scenario agent-restart
  sstep agent-surge rust_scenario agent-surge
  sstep runtime-restart rust_scenario runtime-restart
  sstep slurmrestd-delete-node scenario_slurmrestd
  sstep constrain-devices scenario_constrain_devices
}

scenario_seed() {
  slurm_write_conf nvidia
  slurm_ctl_up
  local t; t=$(date +%s%N)
  slurmd_up slurmd --env NVIDIA_VISIBLE_DEVICES=all --env SLURMD_NODENAME="$NODE"
  timing container-create-with-injection "$(ctr slurmd CREATE_MS) ms (start $(ctr slurmd START_MS) ms)"
  assert_injected slurmd
  wait_for 30 "slurmd to register idle" node_idle || { slurm_logs; exit 1; }
  timing slurmd-idle-with-mock-gpus "$(ms "$t") ms"
  local s sockets; s=$(sinfo_node); echo "  sinfo -N -o '%N %T %G': $s"
  # the sockets follow the node's layout (S:0 on one socket, S:0-1 when the GPUs span two)
  sockets=$(gres_sockets); [ -n "$sockets" ] || fail "no socket found for the served GPUs"
  [[ $s == *"gpu:nvidia_gb300:4(S:$sockets)"* ]] || { slurm_logs; fail "sinfo does not show gpu:nvidia_gb300:4(S:$sockets)"; }
  s=$(srun_ --gres=gpu:2 env | grep '^CUDA_VISIBLE_DEVICES=') || { slurm_logs; fail "srun --gres=gpu:2"; }
  echo "  srun --gres=gpu:2 env: $s"
  [ "$s" = CUDA_VISIBLE_DEVICES=0,1 ] || fail "want CUDA_VISIBLE_DEVICES=0,1"
  if srun_ --gres=gpu:5 true > "$LOGS/srun-gpu5.log" 2>&1; then fail "srun --gres=gpu:5 was not refused"; fi
  echo "  srun --gres=gpu:5 refused: $(head -1 "$LOGS/srun-gpu5.log")"
  # the job's environment is the caller's (no LD_PRELOAD): only /etc/ld.so.preload can reach it
  s=$(srun_ /bin/sh -c 'echo "LD_PRELOAD=${LD_PRELOAD:-}"; ls /proc/driver/nvidia/gpus') || fail "srun ls"
  echo "$s" | sed 's/^/  job: /'
  grep -qx 'LD_PRELOAD=' <<< "$s" || fail "the job inherited LD_PRELOAD; the ld.so.preload route is untested"
  [ "$(echo "$s" | grep -cE '^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$')" = 4 ] || fail "the job does not see 4 GPUs"
}

scenario_exec_slurmd() {  # `mockgpu-agent exec` runs slurmd on the node itself, under the shim
  [ -S "$R/run/munge/munge.socket.2" ] || fail "needs munged of seed-verification"
  local agent=/opt/mockgpu/mockgpu-agent c g i
  c=$(innode "$agent" exec --node-name "$NODE" -- slurmd -C) || fail "exec -- slurmd -C"
  echo "$c" | sed -n 1p | sed 's/^/  slurmd -C: /'
  grep -q ' Gres=gpu:nvidia_gb300:4' <<< "$c" || fail "slurmd -C does not print Gres=gpu:nvidia_gb300:4"
  # slurmd -G with the node's gres.conf (AutoDetect=nvidia): four GPUs, device files, whole-socket cores
  grep -qx 'AutoDetect=nvidia' "$R/etc/slurm/gres.conf" || fail "gres.conf is not AutoDetect=nvidia"
  g=$(innode "$agent" exec --node-name "$NODE" -- slurmd -G -N "$NODE" 2>&1 | grep 'Gres Name=gpu') || fail "exec -- slurmd -G lists no GPU"
  echo "$g" | sed 's/^.*Gres /  slurmd -G: /'
  [ "$(grep -c . <<< "$g")" = 4 ] || fail "slurmd -G lists $(grep -c . <<< "$g") GPUs, want 4"
  # the cores each GPU should get, from its local_cpulist in the served tree (exec renders the
  # same profile on the same host) and the node's sockets
  local m b s cores n=0; node_sockets > "$ST/sockets"
  while read -r m b; do
    s=$(gpu_socket "$b"); cores=$(slurm_cores "$s"); n=$((n + 1))
    grep -q "Type=nvidia_gb300 .* File=/dev/nvidia$m Cores=$cores " <<< "$g" || fail "slurmd -G: no nvidia_gb300 with File=/dev/nvidia$m Cores=$cores"
  done < <(gpus_by_minor)
  [ "$n" = 4 ] || fail "the agent serves $n GPUs, want 4"
  # AutoDetect=nvml: Slurm's own NVML plugin (slurm-wlm-nvml-plugin) loads the mock
  # libnvidia-ml.so.1 that exec provides, and must register the same GPUs, types, files and cores,
  # and, GB300 having NVLink, a Links= list with -1 at the GPU's own index
  local d=$R/etc/slurm-nvml gn line want links
  rm -rf "$d"; cp -a "$R/etc/slurm" "$d"; echo 'AutoDetect=nvml' > "$d/gres.conf"
  gn=$(innode env SLURM_CONF=/etc/slurm-nvml/slurm.conf "$agent" exec --node-name "$NODE" -- slurmd -G -N "$NODE" 2>&1 | grep 'Gres Name=gpu') \
    || { rm -rf "$d"; fail "exec -- slurmd -G with AutoDetect=nvml lists no GPU"; }
  rm -rf "$d"
  echo "$gn" | sed 's/^.*Gres /  slurmd -G (nvml): /'
  [ "$(grep -c . <<< "$gn")" = 4 ] || fail "slurmd -G (AutoDetect=nvml) lists $(grep -c . <<< "$gn") GPUs, want 4"
  for m in 0 1 2 3; do
    want=$(grep -o "Type=[^ ]* .*File=/dev/nvidia$m Cores=[^ ]*" <<< "$g" | sed -E 's/ (Count|Index|ID)=[^ ]*//g')
    line=$(grep "File=/dev/nvidia$m " <<< "$gn") || fail "AutoDetect=nvml: no GPU with File=/dev/nvidia$m"
    [ "$(grep -o "Type=[^ ]* .*File=/dev/nvidia$m Cores=[^ ]*" <<< "$line" | sed -E 's/ (Count|Index|ID)=[^ ]*//g')" = "$want" ] \
      || fail "AutoDetect=nvml and AutoDetect=nvidia differ for /dev/nvidia$m: '$line' against '$want'"
    links=$(grep -o 'Links=[^ ]*' <<< "$line" | cut -d= -f2)
    [ "$(cut -d, -f$((m + 1)) <<< "$links")" = -1 ] || fail "AutoDetect=nvml: /dev/nvidia$m has Links=$links, want -1 at index $m"
  done
}


# ---------------------------------------------------------------------------------------------
# remediation's Slurm side: `mockgpu-controller slurm-delete-node` (the controller's slurmrestd
# client) against slurmrestd with auth/jwt, deleting a dynamic node's record (slurmd -Z, as
# Slinky's NodeSets register their pods)

CONTROLLER_BIN=${CONTROLLER_BIN:-$(dirname "$AGENT_BIN")/mockgpu-controller}
RESTD_PORT=6820       # slurmrestd, every data_parser
RESTD_OLD_PORT=6821   # slurmrestd with data_parser v0.0.40 only (what Slurm 23.11 serves)
MUTE_PORT=6899        # accepts a connection and never answers
DYN_NODE=gpu-0
JWT=/run/mgtb-jwt     # node paths of the tokens
JWT_FORGED=/run/mgtb-jwt-forged

listening() {  # listening <port>: a TCP socket (IPv4 or IPv6) listens on it in the node's network namespace
  # shellcheck disable=SC2016 # an awk program
  innode awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p {f = 1} END {exit !f}' \
    /proc/net/tcp /proc/net/tcp6
}

slurmrestd_up() {  # slurmrestd_up <port> [slurmrestd flags]: JWT authentication only, as user slurm
  # (it refuses to run as root or SlurmUser); SLURM_JWT=daemon: it talks to slurmctld with the
  # client's token, not munge. Only the slurmctld OpenAPI plugin: no slurmdbd here.
  spawn slurmrestd "$LOGS/slurmrestd.log" SLURM_JWT=daemon slurmrestd -s openapi/slurmctld -a rest_auth/jwt \
    -u slurm -g slurm "${@:2}" "127.0.0.1:$1"
  wait_for 10 "slurmrestd on port $1" listening "$1" || { tail "$LOGS/slurmrestd.log"; exit 1; }
}

delete_node() {  # delete_node <port> <token file> <node> [flags]: the controller's client, in the node
  innode /opt/mockgpu/mockgpu-controller slurm-delete-node --slurmrestd-url "http://127.0.0.1:$1" \
    --slurm-user root --token-file "$2" "${@:4}" "$3"
}

dyn_slurmd_up() {  # a dynamic slurmd with four hand-made GPUs (gres.conf of slurm_write_conf fake)
  cri down "$SLURMD_POD" > /dev/null
  ctr_up slurmd-dyn --pod "$SLURMD_POD" --name slurmd --image localhost/slurmd:1 --privileged \
    --pod-label app.kubernetes.io/name=slurmd --mount /run/munge:/run/munge \
    --device /dev/null:/dev/nvidia0 --device /dev/null:/dev/nvidia1 --device /dev/null:/dev/nvidia2 --device /dev/null:/dev/nvidia3 \
    -- /bin/sh -c "mkdir -p /var/spool/slurmd && exec slurmd -D -Z -N $DYN_NODE --conf-server 127.0.0.1:6817 --conf 'Gres=gpu:nvidia_gb300:4'"
}
dyn_idle() { grep -qE "^$DYN_NODE idle " <<< "$(sinfo_node)"; }
dyn_known() { innode scontrol show node "$DYN_NODE" > /dev/null 2>&1; }

scenario_slurmrestd() {
  [ -x "$CONTROLLER_BIN" ] || fail "no controller binary at $CONTROLLER_BIN (cargo build --release -p mockgpu-controller)"
  mkdir -p "$R/opt/mockgpu"
  cp -f "$CONTROLLER_BIN" "$R/opt/mockgpu/mockgpu-controller.new"; mv -f "$R/opt/mockgpu/mockgpu-controller.new" "$R/opt/mockgpu/mockgpu-controller"
  stop_kinds TERM mute slurmrestd     # left by an earlier failed run
  slurm_write_conf fake
  head -c 32 /dev/urandom > "$R/etc/slurm/jwt_hs256.key"; chmod 600 "$R/etc/slurm/jwt_hs256.key"
  printf 'AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key\nMaxNodeCount=8\n' >> "$R/etc/slurm/slurm.conf"
  slurm_ctl_up
  : > "$LOGS/slurmrestd.log"
  slurmrestd_up "$RESTD_PORT"
  local t out rc; t=$(date +%s%N)
  dyn_slurmd_up
  wait_for 30 "dynamic node $DYN_NODE to register idle" dyn_idle || { slurm_logs; exit 1; }
  timing dynamic-slurmd-idle "$(ms "$t") ms"
  innode scontrol token username=root lifespan=600 > "$R$JWT"
  grep -q '^SLURM_JWT=eyJ' "$R$JWT" || fail "scontrol token printed no JWT: $(head -c 100 "$R$JWT")"
  # the same token, one character of its signature changed
  awk -F. -v OFS=. '{s = $3; c = substr(s, 5, 1); $3 = substr(s, 1, 4) (c == "A" ? "B" : "A") substr(s, 6); print}' "$R$JWT" > "$R$JWT_FORGED"
  ! cmp -s "$R$JWT" "$R$JWT_FORGED" || fail "the forged token equals the real one"

  # a forged token: slurmctld rejects it (slurmrestd: 511, error 1007) and the node stays
  rc=0; out=$(delete_node "$RESTD_PORT" "$JWT_FORGED" "$DYN_NODE" 2>&1) || rc=$?
  [ $rc != 0 ] || fail "a forged token was accepted: $out"
  grep -q 'slurmrestd rejected the token' <<< "$out" || fail "forged token: $out"
  dyn_known || fail "a forged token deleted $DYN_NODE"
  echo "  forged token: refused ($(grep rejected <<< "$out" | sed "s/^ *//"))"

  # the real one: the record goes, and stays gone while the old slurmd runs
  t=$(date +%s%N)
  out=$(delete_node "$RESTD_PORT" "$JWT" "$DYN_NODE") || fail "slurm-delete-node $DYN_NODE: $out"
  timing slurmrestd-delete-node "$(ms "$t") ms (the whole subcommand)"
  [ "$out" = deleted ] || fail "slurm-delete-node printed '$out', want 'deleted'"
  ! dyn_known || fail "scontrol show node still lists $DYN_NODE after the delete"
  out=$(innode scontrol show node "$DYN_NODE" 2>&1 || true); echo "  after the delete: $out"
  ! grep -q "^$DYN_NODE " <<< "$(sinfo_node)" || fail "sinfo still lists $DYN_NODE"

  # already gone: slurmrestd answers 500 with error 2018, the client says so and succeeds
  out=$(delete_node "$RESTD_PORT" "$JWT" "$DYN_NODE") || fail "second delete of $DYN_NODE: $out"
  [ "$out" = "already gone" ] || fail "second delete printed '$out', want 'already gone'"

  # the pod deleted and recreated (what remediation does to slurmd pods): a fresh registration
  t=$(date +%s%N)
  dyn_slurmd_up
  wait_for 30 "$DYN_NODE to register again" dyn_idle || { slurm_logs; exit 1; }
  timing dynamic-slurmd-reregistered "$(ms "$t") ms"
  [[ $(sinfo_node) == *"$DYN_NODE idle gpu:nvidia_gb300:4"* ]] || { slurm_logs; fail "$DYN_NODE registered without its GPUs"; }
  out=$(srun_ -w "$DYN_NODE" --gres=gpu:2 env | grep '^CUDA_VISIBLE_DEVICES=') || { slurm_logs; fail "srun --gres=gpu:2 on $DYN_NODE"; }
  [ "$out" = CUDA_VISIBLE_DEVICES=0,1 ] || fail "srun --gres=gpu:2: $out"
  echo "  re-registered: $(grep "^$DYN_NODE " <<< "$(sinfo_node)"); srun --gres=gpu:2: $out"

  # an older API only (data_parser v0.0.40): v0.0.42 and v0.0.41 are 404 there, the client falls
  # back; a Slurm without that parser (26.05 serves v0.0.42-45) cannot show it
  if innode sh -c 'ls /usr/lib/*/slurm-wlm/data_parser_v0_0_40.so' > /dev/null 2>&1; then
    slurmrestd_up "$RESTD_OLD_PORT" -d data_parser/v0.0.40
    out=$(delete_node "$RESTD_OLD_PORT" "$JWT" "$DYN_NODE") || fail "delete through v0.0.40: $out"
    [ "$out" = deleted ] || fail "delete through v0.0.40 printed '$out', want 'deleted'"
    ! dyn_known || fail "scontrol show node still lists $DYN_NODE after the delete through v0.0.40"
    echo "  slurmrestd with data_parser v0.0.40 only: $out"
  else
    echo "  the fallback to v0.0.40 left out: this Slurm ($(innode slurmd -V)) has no data_parser v0.0.40"
  fi

  # a server that never answers: the request times out
  innode sh -c "rm -f /run/mgtb-mute; mkfifo /run/mgtb-mute"
  spawn mute "$LOGS/mute.log" sh -c "exec busybox nc -l -p $MUTE_PORT <> /run/mgtb-mute"
  wait_for 10 "the mute listener" listening "$MUTE_PORT"
  t=$(date +%s%N); rc=0; out=$(delete_node "$MUTE_PORT" "$JWT" "$DYN_NODE" --timeout 1 2>&1) || rc=$?
  local took; took=$(ms "$t")
  [ $rc != 0 ] || fail "a server that never answers: the delete succeeded: $out"
  grep -q 'slurmrestd did not answer in time' <<< "$out" || fail "a server that never answers: $out"
  if [ "$took" -lt 1000 ] || [ "$took" -ge 5000 ]; then fail "the 1 s timeout took $took ms"; fi
  echo "  a server that never answers: timed out after $took ms"
  stop_kinds TERM mute slurmrestd
  cri down "$SLURMD_POD" > /dev/null
  slurm_ctl_down
}

# opening each /dev/nvidia<m> read-write in a job: "<m> ok" or "<m> <the shell's error>"
OPEN_GPUS='for m in 0 1 2 3; do if e=$( (exec 3<> /dev/nvidia$m) 2>&1); then echo "$m ok"; else echo "$m ${e##*: }"; fi; done'

scenario_constrain_devices() {  # ConstrainDevices=yes: a job lists and opens only its own GPUs
  slurm_write_conf nvidia constrain
  slurm_ctl_up
  slurmd_up slurmd --env NVIDIA_VISIBLE_DEVICES=all --env SLURMD_NODENAME="$NODE"
  wait_for 30 "slurmd to register idle" node_idle || { slurm_logs; exit 1; }
  echo "  cgroup.conf: $(tr '\n' ' ' < "$R/etc/slurm/cgroup.conf")"
  local uuids s want a
  uuids=$(innode sh -c 'for f in /run/mockgpu/fs/proc/driver/nvidia/gpus/*/information; do
    printf "%s %s\n" "$(sed -n "s/^Device Minor:[[:space:]]*//p" "$f")" "$(sed -n "s/^GPU UUID:[[:space:]]*//p" "$f")"; done' | sort -n)
  # the guide's verification: two GPUs, those Slurm allocated (minors 0 and 1), as GPU 0 and 1
  s=$(srun_ --gres=gpu:2 sh -c 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L') || { slurm_logs; fail "srun --gres=gpu:2 nvidia-smi -L"; }
  echo "$s" | sed 's/^/  srun --gres=gpu:2 nvidia-smi -L: /'
  want=$(printf 'CUDA_VISIBLE_DEVICES=0,1\nGPU 0: NVIDIA GB300 (UUID: %s)\nGPU 1: NVIDIA GB300 (UUID: %s)' \
    "$(awk '$1 == 0 {print $2}' <<< "$uuids")" "$(awk '$1 == 1 {print $2}' <<< "$uuids")")
  [ "$s" = "$want" ] || fail "srun --gres=gpu:2 nvidia-smi -L: want
$want"
  # opening the nodes in the job: the device cgroup refuses the other two before any driver is
  # looked up; the allocated ones pass it, find no driver behind 195:N (ENXIO), and the shim (in
  # the job through /etc/ld.so.preload) opens /dev/null in their place
  s=$(srun_ --gres=gpu:2 sh -c "$OPEN_GPUS") || fail "srun: opening the GPU nodes"
  echo "$s" | sed 's/^/  open in a job with gpu:2: /'
  [ "$s" = "$(printf '0 ok\n1 ok\n2 Operation not permitted\n3 Operation not permitted')" ] \
    || fail "opening the GPU nodes in a job: want 0 and 1 to open, EPERM for 2 and 3"
  # two jobs at once get disjoint pairs: the first holds its GPUs until the second has listed
  cexec slurmd sh -c 'rm -f /tmp/mgtb-hold; mkfifo /tmp/mgtb-hold'
  # (--mem: the node's whole memory is each job's default, which would make them take turns)
  srun_ --mem=100 --gres=gpu:2 sh -c 'nvidia-smi -L; read -r _ < /tmp/mgtb-hold' > "$LOGS/job-a.txt" 2>&1 &
  a=$!
  wait_for 30 "the first job to list its GPUs" grep -c '^GPU 1: ' "$LOGS/job-a.txt" || { kill "$a" 2> /dev/null || true; fail "the first job listed: $(cat "$LOGS/job-a.txt")"; }
  s=$(srun_ --mem=100 --gres=gpu:2 nvidia-smi -L) || { kill "$a" 2> /dev/null || true; slurm_logs; fail "srun of the second job"; }
  cexec slurmd sh -c 'echo done > /tmp/mgtb-hold'
  wait "$a" || fail "the first job failed: $(cat "$LOGS/job-a.txt")"
  echo "  concurrent jobs: $(grep -o 'UUID: [^)]*' "$LOGS/job-a.txt" | tr '\n' ' ')| $(grep -o 'UUID: [^)]*' <<< "$s" | tr '\n' ' ')"
  [ "$(grep -o 'GPU-[0-9a-f-]*' "$LOGS/job-a.txt" | tr '\n' ' ')" = "$(awk '$1 < 2 {printf "%s ", $2}' <<< "$uuids")" ] || fail "the first job: want minors 0 and 1"
  [ "$(grep -o 'GPU-[0-9a-f-]*' <<< "$s" | tr '\n' ' ')" = "$(awk '$1 >= 2 {printf "%s ", $2}' <<< "$uuids")" ] || fail "the second job: want minors 2 and 3"
  cri down "$SLURMD_POD" > /dev/null
  slurm_ctl_down
}
