#!/usr/bin/env bash
# build-bins.sh [PROFILE]: builds what the test bed runs and the NVML consumers load, and nothing
# else: the agent (which carries the shim and the NVML library), the shim on its own, the NVML
# library on its own (tests/nvml/run.sh), the controller and the test bed's CRI client. PROFILE is
# `dev` (default: target/debug, the build `cargo test` has made of the same crates, so CI compiles
# only the few dependencies whose features differ) or `release` (target/release: the latency
# figures in docs/performance.md come from release builds, bench/ builds its own). Prints the
# output directory on its last line. One list, so that every caller builds the same feature set
# and the second finds everything up to date.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile=${1:-dev}
cargo build --profile "$profile" -p mockgpu-agent -p mockfs-shim -p mockgpu-nvml -p mockgpu-controller -p mockgpu-testbed >&2
echo "$(realpath -m "${CARGO_TARGET_DIR:-target}")/$([ "$profile" = dev ] && echo debug || echo "$profile")"
