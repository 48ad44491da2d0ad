#!/bin/bash
# nvidia-smi over the mock NVML: wall-clock and CPU time (user + system of the child, as bash's
# `time` reads them from getrusage) of `nvidia-smi -L` and `nvidia-smi -q` on a gb300 tree
# rendered onto the agent's two-socket fixture host. Each command runs RUNS times; reported are
# the minimum, median and maximum. Target: -L <= 10 ms of CPU.
# Usage: bench/nvidia-smi.sh [RUNS]   (default 20; env PROFILE, default gb300)
# Output goes to stdout and bench/out/nvidia-smi.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-20}
PROFILE=${PROFILE:-gb300}
TARGET=${CARGO_TARGET_DIR:-target}
mkdir -p bench/out
# The library and nvidia-smi as shipped (release); the agent only renders the tree (debug will do).
CARGO_TARGET_DIR=$TARGET cargo build --release -q -p mockgpu-nvml
CARGO_TARGET_DIR=$TARGET cargo build -q -p mockgpu-agent
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$TARGET/debug/mockgpu-agent" render --profile "$PROFILE" --node-name bench \
    --sysfs agent/tests/fixtures/two-socket --out "$WORK/root" >/dev/null
mkdir "$WORK/lib"
ln -s "$(realpath "$TARGET/release/libnvidia_ml.so")" "$WORK/lib/libnvidia-ml.so.1"
SMI=$(realpath "$TARGET/release/nvidia-smi")

smi() { env LD_LIBRARY_PATH="$WORK/lib" MOCKFS_ROOT="$WORK/root" "$SMI" "$@"; }
smi -L >/dev/null # warm the page cache

stats() { # VALUES... -> "min MIN median MED max MAX"
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
        printf "min %6.2f  median %6.2f  max %6.2f", v[1], v[int((NR + 1) / 2)], v[NR] }'
}

{
    echo "nvidia-smi on $PROFILE ($(nproc) CPUs, $RUNS runs each; $(uname -m))"
    for args in "-L" "-q" ""; do
        walls=() cpus=()
        for ((i = 0; i < RUNS; i++)); do
            TIMEFORMAT='%3R %3U %3S'
            t=$({ time smi $args >/dev/null; } 2>&1)
            read -r w u s <<<"$t"
            walls+=("$(awk -v w="$w" 'BEGIN { print w * 1000 }')")
            cpus+=("$(awk -v u="$u" -v s="$s" 'BEGIN { print (u + s) * 1000 }')")
        done
        printf 'nvidia-smi %-7s wall ms: %s   CPU ms: %s\n' "${args:-(table)}" "$(stats "${walls[@]}")" \
            "$(stats "${cpus[@]}")"
    done
} | tee bench/out/nvidia-smi.txt
