# scenarios.sh - the test bed's steps, sourced by testbed.sh (which defines R, ST, LOGS, cri, innode,
# fail, log, timing, track, stop_kinds, wait_for ...). Each step runs in a subshell under `set -e`;
# state that later steps need is kept in files under $ST.
# shellcheck shell=bash

GPU_PROFILE=gb300

# ---------------------------------------------------------------------------------------------
# the scenarios written in Rust (tests/testbed/src/scenarios): `mgtb-scenarios --exact NAME` runs
# one against this test bed (`mgtb-scenarios --list` names them). The node's smoke-pod, smoke-slurm and
# isolation steps are three of them (cluster.sh has its own isolation).

SCENARIOS_BIN=${SCENARIOS_BIN:-$(dirname "$CRI_BIN")/mgtb-scenarios}
CONTROLLER_BIN=${CONTROLLER_BIN:-$(dirname "$AGENT_BIN")/mockgpu-controller}   # slurmrestd-delete-node copies it into the node
# (fd 9, the run lock, is not inherited: the daemons a scenario starts would hold it)
rust_scenario() {
  TB=$TB R=$R LOGS=$LOGS ST=$ST CRI_SOCKET=$CRI_SOCKET CONTROLLER_BIN=$CONTROLLER_BIN "$SCENARIOS_BIN" --exact "$1" 9>&-
}
smoke_pod() { rust_scenario smoke-pod; }
smoke_slurm() { rust_scenario smoke-slurm; }
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
# Slurm: slurmctld + munged in the node (loopback-only network), slurmd in a container. The node
# scenarios' Slurm steps are in Rust (src/scenarios/slurm.rs, which writes the same files);
# cluster.sh still writes its slurm.conf here, and agent-restart runs a job with srun_

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

srun_() { innode timeout 60 srun -D / -N1 "$@"; }

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
  sstep agent-restart scenario_agent_restart
  sstep agent-surge scenario_agent_surge
  sstep runtime-restart rust_scenario runtime-restart
  sstep slurmrestd-delete-node rust_scenario slurmrestd-delete-node
  sstep constrain-devices rust_scenario constrain-devices
}

# reader_reads_since <ms since the epoch> <n>: the container's reader has logged n reads since then
reader_reads_since() { [ "$(cexec slurmd awk -v t="$1" '$1 > t' /tmp/reader.log | wc -l)" -ge "$2" ]; }

agent_logged() { tail -n +"$1" "$LOGS/agent.log" | matches -F "$2"; }  # agent_logged <first line> <text>

log_ms() {  # log_ms <log> <first line> <text>: the time (ms since the epoch) of the first line from
  # <first line> on that contains <text>, from its tracing timestamp
  local ts; ts=$(tail -n +"$2" "$1" | grep -F "$3" | awk 'NR == 1 {print $1}')   # (no -m1: see matches)
  [ -n "$ts" ] && date -d "$ts" +%s%3N
}

