#!/bin/bash
# run.sh - CI entry point of the node test bed: host tools, cargo build, then `testbed.sh all`
# (rootfs from nothing or reused, all scenarios, teardown). Exits non-zero when any step fails.
# CLUSTER=1: also the Kubernetes binaries (tests/build-k8s.sh, cached), then the cluster mode.
# Needs root, /dev/fuse, unshare/pivot_root (and Go for CLUSTER=1). Env: as testbed.sh; CARGO_TARGET_DIR (target);
# TESTBED_PROFILE (dev: the debug build `cargo test` has made, tests/build-bins.sh; `release` for
# the latency figures of a release build).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
T0=$(date +%s)

# host tools (Debian packages): rootfs bootstrap, FUSE, protoc for the CRI bindings
# (cluster mode: openssl for the PKI, curl for etcd's health)
# shellcheck disable=SC2046 # an optional word
bash "$REPO/tests/apt-ensure.sh" debootstrap fuse3 protobuf-compiler util-linux mount $([ "${CLUSTER:-0}" = 1 ] && echo openssl curl)

PROFILE=${TESTBED_PROFILE:-dev}
echo "run.sh: cargo build --profile $PROFILE (tests/build-bins.sh: agent, shim, controller, test bed)"
tb=$(date +%s)
OUT=$(bash "$REPO/tests/build-bins.sh" "$PROFILE" | tail -1)
echo "TIMING cargo-build: $(( $(date +%s) - tb )) s"

if [ "${CLUSTER:-0}" = 1 ] && [ -z "${K8S_BIN:-}" ]; then
  tb=$(date +%s)
  K8S_BIN=$(bash "$REPO/tests/build-k8s.sh" | tail -1)
  export K8S_BIN
  echo "TIMING k8s-binaries: $(( $(date +%s) - tb )) s ($K8S_BIN)"
fi

export CRI_BIN=${CRI_BIN:-$OUT/mgtb-cri}
export AGENT_BIN=${AGENT_BIN:-$OUT/mockgpu-agent}
export CONTROLLER_BIN=${CONTROLLER_BIN:-$OUT/mockgpu-controller}
echo "run.sh: host tools and builds took $(( $(date +%s) - T0 )) s; running the test bed"
exec bash "$HERE/testbed.sh" all
