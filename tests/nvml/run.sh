#!/usr/bin/env bash
# The mock libnvidia-ml.so.1 against real consumers of NVML's ABI, none of them ours, over trees
# the agent renders for gb300, h100 and t4: a C program compiled against NVIDIA's nvml.h (Debian
# trixie's libnvidia-ml-dev, CUDA 12.4); pynvml_check.py with pynvml from PyPI (nvidia-ml-py) and
# with Debian bookworm's python3-pynvml under Debian's python3; gpustat and nvitop from PyPI
# (tools_check.py); a Go program on NVIDIA's go-nvml (go/). And the library exports every
# function the header declares. tests/nvml/fetch.sh caches the downloads and the Python
# environments in /var/tmp/mockgpu-nvml, tests/nvml/go/build.sh the Go caches. Needs no root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CACHE=${NVML_CACHE:-/var/tmp/mockgpu-nvml}
PROFILES="gb300 h100 t4"
bash tests/nvml/fetch.sh "$CACHE"
HEADER=$CACHE/include/nvml.h

# The debug build of `cargo test`'s crates (tests/build-bins.sh; in CI only a few dependencies).
OUT=$(bash tests/build-bins.sh | tail -1)
LIB=$OUT/libnvidia_ml.so
AGENT=$OUT/mockgpu-agent
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Consumers load the library by its SONAME.
mkdir -p "$WORK/lib"
cp "$LIB" "$WORK/lib/libnvidia-ml.so.1"
for profile in $PROFILES; do
  "$AGENT" render --profile "$profile" --node-name node-1 --sysfs agent/tests/fixtures/two-socket \
    --out "$WORK/$profile" >/dev/null
done
value() { sed -n "s/^$1:\s*//p" "$2"; }
# each FUNCTION: calls FUNCTION once per profile, with $profile, $root (its tree) and the
# library served.
each() {
  for profile in $PROFILES; do
    root=$WORK/$profile
    MOCKFS_ROOT=$root LD_LIBRARY_PATH=$WORK/lib "$1"
  done
}

echo "== every function nvml.h declares is exported"
grep -oE 'DECLDIR +(char\* +)?nvml[A-Za-z0-9_]+ *\(' "$HEADER" | grep -oE 'nvml[A-Za-z0-9_]+' | sort -u >"$WORK/declared"
nm -D --defined-only "$LIB" | awk '{print $3}' | sort -u >"$WORK/exported"
if ! diff "$WORK/declared" "$WORK/exported"; then
  echo "tests/nvml/run.sh: the exports differ from the header's functions (< missing, > extra)" >&2
  exit 1
fi
echo "$(wc -l <"$WORK/declared") functions declared, all exported, nothing else"

echo "== abi.c against nvml.h"
cc -std=c11 -Wall -Werror -I"$CACHE/include" -o "$WORK/abi" tests/nvml/abi.c -L"$WORK/lib" -l:libnvidia-ml.so.1
# abi.c takes the values of the GPU of minor 0.
abi() {
  local info bus data links fabric=0
  info=$(grep -l '^Device Minor:\s*0$' "$root"/proc/driver/nvidia/gpus/*/information)
  bus=$(basename "$(dirname "$info")")
  data=$root/nvml/gpus/$bus
  links=$(value "NVLink Remote" "$data" | tr ',' '\n' | grep -c . || true)
  if grep -q "^Fabric Cluster UUID:" "$data"; then fabric=1; fi
  "$WORK/abi" "$(value Model "$info")" "$bus" \
    "$(value "Memory Total" "$data")" "$(value "Memory Reserved" "$data")" \
    "$(value "Memory Clock" "$data")" "$(value Architecture "$data")" "$(value Brand "$data")" \
    "$links" "$fabric"
}
each abi

echo "== pynvml: $(grep -h '^nvidia-ml-py==' tests/nvml/requirements-pynvml.txt) (PyPI)"
pynvml_pypi() { "$CACHE/venv/bin/python" tests/nvml/pynvml_check.py "api/profiles/$profile.yaml"; }
each pynvml_pypi

# Debian's python3 with the package's directory first on its path, not the user's site.
DEBIAN_PYNVML=$CACHE/debian-pynvml/usr/lib/python3/dist-packages
echo "== pynvml: Debian bookworm's python3-pynvml $(value Version "$DEBIAN_PYNVML"/nvidia_ml_py-*.egg-info)" \
  "under /usr/bin/python3 (fabric info left out: its struct predates the header's)"
pynvml_debian() {
  PYTHONPATH=$DEBIAN_PYNVML /usr/bin/python3 -s tests/nvml/pynvml_check.py --without-fabric \
    "api/profiles/$profile.yaml"
}
each pynvml_debian

echo "== gpustat and nvitop: $(grep -hE '^(gpustat|nvitop)==' tests/nvml/requirements-tools.txt | paste -sd' ') (PyPI)"
# -B: tools_check.py imports pynvml_check.py; no __pycache__ is left beside them.
tools() { "$CACHE/tools/bin/python" -B tests/nvml/tools_check.py "api/profiles/$profile.yaml"; }
each tools

echo "== go-nvml $(awk '$1 == "require" {print $3}' tests/nvml/go/go.mod): devices, an Xid wait's timeout, an Xid event"
bash tests/nvml/go/build.sh "$CACHE" "$WORK/nvmllist"
go_nvml() { bash tests/nvml/go/check.sh "$WORK/nvmllist" "$root" "api/profiles/$profile.yaml"; }
each go_nvml
echo "tests/nvml/run.sh: all passed"
