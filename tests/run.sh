#!/usr/bin/env bash
# Every test of mockgpu, as CI runs them: formatting and lints; unit and integration tests (real
# FUSE mounts, real programs under the shim, the NRI plugin against a mock runtime); the same test
# binaries for aarch64, cross-built and run under qemu-user (tests/arm64/run.sh, Linux 6.7 or
# later); then the node test bed (the real containerd, runc and Slurm from Debian trixie, and from
# sid with containerd 2.x); then its cluster mode (a real Kubernetes node, built from the Go module
# proxy) on both.
# Needs root (FUSE mounts, mount namespaces, containers) and Go; installs the Debian packages it needs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" != 0 ]; then
  echo "tests/run.sh: run as root (sudo): the tests mount FUSE and start containers" >&2
  exit 1
fi
# CI runs from one fixed copy of its clone, /var/tmp/mockgpu-ci/src, whose target directory is
# the build cache of every CI run. Each CI run starts from a fresh clone, and cargo takes a source
# newer than its last build for a change, so in the clone itself every crate of ours would be
# built again (the dependencies alone come from cargo's registry cache). rsync copies into the
# copy only the files whose content differs (-c, no -t): the others keep the times of the builds
# that read them, and a changed file is newer than every build, as in a developer's checkout.
# One CI run at a time: two would write the same copy.
CI_COPY=/var/tmp/mockgpu-ci
if [ "${CI:-}" = true ] && [ "${MOCKGPU_CI_COPY:-}" != "$CI_COPY/src" ]; then
  bash tests/apt-ensure.sh rsync
  mkdir -p "$CI_COPY/src"
  t=$(date +%s)
  rsync -rlpc --delete --exclude=/target ./ "$CI_COPY/src/"
  echo "tests/run.sh: CI runs from $CI_COPY/src (changed files copied in $(( $(date +%s) - t )) s; its target/ is the build cache)"
  cd "$CI_COPY/src"
  MOCKGPU_CI_COPY=$CI_COPY/src exec bash tests/run.sh
fi
# Each step's header names the space left where the target directory and the caches live, so a
# full disk shows where it filled.
# Each step also says how long the one before it took, and the run ends with every step's time.
free_gib() { df -BG --output=avail "$1" | tail -1 | tr -dc 0-9; }
T_RUN=$(date +%s); T_STEP=$T_RUN; STEP_NAME=; TIMES=()
step_done() {
  [ -n "$STEP_NAME" ] || return 0
  local took=$(( $(date +%s) - T_STEP ))
  TIMES+=("$(printf '%5d s  %s' "$took" "$STEP_NAME")")
  echo "--- $took s: $STEP_NAME"
}
step() {
  step_done; STEP_NAME=$*; T_STEP=$(date +%s)
  echo; echo "=== $* ($(date +%T), $(free_gib .) GiB free here, $(free_gib /var/tmp) GiB in /var/tmp)"
}
summary() {
  step_done; STEP_NAME=
  echo; echo "=== step times"; printf '%s\n' "${TIMES[@]}"
  echo "total: $(( $(date +%s) - T_RUN )) s"
}
# CI builds everything once: incremental caches would only take disk.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
# Measured: from cold caches, the target directories (4.1 GB x86_64, 3.6 GB aarch64), the roots
# and caches in /var/tmp (12 GB, and 3 GB of the product images' in /var/tmp/mgimages) and the Go build cache while Kubernetes builds (5 GB); a run on
# warm caches took 8 GB of free space.
NEED_GIB=${NEED_GIB:-30}
FREE_GIB=$(free_gib .)
if [ "$FREE_GIB" -lt "$NEED_GIB" ]; then
  echo "tests/run.sh: warning: $FREE_GIB GiB free on $(df --output=target . | tail -1);" \
    "a run from cold caches takes about $NEED_GIB GiB (target directories, test bed roots)" >&2
fi

step "Debian packages the tests use"
bash tests/apt-ensure.sh fuse3 pciutils hwloc python3 gcc binutils util-linux debootstrap protobuf-compiler
[ -c /dev/fuse ] || { echo "tests/run.sh: /dev/fuse is missing" >&2; exit 1; }

