#!/bin/sh
# NRI plugin benchmark: CreateContainer round trips against the mock runtime (p50/p99,
# throughput on one core, CPU time per call) and the idle RSS of the mockgpu-nri binary.
# Runs pinned to CPU 0 with normal scheduling; as root it runs a second time under SCHED_FIFO,
# which shows the plugin's own tail latency when a shared machine is busy with other work.
# Output goes to stdout and bench/out/nri.txt.
set -eu
cd "$(dirname "$0")/.."
mkdir -p bench/out
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/nri}"
cargo bench -p mockgpu-nri --bench create_container --no-run
run() { "$@" cargo bench -q -p mockgpu-nri --bench create_container 2>&1; }
{
    echo "== normal scheduling, CPU 0 (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    run taskset -c 0
    if [ "$(id -u)" = 0 ]; then
        echo "== SCHED_FIFO, CPU 0 (isolated from other load)"
        run chrt -f 10 taskset -c 0
    fi
} | tee bench/out/nri.txt
