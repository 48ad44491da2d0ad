#!/usr/bin/env bash
# Every test of mockgpu, as CI runs them: formatting and lints; unit and integration tests (real
# FUSE mounts, real programs under the shim, the NRI plugin against a mock runtime); the same
# for aarch64 under qemu-user (tests/arm64/run.sh); then the node test bed (the real containerd,
# runc and Slurm from Debian trixie).
# Needs root (FUSE mounts, mount namespaces, containers); installs the Debian packages it needs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" != 0 ]; then
  echo "tests/run.sh: run as root (sudo): the tests mount FUSE and start containers" >&2
  exit 1
fi
step() { echo; echo "=== $* ($(date +%T))"; }

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
step "aarch64: cross build, every test binary under qemu-user in an arm64 root"
bash tests/arm64/run.sh
step "node test bed"
bash tests/testbed/run.sh