# Three jobs run in the background from here, each in its own process group (setsid), so that a
# run that ends early stops them all, each with its log in /var/tmp; a later step that needs one
# waits for it (bg_wait), and makes what it needs itself if the job failed, so a failure there
# only costs time (its log is printed):
#   roots   the Debian roots of the aarch64 step and the test beds (debootstrap: mostly downloads)
#   k8s     the Kubernetes binaries, Helm and CoreDNS (Go, tests/build-k8s.sh)
#   images  the product images (tests/images-build.sh: a release build inside buildah)
# The two builds run at low priority: they take the cores the steps leave idle (waits on
# containers and pods, downloads), so that on a machine whose caches are cold they are done, or
# nearly, by the time the cluster mode needs them. Warm, each finds its cache within seconds.
declare -A BG_PID
# A session of its own is also a scheduling group of its own where the kernel has autogroups
# (/proc/sys/kernel/sched_autogroup_enabled): the CPU is shared between the groups first, and a
# process's nice counts only inside its group. A low job therefore lowers its group's nice too.
bg() {  # bg [--low] NAME COMMAND: COMMAND in the background, its output in /var/tmp/mockgpu-bg-NAME.log
  local low=
  if [ "$1" = --low ]; then low='{ echo 19 > /proc/self/autogroup; } 2> /dev/null || true; '; shift; fi
  setsid -w bash -c "set -e; $low$2" > "/var/tmp/mockgpu-bg-$1.log" 2>&1 < /dev/null &
  BG_PID[$1]=$!
}
bg_wait() {  # bg_wait NAME: waits for that job; prints how it ended and, if it failed, its log's end
  local rc=0 t; t=$(date +%s)
  wait "${BG_PID[$1]}" || rc=$?
  unset "BG_PID[$1]"   # its process group is gone; its number may be reused
  echo "tests/run.sh: background job $1 (log /var/tmp/mockgpu-bg-$1.log): exit $rc, waited $(( $(date +%s) - t )) s"
  [ $rc = 0 ] || tail -30 "/var/tmp/mockgpu-bg-$1.log"
}
trap 'for p in "${BG_PID[@]}"; do kill -- -"$p" 2> /dev/null || true; done' EXIT
bg roots 'bash tests/arm64/run.sh roots
  for suite in trixie sid; do
    SUITE=$suite bash tests/testbed/testbed.sh rootfs
    SUITE=$suite CLUSTER=1 bash tests/testbed/testbed.sh rootfs
  done'
bg --low k8s 'NICE=15 bash tests/build-k8s.sh > /dev/null'
# nice does not reach the build's RUN steps: runc starts each in a cgroup of its own, which weighs
# as much as everything else on the machine together; --cpu-shares 2 makes it take only idle CPU
bg --low images 'BUILDAH_ARGS="--cpu-shares 2" nice -n 15 bash tests/images-build.sh > /dev/null'

step "cargo fmt --check"
cargo fmt --all -- --check
step "rust-version covers every locked package"
bash tests/rust-version.sh
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo deny: licenses, duplicate versions, sources (tests/deny.sh)"
bash tests/deny.sh
step "no two modules use each other in a circle (tests/import-cycles.py)"
python3 tests/import-cycles.py $(git ls-files '*/lib.rs' '*/main.rs' | xargs -n1 dirname | sort -u)
# No separate build: `cargo test` builds every library and binary in debug (and fails on what
# `cargo build` would), and the later steps run those (tests/build-bins.sh then compiles only the
# few dependencies whose features differ without the dev-dependencies). No release build on this
# machine: the images' build stage makes the only one (tests/images-build.sh), and the latency
# figures of a release build come from bench/ (docs/performance.md).
step "cargo test"
cargo test --workspace
step "the NVML library against its consumers: nvml.h, pynvml, gpustat, nvitop, go-nvml (tests/nvml/run.sh)"
bash tests/nvml/run.sh
step "waiting for the roots (background job)"
bg_wait roots
step "aarch64: cross build, the architecture-dependent tests under qemu-user (tests/arm64/run.sh; cached in /var/tmp/mgarm64)"
bash tests/arm64/run.sh
step "node test bed"
bash tests/testbed/run.sh
step "node test bed on Debian sid (containerd 2.x)"
SUITE=sid bash tests/testbed/run.sh
step "Kubernetes binaries, Helm and CoreDNS (background job; tests/build-k8s.sh)"
bg_wait k8s
bash tests/build-k8s.sh
step "the Helm chart: lint, rendered value sets, schema, configuration reference"
bash tests/chart.sh
# built once for both cluster-mode runs; a tree whose images are built already costs the layer
# cache's checks only (tests/images-build.sh; its caches in /var/tmp/mgimages)
step "the product images from images/*.Dockerfile, as the README's docker build lines, by buildah (background job; tests/images-build.sh)"
bg_wait images
PRODUCT_IMAGES=$(bash tests/images-build.sh | tail -1)
export PRODUCT_IMAGES
step "node test bed, cluster mode (trixie: containerd 1.7)"
CLUSTER=1 bash tests/testbed/run.sh
step "node test bed, cluster mode on Debian sid (containerd 2.x)"
SUITE=sid CLUSTER=1 bash tests/testbed/run.sh
summary
