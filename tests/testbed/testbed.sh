#!/bin/bash
# testbed.sh - the mockgpu node test bed: a Debian trixie root file system with the real
# containerd 1.7 (NRI on), runc and Slurm 24.11, containers created through CRI by `mgtb-cri`
# (tests/testbed/src), mockgpu-agent serving /run/mockgpu and its NRI plugin on the node's socket.
# No Kubernetes, no registry (images are assembled here), no CNI (host-network pods).
#
# Usage: testbed.sh COMMAND
#   bootstrap   debootstrap $SUITE + packages (reused while $TB/rootfs.key matches) + OCI images
#   rootfs      only the root file system of bootstrap (no build needed; tests/run.sh starts it early)
#   up          mounts, node namespaces (mount + loopback-only net, pivot_root), containerd, images
#   smoke       infrastructure proof without mockgpu: pod create/exec/teardown, a Slurm smoke test
#               (slurmd container, hand-made GPU devices, AutoDetect=off)
#   agent-up    start mockgpu-agent serve inside the node (FUSE at /run/mockgpu/fs, NRI plugin)
#   scenarios   the node scenarios against the agent (needs agent-up)
#   slurmrestd  only the scenario deleting a Slurm node through slurmrestd (needs up)
#   latency     CRI CreateContainer latency with the plugin and without it
#   cri ARGS    run `mgtb-cri ARGS` against the node (e.g. `testbed.sh cri ps`)
#   env         print shell exports (TB R LOGS CRI_SOCKET NRI_SOCKET NODE_PID ...)
#   down        pods, our processes by PID, mounts, cgroups (safe to run any time)
#   all         bootstrap up smoke agent-up scenarios latency, then down (down runs on every exit)
#   cluster-up  (cluster mode, after up) etcd, kube-apiserver, controller manager, scheduler, kubelet
#   control-plane  (cluster mode, after up) etcd and kube-apiserver only (bench/controller-scale.sh)
#   kubectl ARGS  (cluster mode) the node's kubectl, from the host through its network namespace
# Cluster mode (CLUSTER=1): a real Kubernetes node (etcd, kube-apiserver, kube-controller-manager,
#   kube-scheduler, kubelet; see cluster.sh); `all` runs bootstrap up cluster-up agent-up cluster.
# Env: SUITE (trixie: containerd 1.7; sid: containerd 2.x), TB (/var/tmp/mgtb, /var/tmp/mgk8s-tb in
#      cluster mode, with -sid appended for sid; keep it short: AF_UNIX paths < 108 bytes),
#      CGROUP_PARENT (/mgtb, /mgk8s in cluster mode, -sid likewise), MIRROR (from apt sources),
#      CRI_BIN, AGENT_BIN, CONTROLLER_BIN (built binaries, default target/debug: tests/build-bins.sh; the agent
#      carries the shim),
#      AGENT_ARGS (extra `serve` flags), LAT_N (20), AGENT_RESTART_PAUSE (0 s),
#      STEPS (a subset of the `all` steps, in order), SCENARIOS (a subset of the scenario steps),
#      NODES (cluster mode: node0 and NODES-1 workers, default 2; cluster.sh).
#      PRODUCT_IMAGES (cluster mode: the OCI archive of the product images; default: built by
#      tests/images-build.sh; `none`: without them).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLUSTER=${CLUSTER:-0}
SUITE=${SUITE:-trixie}
SFX=$([ "$SUITE" = trixie ] || echo "-$SUITE")   # two suites' test beds never share state or cgroups
if [ "$CLUSTER" = 1 ]; then TB=${TB:-/var/tmp/mgk8s-tb$SFX}; else TB=${TB:-/var/tmp/mgtb$SFX}; fi
R=$TB/rootfs
LOGS=$TB/logs
ST=$TB/state                       # per-run state shared between steps (ids, pids)
PIDS=$TB/pids.txt                  # "<kind> <pid> <starttime>" of every process we started
CRI_SOCKET=$R/run/containerd/containerd.sock
NRI_SOCKET=$R/run/nri/nri.sock
CRI_BIN=${CRI_BIN:-$REPO/target/debug/mgtb-cri}
AGENT_BIN=${AGENT_BIN:-$REPO/target/debug/mockgpu-agent}
AGENT_ARGS=${AGENT_ARGS:-}
LAT_N=${LAT_N:-20}
AGENT_RESTART_PAUSE=${AGENT_RESTART_PAUSE:-0}   # seconds between SIGKILL and the new agent
NODE=node0                         # Slurm node name == mockgpu node name
SLURM_UID=401                      # uid and gid of `slurm` in the slurmd image, as in Slinky's images
# every pod cgroup lives below this (mgtb-cri --cgroup-parent; the kubelet's cgroupRoot); two test
# beds running at once need two of them, since teardown kills whatever is below it
if [ "$CLUSTER" = 1 ]; then CGROUP_PARENT=${CGROUP_PARENT:-/mgk8s$SFX}; else CGROUP_PARENT=${CGROUP_PARENT:-/mgtb$SFX}; fi
export MGTB_CGROUP_PARENT=$CGROUP_PARENT
MIRROR=${MIRROR:-$( { grep -h -o -m1 -E '^(URIs:|deb) +[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } | head -1 | awk '{print $2}')}
# slurm-wlm-nvml-plugin (section contrib): Slurm's AutoDetect=nvml, against the mock NVML
PKGS="containerd runc busybox-static slurmd slurmctld slurm-client slurmrestd slurm-wlm-jwt-plugin slurm-wlm-nvml-plugin munge pciutils hwloc"
if [ "$CLUSTER" = 1 ]; then
  # shellcheck source=../k8s-versions.sh
  . "$REPO/tests/k8s-versions.sh"
  # Slinky's slurmd image runs supervisord (PID 1) with slurmd, sshd and sssd beside it
  # (sssd-proxy: a local domain of the files, so that sssd runs without a directory server)
  PKGS="$PKGS $K8S_DEBIAN_PACKAGES supervisor openssh-server sssd-common sssd-proxy"
fi
BOOTSTRAP_REV=1                    # bump when the bootstrap steps change
ENVP=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive)

[ ${#NRI_SOCKET} -lt 100 ] || { echo "TB too long for AF_UNIX socket paths: $NRI_SOCKET" >&2; exit 2; }
mkdir -p "$LOGS" "$ST"; touch "$PIDS"

T0=$(date +%s%N)
ms()   { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
log()  { printf '[%s +%5.1fs] %s\n' "$(date +%T)" "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# matches <grep args>: grep that reads all its input. `cmd | grep -q` may exit at the first match
# while cmd still writes; cmd then dies of SIGPIPE and, under pipefail, the pipeline fails.
matches() { grep "$@" > /dev/null; }
timing() { echo "TIMING $1: $2" | tee -a "$LOGS/timings.txt"; }   # timing <what> <value>

umount_under() {  # umount_under <dir>: every mount at or below dir, deepest first
  local m; { grep -oE "^[0-9]+ [0-9]+ [0-9:]+ [^ ]+ $1(/[^ ]*)? " /proc/self/mountinfo || true; } | awk '{print $5}' | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
inchroot() { chroot "$1" /usr/bin/env -i "${ENVP[@]}" "${@:2}"; }
nodepid()  { cat "$ST/node.pid" 2>/dev/null; }
# a command inside the node: its mount namespace (root = $R) and its loopback-only network
innode()   { nsenter -t "$(nodepid)" -m -n -- /usr/bin/env -i "${ENVP[@]}" "$@"; }
cri()      { "$CRI_BIN" --socket "$CRI_SOCKET" "$@"; }
# spawn <kind> <log> <cmd...>: a daemon inside the node, tracked by PID (in $SPAWNED); fd 9 (the
# run lock) is not inherited
spawn() {
  local kind=$1 log=$2; shift 2
  setsid nsenter -t "$(nodepid)" -m -n -- /usr/bin/env -i "${ENVP[@]}" "$@" >> "$log" 2>&1 < /dev/null 9>&- &
  SPAWNED=$!; track "$kind" "$SPAWNED"
}
# the cgroup directories of our pods (cgroup v1 controllers and/or the v2 hierarchy)
cgroup_dirs() { local d; for d in /sys/fs/cgroup"$CGROUP_PARENT" /sys/fs/cgroup/*"$CGROUP_PARENT"; do [ -d "$d" ] && echo "$d"; done; return 0; }

# process bookkeeping: the start time (field 22 of /proc/PID/stat) guards every kill against PID
# reuse; a zombie counts as gone
# shellcheck disable=SC2086 # split the stat fields
pstart() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; s=${s##*) }; set -- $s; [ "$1" = Z ] || echo "${20}"; }
# a worker's processes are of kinds "<kind>@<node>" (KIND_AT, cluster.sh worker_vars): its
# kubelet is not the one a scenario restarts
track()  { local st; st=$(pstart "$2"); echo "$1${KIND_AT:-} $2 ${st:--}" >> "$PIDS"; }
ours()   { [ -n "${2:-}" ] && [ "$(pstart "$1")" = "$2" ]; }
alive()  { [ -n "$(pstart "$1")" ]; }
gone()   { ! alive "$1"; }
stop_kinds() {  # stop_kinds SIG <kind>...: signal our live processes of those kinds, wait <= 10 s
  local sig=$1 k p st ps=(); shift
  for k in "$@"; do
    k=$k${KIND_AT:-}
    while read -r p st; do ours "$p" "$st" && kill "-$sig" "$p" 2>/dev/null && ps+=("$p $st"); done < <(awk -v k="$k" '$1==k{print $2, $3}' "$PIDS")
    awk -v k="$k" '$1!=k' "$PIDS" > "$PIDS.tmp"; mv -f "$PIDS.tmp" "$PIDS"
  done
  # shellcheck disable=SC2086 # "pid start" splits into ours's two arguments
  for p in "${ps[@]}"; do for _ in $(seq 100); do ours $p || break; sleep 0.1; done; done
}
wait_for() {  # wait_for <seconds> <what> <command...>: poll every 0.1 s until a deadline (a slow
  # command, such as kubectl, does not stretch the wait)
  local s=$1 end=$(( $(date +%s) + $1 )) what=$2; shift 2
  while :; do
    "$@" > /dev/null 2>&1 && return 0
    [ "$(date +%s)" -lt "$end" ] || break
    sleep 0.1
  done
  echo "FAIL: timed out after $s s waiting for $what" >&2; return 1
}

# ---------------------------------------------------------------------------------------------
# bootstrap: root file system (cached by key) and the OCI image archive

rootfs_key() {
  { echo "rev=$BOOTSTRAP_REV mirror=$MIRROR suite=$SUITE variant=minbase"; echo "pkgs=$PKGS"
    declare -f bootstrap_rootfs; } | sha256sum | cut -c1-16
}

bootstrap_rootfs() {  # bootstrap_rootfs <dir>: debootstrap + packages, without starting any service
  local d=$1
  debootstrap --variant=minbase --components=main,contrib "$SUITE" "$d" "$MIRROR" > "$LOGS/debootstrap.log" 2>&1 || { tail "$LOGS/debootstrap.log"; fail debootstrap; }
  # the mirror's sid Release file can be past its Valid-Until date
  [ "$SUITE" = trixie ] || echo 'Acquire::Check-Valid-Until "false";' > "$d/etc/apt/apt.conf.d/99mgtb-valid-until"
  printf '#!/bin/sh\nexit 101\n' > "$d/usr/sbin/policy-rc.d"; chmod +x "$d/usr/sbin/policy-rc.d"
  # no docs/man/locales: smaller rootfs, faster slurmd image
  printf 'path-exclude=/usr/share/doc/*\npath-exclude=/usr/share/man/*\npath-exclude=/usr/share/locale/*\npath-include=/usr/share/locale/locale.alias\n' \
    > "$d/etc/dpkg/dpkg.cfg.d/01-nodoc"
  mount -t proc proc "$d/proc"; mount --rbind /dev "$d/dev"; mount --make-rslave "$d/dev"
  local rc=0
  # shellcheck disable=SC2086 # PKGS is a list
  { inchroot "$d" apt-get update -q && inchroot "$d" apt-get install -y -q --no-install-recommends $PKGS && inchroot "$d" apt-get clean; } > "$LOGS/apt.log" 2>&1 || rc=$?
  umount -R "$d/dev"; umount "$d/proc"
  [ $rc = 0 ] || { tail -20 "$LOGS/apt.log"; fail "apt-get install in the rootfs"; }
  [ -s "$d/etc/munge/munge.key" ] || inchroot "$d" mungekey --create --force >> "$LOGS/apt.log" 2>&1
  chown --reference="$d/etc/munge" "$d/etc/munge/munge.key" 2>/dev/null || true
}

phase_rootfs() {
  local key t; key=$(rootfs_key)
  if [ -x "$R/usr/bin/containerd" ] && [ "$(cat "$TB/rootfs.key" 2>/dev/null)" = "$key" ]; then
    log "bootstrap: reusing $R (key $key)"
  else
    [ -n "$MIRROR" ] || fail "no Debian mirror in the apt sources; set MIRROR"
    ! grep -q " ${R}[/ ]" /proc/self/mountinfo || fail "$R is mounted; run 'testbed.sh down' first"
    umount_under "$TB/rootfs.new"        # an interrupted bootstrap: never rm -rf through /dev
    log "bootstrap: debootstrap $SUITE from $MIRROR + $PKGS (key $key)"
    t=$(date +%s%N)
    ! grep -q " $TB/rootfs.new[/ ]" /proc/self/mountinfo || fail "$TB/rootfs.new is still mounted"
    rm -rf "$TB/rootfs.new" "$R" "$TB/images"; mkdir -p "$TB/rootfs.new"
    bootstrap_rootfs "$TB/rootfs.new"
    mv "$TB/rootfs.new" "$R"; echo "$key" > "$TB/rootfs.key"
    timing rootfs-build "$(ms "$t") ms ($(du -shx "$R" | cut -f1))"
  fi
}

phase_bootstrap() { phase_rootfs; build_images; }

oci_blob() {  # oci_blob <dir> <file>: move file into blobs/sha256, echo "<sha> <size>"
  local sha size; sha=$(sha256sum "$2" | cut -d' ' -f1); size=$(stat -c %s "$2")
  mv "$2" "$1/blobs/sha256/$sha"; echo "$sha $size"
}

oci_manifest() {  # oci_manifest <ocidir> <config-json-fragment> <layer>...: echo "<sha> <size>" of the
  # manifest; a layer is a tar file (moved into the blobs) or the sha256 of a blob already there
  local O=$1 cfg=$2 l sha size diffs="" layers="" csha csize; shift 2
  for l in "$@"; do
    if [ -f "$l" ]; then read -r sha size < <(oci_blob "$O" "$l"); else sha=$l; size=$(stat -c %s "$O/blobs/sha256/$sha"); fi
    diffs="$diffs${diffs:+,}\"sha256:$sha\""
    layers="$layers${layers:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$sha\",\"size\":$size}"
  done
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":[%s]}}' "$cfg" "$diffs" > "$O/c.json"
  read -r csha csize < <(oci_blob "$O" "$O/c.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
    "$csha" "$csize" "$layers" > "$O/m.json"
  oci_blob "$O" "$O/m.json"
}

oci_index_entry() {  # oci_index_entry <name> <manifest sha> <size>: an index.json entry naming localhost/<name>:1
  printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,' "$2" "$3"
  printf '"platform":{"architecture":"amd64","os":"linux"},'
  printf '"annotations":{"io.containerd.image.name":"localhost/%s:1","org.opencontainers.image.ref.name":"1"}}' "$1"
}

build_images() {  # one OCI archive: localhost/pause:1 = localhost/busybox:1 (busybox-static), localhost/slurmd:1
  local key; key="$(cat "$TB/rootfs.key")-$SLURM_UID-$(declare -f build_images oci_manifest oci_index_entry | sha256sum | cut -c1-8)"
  if [ -s "$TB/images/all.tar" ] && [ "$(cat "$TB/images/key" 2>/dev/null)" = "$key" ]; then return 0; fi
  log "bootstrap: assembling OCI images"
  local t W=$TB/images/work bsha bsize ssha ssize TAR=(tar --numeric-owner --sort=name --mtime=2024-01-01)
  t=$(date +%s%N)
  rm -rf "$TB/images"; mkdir -p "$W/layer"/{bin,tmp,etc,proc,sys,dev,root} "$W/oci/blobs/sha256"
  cp "$R/bin/busybox" "$W/layer/bin/busybox"
  for a in $("$R/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$W/layer/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' > "$W/layer/etc/passwd"; echo 'root:x:0:' > "$W/layer/etc/group"; chmod 1777 "$W/layer/tmp"
  "${TAR[@]}" --owner=0 --group=0 -C "$W/layer" -cf "$W/busybox.tar" .
  read -r bsha bsize < <(oci_manifest "$W/oci" '{"Env":["PATH=/bin"],"Cmd":["/bin/sleep","inf"],"WorkingDir":"/"}' "$W/busybox.tar")
  # slurmd image: the node rootfs minus the container runtime, apt state and anything mounted.
  # Debian's package makes `slurm` uid/gid 64030 (its static id); Slinky's images and operator use
  # 401 (files it owns, SlurmUser's processes): the image renumbers the user, its group and its files
  local su sg; su=$(awk -F: '$1 == "slurm" {print $3}' "$R/etc/passwd"); sg=$(awk -F: '$1 == "slurm" {print $3}' "$R/etc/group")
  if [ -z "$su" ] || [ -z "$sg" ]; then fail "the node root has no slurm user or group (from the slurm packages)"; fi
  ! awk -F: -v id="$SLURM_UID" '$1 != "slurm" && $3 == id {f = 1} END {exit !f}' "$R/etc/passwd" "$R/etc/group" \
    || fail "uid or gid $SLURM_UID is taken in the node root; the slurmd image cannot give it to slurm"
  mkdir -p "$W/ids/etc"
  awk -F: -v OFS=: -v id="$SLURM_UID" '$1 == "slurm" {$3 = id; $4 = id} 1' "$R/etc/passwd" > "$W/ids/etc/passwd"
  awk -F: -v OFS=: -v id="$SLURM_UID" '$1 == "slurm" {$3 = id} 1' "$R/etc/group" > "$W/ids/etc/group"
  echo "+$su +$SLURM_UID" > "$W/ids.uid"; echo "+$sg +$SLURM_UID" > "$W/ids.gid"
  "${TAR[@]}" -C "$R" -cf "$W/slurmd.tar" --owner-map="$W/ids.uid" --group-map="$W/ids.gid" \
    --exclude=./etc/passwd --exclude=./etc/group \
    --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* --exclude=./run/* --exclude=./tmp/* \
    --exclude=./var/lib/containerd --exclude=./var/lib/mgtb --exclude=./var/cache/apt/* --exclude=./var/lib/apt/lists/* \
    --exclude=./var/log/* --exclude=./usr/bin/containerd* --exclude=./usr/bin/ctr --exclude=./usr/sbin/runc \
    --exclude=./etc/containerd --exclude=./etc/slurm/* --exclude=./opt/* --exclude=./.oldroot --exclude=./usr/local/* .
  "${TAR[@]}" -C "$W/ids" -rf "$W/slurmd.tar" ./etc/passwd ./etc/group
  local lsize; lsize=$(stat -c %s "$W/slurmd.tar")
  read -r ssha ssize < <(oci_manifest "$W/oci" '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["/bin/sleep","infinity"],"WorkingDir":"/"}' "$W/slurmd.tar")
  echo '{"imageLayoutVersion":"1.0.0"}' > "$W/oci/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s,%s,%s]}' \
    "$(oci_index_entry pause "$bsha" "$bsize")" "$(oci_index_entry busybox "$bsha" "$bsize")" \
    "$(oci_index_entry slurmd "$ssha" "$ssize")" > "$W/oci/index.json"
  tar -C "$W/oci" -cf "$TB/images/all.tar" .
  rm -rf "$W"; echo "$key" > "$TB/images/key"
  timing image-build "$(ms "$t") ms (slurmd layer $(( lsize / 1048576 )) MiB)"
}

# the product images: localhost/mockgpu-<name>:1, one per images/<name>.Dockerfile, built from
# it by buildah as `docker build` builds it (tests/images-build.sh: local Debian base images, the
# layer and cargo caches in /var/tmp/mgimages), one OCI archive; PRODUCT_IMAGES names one to use
# (`none`: no product images, for a run that starts none of them, such as bench/controller-scale.sh)
build_product_images() {
  if [ -n "${PRODUCT_IMAGES:-}" ]; then [ -s "$PRODUCT_IMAGES" ] || fail "no OCI archive at PRODUCT_IMAGES=$PRODUCT_IMAGES"; return 0; fi
  local t; t=$(date +%s%N)
  log "up: the product images from images/*.Dockerfile (tests/images-build.sh, buildah; log lines images-build:)"
  PRODUCT_IMAGES=$(bash "$REPO/tests/images-build.sh" 2> >(tee -a "$LOGS/images-build.log" >&2) | tail -1) \
    || fail "the product images do not build from images/*.Dockerfile (tests/images-build.sh; see above and $LOGS/images-build.log)"
  timing product-images "$(ms "$t") ms ($PRODUCT_IMAGES)"
}

# ---------------------------------------------------------------------------------------------
# up: mounts, the node's namespaces, containerd

do_mount() {
  mountpoint -q "$R" || mount --bind "$R" "$R"      # runc needs "/" of the node to be a mount point
  mount --make-rshared "$R"                          # host mounts below it propagate into node + containers
  mountpoint -q "$R/proc" || mount -t proc proc "$R/proc"
  mountpoint -q "$R/sys"  || { mount --rbind /sys "$R/sys"; mount --make-rslave "$R/sys"; }
  if [ "$CLUSTER" = 1 ]; then cluster_dev; else
    mountpoint -q "$R/dev"  || { mount --rbind /dev "$R/dev"; mount --make-rslave "$R/dev"; }
  fi
  mountpoint -q "$R/run"  || mount -t tmpfs -o mode=755 tmpfs "$R/run"
}

write_configs() {
  mkdir -p "$R/etc/containerd" "$R/etc/nri/conf.d" "$R/opt/nri/plugins" "$R/etc/slurm" "$R/etc/mockgpu"
  # containerd 2.x reads the version-2 file too, but migrates it with a warning: it gets its own
  local v; v=$(inchroot "$R" containerd --version | grep -oE ' v?[0-9]+\.[0-9]+' | head -1 | tr -d ' v')
  case $v in
    1.*) cp "$HERE/node/containerd.toml" "$R/etc/containerd/config.toml" ;;
    *) cp "$HERE/node/containerd-v3.toml" "$R/etc/containerd/config.toml" ;;
  esac
  # CRI copies /etc/hosts into host-network pods; Slurm resolves the host name through it.
  # 127.0.0.2: glibc's AI_ADDRCONFIG does not count 127.0.0.1 as a configured address
  printf '127.0.0.1\tlocalhost\n127.0.0.2\t%s %s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$(hostname)" "$NODE" > "$R/etc/hosts"
  hostname > "$R/etc/hostname"
  : > "$R/etc/resolv.conf"                                   # nothing to resolve: no DNS from the node
  if [ "$CLUSTER" = 1 ]; then cluster_configs; fi
}

start_containerd() {
  spawn containerd "$LOGS/containerd.log" containerd --config /etc/containerd/config.toml --log-level debug
  echo "$SPAWNED" > "$ST/containerd.pid"
  wait_for 20 "containerd CRI socket" cri version
  wait_for 10 "NRI socket" test -S "$NRI_SOCKET"
}

phase_up() {
  [ -x "$CRI_BIN" ] || fail "no CRI client at $CRI_BIN (build: bash tests/build-bins.sh, or set CRI_BIN)"
  if [ -n "$(nodepid)" ] && alive "$(nodepid)"; then fail "the test bed is already up (testbed.sh down first)"; fi
  local t; t=$(date +%s%N)
  # after a run that did not end cleanly, start from an empty containerd state (recover nothing)
  if [ ! -e "$ST/clean" ] && ! grep -q " ${R}[/ ]" /proc/self/mountinfo; then rm -rf "$R/var/lib/containerd"; fi
  rm -f "$ST/clean" "$ST"/*.env "$ST"/latency.* "$ST/window.txt"   # nothing from an earlier run
  # a hard link (before $R becomes a mount point: links do not cross mounts) or a copy
  mkdir -p "$R/var/lib/mgtb"
  ln -f "$TB/images/all.tar" "$R/var/lib/mgtb/images.tar" 2>/dev/null || cp -f "$TB/images/all.tar" "$R/var/lib/mgtb/images.tar"
  rm -f "$R/var/lib/mgtb/product.tar"
  if [ "$CLUSTER" = 1 ] && [ "${PRODUCT_IMAGES:-}" != none ]; then
    build_product_images
    ln -f "$PRODUCT_IMAGES" "$R/var/lib/mgtb/product.tar" 2>/dev/null || cp -f "$PRODUCT_IMAGES" "$R/var/lib/mgtb/product.tar"
  fi
  if [ "$CLUSTER" = 1 ] && [ "$NODE" = node0 ] && [ "$NODES" -gt 1 ]; then worker_roots; fi
  do_mount; write_configs
  mkdir -p "$R/.oldroot"; rm -f "$R/run/node.pid"
  log "up: node namespaces (mount: pivot_root into $R; network: loopback only)"
  # the holder keeps both namespaces alive across containerd restarts; it is PID 'node' in $PIDS
  NODE_IP=${NODE_IP:-} setsid unshare --mount --net --propagation slave --fork -- /bin/bash -c '
    set -e; cd "$0"; pivot_root . .oldroot; cd /
    eval "$1"
    umount -l /.oldroot
    mount --make-rshared /
    busybox ip link set lo up; busybox ip addr add 127.0.0.2/8 dev lo
    eval "$2"
    echo $$ > /run/node.pid
    exec sleep infinity' "$R" "${NODE_PIVOT_HOOK:-}" "${NODE_NET_HOOK:-}" > "$LOGS/node.log" 2>&1 < /dev/null 9>&- &
  track unshare $!
  wait_for 10 "node namespace" test -s "$R/run/node.pid"
  cp "$R/run/node.pid" "$ST/node.pid"; track node "$(nodepid)"
  readlink "/proc/$(nodepid)/ns/mnt" > "$ST/node.mntns"; cp "$ST/node.mntns" "$ST/node.mntns.last"
  log "up: containerd"; : > "$LOGS/containerd.log"
  start_containerd
  innode ctr -n k8s.io images import /var/lib/mgtb/images.tar > /dev/null
  local img imgs want="pause busybox slurmd"
  if [ -e "$R/var/lib/mgtb/product.tar" ]; then
    innode ctr -n k8s.io images import /var/lib/mgtb/product.tar > /dev/null
    for img in "$REPO"/images/*.Dockerfile; do want="$want mockgpu-$(basename "$img" .Dockerfile)"; done
  fi
  imgs=$(innode ctr -n k8s.io images ls -q)   # (no `| grep -q`: see matches)
  for img in $want; do
    grep -qx "localhost/$img:1" <<< "$imgs" || fail "image localhost/$img:1 not imported"
  done
  [ "$NODE" != node0 ] || print_env > "$TB/env.sh"
  timing testbed-up "$(ms "$t") ms (containerd pid $(cat "$ST/containerd.pid"), node pid $(nodepid))"
}

print_env() {
  cat <<EOF
export TB='$TB' R='$R' LOGS='$LOGS' ST='$ST' NODE_PID='$(nodepid)' MGTB_CGROUP_PARENT='$CGROUP_PARENT'
export CRI_SOCKET='$CRI_SOCKET' NRI_SOCKET='$NRI_SOCKET' CRI_BIN='$CRI_BIN'
# enter the node: nsenter -t \$NODE_PID -m -n; paths in CRI requests and NRI adjustments are node paths (\$R/...)
EOF
  if [ "$CLUSTER" = 1 ]; then
    cat <<EOF
# the API server listens on the node's addresses (6443), which only its network namespace has:
#   nsenter -t \$NODE_PID -n -- \$K8S_BIN/kubectl get nodes
export KUBECONFIG='$KCFG' K8S_BIN='$K8S_BIN'
EOF
  fi
}

# ---------------------------------------------------------------------------------------------
# down: every exit path

phase_down() {
  set +e; trap - ERR
  log "down"
  if [ "$CLUSTER" = 1 ]; then each_node cluster_down; fi
  each_node node_cri_down
  each_node stop_kinds TERM agent mute slurmrestd munged slurmctld
  each_node stop_kinds TERM containerd
  each_node node_kill
  each_node stop_kinds TERM node unshare
  each_node node_unmount
  umount_under "$TB/rootfs.new"; rm -f "$TB/env.sh"
  log "down: done ($(each_node leftovers | sort -u | paste -sd ' '))"
  set -e
}
# each_node <function>: for each worker a run left (cluster mode: state/node<i>), in its
# globals, then for the node
each_node() { local d; for d in "$TB"/state/node[1-9]*; do [ -d "$d" ] && ( worker_vars "${d##*/node}"; "$@" ); done; "$@"; }
node_cri_down() { if [ -S "$CRI_SOCKET" ] && [ -x "$CRI_BIN" ]; then timeout 60 "$CRI_BIN" --socket "$CRI_SOCKET" down > /dev/null 2>&1; fi; }
node_kill() {  # container processes and shims left behind (containerd gone before removal): by
  # cgroup and by the node's mount namespace, both ours alone
  local p ns np; ns=$(cat "$ST/node.mntns" 2>/dev/null); np=$(nodepid)
  for p in $(cgroup_dirs | while read -r d; do find "$d" -name cgroup.procs -exec cat {} +; done | sort -u); do kill -9 "$p" 2>/dev/null; done
  if [ -n "$ns" ]; then
    for p in /proc/[0-9]*; do
      p=${p#/proc/}; [ "$p" = "$np" ] && continue
      [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" = "$ns" ] && kill -9 "$p" 2>/dev/null
    done
  fi
}
node_unmount() {  # FUSE mounts first (a dead server would hang umount -R), then everything under $R
  grep -E " fuse[^ ]* " /proc/self/mountinfo | awk '{print $5}' | grep "^$R/" | sort -r | while read -r m; do umount -l "$m"; done
  if mountpoint -q "$R"; then umount -R "$R" || umount -R -l "$R"; fi
  umount_under "$R"
  for d in $(cgroup_dirs); do find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null; done
  rm -f "$ST"/*.pid "$ST/node.mntns"
  [ "$(leftovers)" != "nothing left" ] || touch "$ST/clean"
}

leftovers() {  # what teardown left behind, in words ("nothing left" when clean)
  local l=() n ns; ns=$(cat "$ST/node.mntns.last" 2>/dev/null)
  n=$(grep -c " $TB/rootfs" /proc/self/mountinfo); [ "$n" = 0 ] || l+=("$n mounts under $TB")
  n=$(cgroup_dirs | wc -l); [ "$n" = 0 ] || l+=("$n cgroup dirs $CGROUP_PARENT")
  if [ -n "$ns" ]; then
    n=0; for p in /proc/[0-9]*; do [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] && alive "${p#/proc/}" && n=$((n + 1)); done
    [ "$n" = 0 ] || l+=("$n processes in the node's mount namespace")
  fi
  if [ ${#l[@]} = 0 ]; then echo "nothing left"; else local IFS=,; echo "LEFT: ${l[*]}"; fi
}

# ---------------------------------------------------------------------------------------------
# the steps (scenarios live in scenarios.sh, sourced here)

# shellcheck source=scenarios.sh
. "$HERE/scenarios.sh"
# shellcheck source=cluster.sh
if [ "$CLUSTER" = 1 ]; then . "$HERE/cluster.sh"; fi

teardown_clean() {  # the teardown itself, as a step: it must leave nothing behind
  phase_down
  local l; l=$(leftovers); [ "$l" = "nothing left" ] || fail "teardown: $l"
}

PASSED=0; FAILED=0; FAILED_NAMES=()
on_err() {  # on_err <rc> <command> <line>: the ERR trap of a step (not of its $(...) inside)
  [ -z "$STEP_FAILED" ] && [ "$BASH_SUBSHELL" -le 1 ] || return 0
  STEP_FAILED=1; echo "FAIL: \`$2\` exited $1 (line $3)" >&2
}

step() {  # step <name> <function> [args]: run in a subshell (its `fail` ends only the step), time it
  local t rc; t=$(date +%s%N)
  log "=== $1"
  # a failing command names itself (once), so that no step fails silently
  set +e
  ( set -eE; STEP_FAILED=; trap 'on_err $? "$BASH_COMMAND" "$LINENO"' ERR; "${@:2}" )
  rc=$?; set -e
  if [ $rc = 0 ]; then PASSED=$((PASSED + 1)); echo "PASS $1 ($(ms "$t") ms)" | tee -a "$LOGS/summary.txt"
  else FAILED=$((FAILED + 1)); FAILED_NAMES+=("$1"); echo "FAIL $1 ($(ms "$t") ms)" | tee -a "$LOGS/summary.txt"; fi
  return 0
}

# sstep <name> <function>: a scenario step. SCENARIOS="<name> ..." runs only those, for work on a
# few (a step may need what earlier ones leave: the slurmd container, the chart installed)
sstep() {
  if [ -z "${SCENARIOS:-}" ] || [[ " $SCENARIOS " == *" $1 "* ]]; then step "$@"
  else log "$1: not in SCENARIOS"; fi
}

phase_all() {
  local s steps=${STEPS:-bootstrap up smoke agent-up scenarios latency}
  [ "$CLUSTER" = 1 ] && steps=${STEPS:-bootstrap up cluster-up agent-up cluster}
  exec 9> "$TB/lock"
  flock -n 9 || fail "another test bed run holds $TB/lock"
  : > "$LOGS/summary.txt"; : > "$LOGS/timings.txt"
  trap phase_down EXIT
  trap 'exit 130' INT TERM HUP
  if grep -q " ${R}[/ ]" /proc/self/mountinfo || [ -s "$ST/node.pid" ]; then
    log "all: cleaning up after an earlier run"; phase_down
  fi
  for s in $steps; do
    case $s in
      bootstrap) step bootstrap phase_bootstrap ;;
      up) step up phase_up ;;
      smoke) step smoke-pod smoke_pod; step smoke-slurm smoke_slurm ;;
      agent-up) step agent-up agent_up ;;
      scenarios) run_scenarios ;;
      latency) step nri-latency scenario_latency ;;
      cluster-up) cluster_up ;;
      cluster) run_cluster_scenarios ;;
      *) fail "unknown step $s" ;;
    esac
    # without a node there is nothing to test
    if [ $FAILED -gt 0 ] && [[ " ${FAILED_NAMES[*]} " =~ \ (bootstrap|up|control-plane|kubelet)\  ]]; then break; fi
  done
  # (the node's isolation; cluster mode's has the pod bridge, its pods and the host's sysctls)
  if [ -n "$(nodepid)" ]; then
    if [ "$CLUSTER" = 1 ]; then step isolation rust_scenario cluster-isolation; else step isolation rust_scenario isolation; fi
  fi
  step teardown teardown_clean
  trap - EXIT
  echo "--- timings"; cat "$LOGS/timings.txt"
  echo "--- summary"; cat "$LOGS/summary.txt"
  echo "testbed: $PASSED passed, $FAILED failed"
  [ $FAILED = 0 ]
}

case "${1:-}" in
  bootstrap) phase_bootstrap ;;
  rootfs) exec 9> "$TB/lock"; flock 9; phase_rootfs ;;
  up) trap phase_down EXIT; phase_up; trap - EXIT ;;   # a node half up is torn down
  smoke) step smoke-pod smoke_pod; step smoke-slurm smoke_slurm; echo "testbed: $PASSED passed, $FAILED failed"; [ $FAILED = 0 ] ;;
  agent-up) agent_up ;;
  agent-down) stop_kinds TERM agent ;;
  slurmrestd) step slurmrestd-delete-node rust_scenario slurmrestd-delete-node; echo "testbed: $PASSED passed, $FAILED failed"; [ $FAILED = 0 ] ;;
  scenarios) run_scenarios; echo "testbed: $PASSED passed, $FAILED failed"; [ $FAILED = 0 ] ;;
  latency) scenario_latency ;;
  cri) shift; cri "$@" ;;
  env) print_env ;;
  control-plane) [ "$CLUSTER" = 1 ] || fail "control-plane: cluster mode only (CLUSTER=1)"; step control-plane control_plane_up; [ $FAILED = 0 ] ;;
  cluster-up) [ "$CLUSTER" = 1 ] || fail "cluster-up: cluster mode only (CLUSTER=1)"; cluster_up; echo "testbed: $PASSED passed, $FAILED failed"; [ $FAILED = 0 ] ;;
  kubectl) [ "$CLUSTER" = 1 ] || fail "kubectl: cluster mode only (CLUSTER=1)"; shift; kc "$@" ;;
  down) phase_down ;;
  all) phase_all ;;
  *) sed -n '2,/^set -e/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
