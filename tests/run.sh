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
# Each step's header names the space left where the target directory and the caches live, so a
# full disk shows where it filled.
free_gib() { df -BG --output=avail "$1" | tail -1 | tr -dc 0-9; }
step() { echo; echo "=== $* ($(date +%T), $(free_gib .) GiB free here, $(free_gib /var/tmp) GiB in /var/tmp)"; }
# CI builds everything once: incremental caches would only take disk.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
# Measured: from cold caches, the target directories (4.1 GB x86_64, 3.6 GB aarch64), the roots
# and caches in /var/tmp (12 GB) and the Go build cache while Kubernetes builds (5 GB); a run on
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

step "cargo fmt --check"
cargo fmt --all -- --check
step "rust-version covers every locked package"
bash tests/rust-version.sh
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo build (debug)"
cargo build --workspace
step "cargo build --release"
cargo build --workspace --release
step "the files the images copy (x86_64)"
bash tests/images.sh "${CARGO_TARGET_DIR:-target}/release" x86_64
step "cargo test"
cargo test --workspace
step "aarch64: cross build, every test binary under qemu-user (tests/arm64/run.sh; cached in /var/tmp/mgarm64)"
bash tests/arm64/run.sh
step "node test bed"
bash tests/testbed/run.sh
step "node test bed on Debian sid (containerd 2.x)"
SUITE=sid bash tests/testbed/run.sh
step "Kubernetes binaries and Helm (tests/build-k8s.sh; cached)"
bash tests/build-k8s.sh
step "the Helm chart: lint, rendered value sets, schema, configuration reference"
bash tests/chart.sh
step "node test bed, cluster mode (trixie: containerd 1.7)"
CLUSTER=1 bash tests/testbed/run.sh
step "node test bed, cluster mode on Debian sid (containerd 2.x)"
SUITE=sid CLUSTER=1 bash tests/testbed/run.sh
