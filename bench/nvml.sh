#!/bin/bash
# libnvidia-ml.so.1 benchmark: CPU time of nvmlInit to the first device name (the whole tree read
# and parsed; target <= 1 ms) and of one getter on a cached handle (target <= 1 us), for gb300 and
# h100 trees the agent renders onto the two-socket fixture host, and the resident memory (VmRSS)
# the library adds once loaded and once it has read the tree. A fresh process per round.
# Usage: bench/nvml.sh [ROUNDS]  (env: N = getter calls per round, default 1000000)
# Output goes to stdout and bench/out/nvml.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
N=${N:-1000000}
mkdir -p bench/out
cargo build --release -q -p mockgpu-nvml
cargo build -q -p mockgpu-agent
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/lib"
cp target/release/libnvidia_ml.so "$WORK/lib/libnvidia-ml.so.1"
cc -O2 -o "$WORK/nvml_bench" bench/nvml_bench.c -ldl
{
    echo "== $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $ROUNDS rounds, N=$N"
    for profile in gb300 h100; do
        target/debug/mockgpu-agent render --profile "$profile" --node-name bench \
            --sysfs agent/tests/fixtures/two-socket --out "$WORK/$profile" >/dev/null
        for _ in $(seq "$ROUNDS"); do
            MOCKFS_ROOT=$WORK/$profile LD_LIBRARY_PATH=$WORK/lib "$WORK/nvml_bench" "$N"
        done
    done
} | tee bench/out/nvml.txt
