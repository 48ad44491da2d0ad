#!/usr/bin/env bash
# release-build.sh [PROFILE]: builds what the images copy and the test bed runs, and nothing
# else: the agent (which carries the shim and the NVML library), the shim on its own (the agent
# image copies it), the NVML library on its own (tests/nvml/run.sh), the controller and the test
# bed's CRI client. One list, so tests/run.sh's release step and
# tests/testbed/run.sh build the same feature set and the second finds everything up to date.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec cargo build --profile "${1:-release}" -p mockgpu-agent -p mockfs-shim -p mockgpu-nvml -p mockgpu-controller -p mockgpu-testbed