scenario_agent_restart() {
  # The keeper holds the FUSE connection: across a SIGTERM and a SIGKILL of the agent (the
  # successor started at once) a reader in a running container must see no failed read at all.
  [ -s "$ST/slurmd.env" ] || fail "needs the slurmd container of seed-verification"
  local pid0 sig old t0 t_sig t_start n0 l0 t_reg fails reads gap; pid0=$(ctr slurmd PID)
  # a reader inside the container, 50 reads/s, each line "<ms since epoch> ok|fail"
  cexec slurmd sh -c 'rm -f /tmp/reader.log; (while :; do
      if cat /proc/driver/nvidia/gpus/*/information > /dev/null 2>&1; then r=ok; else r=fail; fi
      echo "$(date +%s%3N) $r"; sleep 0.02; done > /tmp/reader.log 2>&1 < /dev/null & echo $! > /tmp/reader.pid)'
  wait_for 10 "the reader's first reads" reader_reads_since 0 10 || fail "the reader logged no reads"
  cexec slurmd grep -q ' ok$' /tmp/reader.log || fail "the reader cannot read the driver files before the restart"
  ! cexec slurmd grep -q ' fail$' /tmp/reader.log || fail "the reader failed before the restart"
  grep -q 'started a keeper' "$LOGS/agent.log" || fail "the agent serves without a keeper"
  t0=$(date +%s%3N)
  for sig in TERM KILL; do
    n0=$(nri_lines); l0=$(( $(wc -l < "$LOGS/agent.log") + 1 )); t_sig=$(date +%s%3N); old=$(cat "$ST/agent.pid")
    kill "-$sig" "$old"
    [ "$sig" = TERM ] || sleep "$AGENT_RESTART_PAUSE"
    t_start=$(date +%s%N)
    start_agent
    wait_for 30 "the agent restarted after SIG$sig to be ready" agent_ready "$n0" || { tail -20 "$LOGS/agent.log"; exit 1; }
    timing "agent-restart-sig$sig-to-ready" "$(ms "$t_start") ms"
    wait_for 10 "the restarted agent to log its NRI registration" agent_logged "$l0" 'registered with the NRI runtime' \
      || { tail -20 "$LOGS/agent.log"; exit 1; }
    t_reg=$(log_ms "$LOGS/agent.log" "$l0" 'registered with the NRI runtime') || fail "no timestamp on the NRI registration line"
    timing "agent-restart-sig$sig-nri-reconnect" "$(( t_reg - t_start / 1000000 )) ms from the new agent's start to its NRI registration ($(( t_reg - t_sig )) ms from SIG$sig)"
    agent_logged "$l0" 'connected to the running keeper' || fail "the agent restarted after SIG$sig did not join the keeper"
    # (a process killed while it waits for a FUSE reply cannot exit until one comes)
    wait_for 10 "the agent stopped with SIG$sig to exit" gone "$old" || fail "the agent stopped with SIG$sig (pid $old) did not exit"
  done
  # reads after the last restart too
  wait_for 10 "the reader's reads after the restarts" reader_reads_since "$(date +%s%3N)" 10 || fail "the reader stopped after the restarts"
  cexec slurmd sh -c 'kill $(cat /tmp/reader.pid)'
  cri exec "$(ctr slurmd CTR)" -- cat /tmp/reader.log > "$LOGS/reader.log"
  alive "$pid0" || fail "the slurmd container was restarted"
  fails=$(awk -v t="$t0" '$1 > t && $2 == "fail"' "$LOGS/reader.log" | wc -l)
  reads=$(awk -v t="$t0" '$1 > t' "$LOGS/reader.log" | wc -l)
  gap=$(awk -v t="$t0" '$1 > t {if (p && $1 - p > g) g = $1 - p; p = $1} END {print g + 0}' "$LOGS/reader.log")
  echo "  reader: $reads reads across the two restarts, $fails failed; longest gap between two reads $gap ms (20 ms when none waited)"
  timing agent-restart-failed-reads "$fails of $reads (SIGTERM and SIGKILL restarts; longest gap between reads $gap ms)"
  [ "$fails" = 0 ] || fail "$fails reads failed inside the container across the agent restarts"
  local s; s=$(srun_ ls /proc/driver/nvidia/gpus | grep -c .) || fail "srun after the agent restart"
  [ "$s" = 4 ] || fail "a job after the agent restart sees $s GPUs"
}

injections_of() { tail -n +"$1" "$LOGS/agent.log" | grep -c "injected the mock pod=$2 " || true; }  # injections_of <first line> <pod>

scenario_agent_surge() {
  # A rollout (maxSurge) starts the new agent beside the old one: until the old one stops, both
  # agents' NRI plugins adjust every GPU container, and the runtime fails the creation when two
  # plugins set the same mount, env or device without removing it first.
  local old n0 l0 n; old=$(cat "$ST/agent.pid"); n0=$(nri_lines); l0=$(( $(wc -l < "$LOGS/agent.log") + 1 ))
  start_agent
  wait_for 30 "the second agent registered with the runtime" agent_ready "$n0" || { tail -20 "$LOGS/agent.log"; exit 1; }
  wait_for 10 "the second agent to join the keeper" agent_logged "$l0" 'connected to the running keeper' || { tail -20 "$LOGS/agent.log"; exit 1; }
  # its plugin registers before its own mount is ready and refuses GPU containers until then
  # (fail closed: the kubelet retries), so the creation below waits for it to be ready
  wait_for 10 "the second agent to be ready" agent_logged "$l0" 'serve: ready' || { tail -20 "$LOGS/agent.log"; exit 1; }
  alive "$old" || fail "the first agent stopped when the second started"
  ctr_up surge --pod surge-0 --name main --device /dev/null:/dev/nvidia1 -- /bin/sleep 3600
  assert_injected surge 1
  n=$(injections_of "$l0" surge-0)
  [ "$n" = 2 ] || fail "the container was adjusted by $n plugins, want both agents' 2"
  echo "  a GPU container created while two agents' NRI plugins are registered: adjusted by both, created, injected"
  # the old agent leaves; the new one injects alone
  kill -TERM "$old"
  wait_for 15 "the first agent to stop" gone "$old" || fail "the first agent did not stop on SIGTERM"
  ctr_up surge-after --pod surge-1 --name main --device /dev/null:/dev/nvidia2 -- /bin/sleep 3600
  assert_injected surge-after 2
  n=$(injections_of "$l0" surge-1)
  [ "$n" = 1 ] || fail "after the first agent stopped, the container was adjusted by $n plugins, want 1"
  cri down surge-0 surge-1 > /dev/null
}

LAT_WARMUP=2                         # unmeasured creations before each round's LAT_N
LAT_MAX_RATIO=${LAT_MAX_RATIO:-3}    # bound on median(plugin on) / median(plugin off)
AGENT_METRICS=http://127.0.0.1:9464/metrics   # the agent's default --listen, in the node

nri_closed_since() { tail -n +"$(( $1 + 1 ))" "$LOGS/containerd.log" | matches -F 'mockgpu\" closed'; }  # nri_closed_since <line count>

latency_round() {  # latency_round <file> <mgtb-cri create-latency args...>: append raw samples to file
  cri create-latency -n "$LAT_N" --warmup "$LAT_WARMUP" --raw "${@:2}" | sed -n 's/^sample_ms //p' >> "$1"
}

metric() {  # metric <name{labels}>: its value on the agent's /metrics (busybox wget waits 900 s
  # for a reply unless told otherwise)
  local v; v=$(innode busybox wget -q -T 5 -O - "$AGENT_METRICS" | awk -v m="$1" '$1 == m {print $2}')
  [ -n "$v" ] || fail "no metric $1 at $AGENT_METRICS"
  echo "$v"
}

latency_round_on() {  # latency_round_on <file> <injections per creation: 1|0> <args...>: a round with the
  # plugin, which must see every creation and inject exactly the GPU containers
  local n=$(( LAT_N + LAT_WARMUP )) ev='mockgpu_nri_events_total{event="create_container"}' c0 i0 e0 c i e
  local err='mockgpu_nri_errors_total{outcome="fail_open"}'
  c0=$(metric "$ev"); i0=$(metric mockgpu_nri_injections_total); e0=$(metric "$err")
  latency_round "$1" "${@:3}"
  c=$(metric "$ev"); i=$(metric mockgpu_nri_injections_total); e=$(metric "$err")
  c=$(( c - c0 )); i=$(( i - i0 )); e=$(( e - e0 ))
  [ "$c" = "$n" ] || fail "${1##*.}: the plugin saw $c CreateContainer requests, want $n"
  [ "$i" = $(( n * $2 )) ] || fail "${1##*.}: the plugin injected $i of $n containers, want $(( n * $2 ))"
  [ "$e" = 0 ] || fail "${1##*.}: $e creations failed open"
}

median_ms() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

summarize_ms() {  # summarize_ms <file>: n, median and p90 (nearest rank) of one value per line
  sort -g "$1" | awk '{v[NR] = $1} END {
    if (!NR) {print "no samples"; exit 1}
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    r = int((90 * NR + 99) / 100); if (r < 1) r = 1
    printf "n=%d median_ms=%.2f p90_ms=%.2f min_ms=%.2f max_ms=%.2f\n", NR, m, v[r], v[1], v[NR]}'
}

scenario_latency() {
  # CRI CreateContainer round trip with the plugin connected and without it, in alternating rounds
  # (on, off, on, off) so that load from elsewhere on the machine hits both sides alike
  alive "$(cat "$ST/agent.pid" 2>/dev/null || echo 0)" || fail "the agent is not running"
  local L=$ST/latency k n0; rm -f "$L".*
  for _ in 1 2; do
    latency_round_on "$L.gpu-on" 1 --pod lat-gpu --env NVIDIA_VISIBLE_DEVICES=all
    latency_round_on "$L.plain-on" 0 --pod lat-plain
    n0=$(nri_lines); stop_kinds TERM agent
    ! alive "$(cat "$ST/agent.pid")" || fail "the agent survived SIGTERM; the plugin-off rounds would not be"
    wait_for 10 "the runtime to drop the plugin" nri_closed_since "$n0" || fail "containerd did not log the plugin's connection closed"
    latency_round "$L.gpu-off" --pod lat-gpu --env NVIDIA_VISIBLE_DEVICES=all
    latency_round "$L.plain-off" --pod lat-plain
    n0=$(nri_lines); start_agent
    wait_for 30 "the agent to be ready again" agent_ready "$n0" || { tail -20 "$LOGS/agent.log"; exit 1; }
  done
  for k in gpu-on gpu-off plain-on plain-off; do
    [ "$(wc -l < "$L.$k")" = $(( 2 * LAT_N )) ] || fail "$k: $(wc -l < "$L.$k") samples, want $(( 2 * LAT_N ))"
    timing "create-latency $(printf '%-9s' "$k")" "$(summarize_ms "$L.$k")"
  done
  local kind on off
  for kind in gpu plain; do
    on=$(median_ms "$L.$kind-on"); off=$(median_ms "$L.$kind-off")
    awk -v on="$on" -v off="$off" -v max="$LAT_MAX_RATIO" 'BEGIN {exit !(off > 0 && on <= max * off)}' \
      || fail "$kind container: median CreateContainer $on ms with the plugin, $off ms without: more than ${LAT_MAX_RATIO}x"
    echo "  $kind container: median $on ms with the plugin, $off ms without (bound ${LAT_MAX_RATIO}x)"
  done
}

# opening each /dev/nvidia<m> read-write in a job: "<m> ok" or "<m> <the shell's error>" (cluster.sh's
# Slinky scenario; constrain-devices has the same in slurm.rs)
OPEN_GPUS='for m in 0 1 2 3; do if e=$( (exec 3<> /dev/nvidia$m) 2>&1); then echo "$m ok"; else echo "$m ${e##*: }"; fi; done'
