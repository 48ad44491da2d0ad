#!/bin/bash
# libmockfs.so benchmark, side by side in one run (rounds interleaved, best of each kept):
#  1. overhead on paths OUTSIDE the prefixes, shim active vs. no shim: stat() and open()+close()
#     loops over ordinary files, and `find /usr` (openat/fstatat relative to directory fds);
#     target ratio <= 1.03.
#  2. reading a redirected file (/proc/driver/nvidia/version through the shim) vs. reading the
#     same file directly under the mock root without the shim; target ratio <= 1.2.
# Each workload is reported by wall-clock time and by CPU time (user + system) of the process.
# On a busy machine both drift by several per cent between runs, so the stat()/open() overhead is
# also measured inside one process under the shim, alternating blocks of 1000 calls through the
# hook and straight into libc's own function ("same process" rows): the most precise figure.
# Usage: bench/shim.sh [ROUNDS]  (env: N = loop iterations, default 1000000)
# Output goes to stdout and bench/out/shim.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
N=${N:-1000000}
TARGET=${CARGO_TARGET_DIR:-target/shim}
mkdir -p bench/out
CARGO_TARGET_DIR=$TARGET cargo build --release -q -p mockfs-shim
SHIM=$(realpath "$TARGET/release/libmockfs.so")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -O2 -o "$WORK/shim_bench" bench/shim_bench.c -ldl

# A small mock tree, as the agent would serve it.
ROOT=$WORK/fs
mkdir -p "$ROOT/proc/driver/nvidia/gpus/0008:06:00.0" "$ROOT/sys/bus/pci/devices"
printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.173.02  Release Build\n' \
    >"$ROOT/proc/driver/nvidia/version"
echo /sys/devices/pci0008:06 >"$ROOT/prefixes"

OUTSIDE=(/etc/hostname /usr/bin/ls /usr/lib/os-release /etc/passwd)
with() { # plain|shim COMMAND...
    local mode=$1
    shift
    if [ "$mode" = shim ]; then
        env LD_PRELOAD="$SHIM" MOCKFS_ROOT="$ROOT" "$@"
    else
        "$@"
    fi
}
find_ms() { # plain|shim -> "WALL_MS CPU_MS"
    local TIMEFORMAT='%3R %3U %3S' t
    t=$({ time with "$1" find /usr >/dev/null; } 2>&1)
    awk '{ printf "%.1f %.1f\n", $1 * 1000, ($2 + $3) * 1000 }' <<<"$t"
}

declare -A WALL CPU
record() { # KEY "WALL CPU"
    local w c
    read -r w c <<<"$2"
    WALL[$1]+="$w "
    CPU[$1]+="$c "
}
find /usr >/dev/null # warm the dentry cache
for ((i = 0; i < ROUNDS; i++)); do
    # Alternate which side goes first, so drift in machine load hits both alike.
    if ((i % 2)); then order="shim plain"; else order="plain shim"; fi
    for mode in $order; do
        record "stat_$mode" "$(with "$mode" "$WORK/shim_bench" stat "$N" "${OUTSIDE[@]}")"
        record "open_$mode" "$(with "$mode" "$WORK/shim_bench" open "$N" "${OUTSIDE[@]}")"
        record "find_$mode" "$(find_ms "$mode")"
    done
    record ab_stat "$(with shim "$WORK/shim_bench" ab-stat "$N" "${OUTSIDE[@]}")"
    record ab_open "$(with shim "$WORK/shim_bench" ab-open "$N" "${OUTSIDE[@]}")"
    record read_plain "$("$WORK/shim_bench" read "$N" "$ROOT/proc/driver/nvidia/version")"
    record read_shim "$(with shim "$WORK/shim_bench" read "$N" /proc/driver/nvidia/version)"
done
best() { tr ' ' '\n' <<<"$1" | grep . | sort -g | head -1; }
row() { # LABEL KEY
    awk -v l="$1" -v wp="$(best "${WALL[$2_plain]}")" -v ws="$(best "${WALL[$2_shim]}")" \
        -v cp="$(best "${CPU[$2_plain]}")" -v cs="$(best "${CPU[$2_shim]}")" \
        'BEGIN { printf "%-34s %9.1f %9.1f %6.3f   %9.1f %9.1f %6.3f\n", l, wp, ws, ws / wp, cp, cs, cs / cp }'
}
{
    echo "libmockfs.so benchmark ($(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)," \
        "$ROUNDS rounds, best of each, N=$N)"
    printf '%-34s %9s %9s %6s   %9s %9s %6s\n' workload "wall" "" "" "cpu" "" ""
    printf '%-34s %9s %9s %6s   %9s %9s %6s\n' "" "no shim" shim ratio "no shim" shim ratio
    row "stat() outside, ns/op" stat
    row "open()+close() outside, ns/op" open
    row "find /usr, ms" find
    row "read redirected vs direct, ns/op" read
    for k in stat open; do
        # ab_* hold "DIRECT HOOKED" pairs: the ratio of the sums over all rounds.
        awk -v l="$k() same process, ns/op" -v d="${WALL[ab_$k]}" -v h="${CPU[ab_$k]}" 'BEGIN {
            n = split(d, ds, " "); split(h, hs, " ")
            for (i = 1; i <= n; i++) { sd += ds[i]; sh += hs[i] }
            printf "%-34s %9.1f %9.1f %6.3f   (hook vs libc, %+.1f ns per call)\n", l, sd / n, sh / n, sh / sd, (sh - sd) / n
        }'
    done
    echo "targets: ratio <= 1.03 for the three outside workloads; <= 1.2 for the redirected read"
    echo "(its 'no shim' column opens <root>/proc/driver/nvidia/version directly)"
} | tee bench/out/shim.txt
