#!/usr/bin/env bash
# The mock libnvidia-ml.so.1 against real consumers of NVML's ABI: a C program compiled against
# NVIDIA's nvml.h (Debian trixie's libnvidia-ml-dev, CUDA 12.4) and pynvml (nvidia-ml-py from
# PyPI), over trees the agent renders for gb300, h100 and t4; and the library exports every
# function the header declares. Caches the header and the Python environment in
# /var/tmp/mockgpu-nvml. Needs no root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CACHE=${NVML_CACHE:-/var/tmp/mockgpu-nvml}
DEB=libnvidia-ml-dev_12.4.127~12.4.1-2_amd64.deb
DEB_SHA256=6f796a688ee18e21495f4b9a28fe1f9b67e3a95f709880d751eb4c8d483bbfbb
mkdir -p "$CACHE"

# nvml.h: the header is the same on every architecture; the amd64 package carries it.
HEADER=$CACHE/include/nvml.h
if [ ! -f "$HEADER" ]; then
  curl -fsSL -o "$CACHE/$DEB" "http://deb.debian.org/debian/pool/non-free/n/nvidia-cuda-toolkit/$DEB"
  echo "$DEB_SHA256  $CACHE/$DEB" | sha256sum -c --quiet
  dpkg-deb -x "$CACHE/$DEB" "$CACHE/deb"
  mkdir -p "$CACHE/include"
  cp "$CACHE/deb/usr/include/nvml.h" "$HEADER"
  rm -rf "$CACHE/deb" "${CACHE:?}/$DEB"
fi
if [ ! -x "$CACHE/venv/bin/python" ]; then
  python3 -m venv "$CACHE/venv"
  "$CACHE/venv/bin/pip" install --quiet nvidia-ml-py
fi

cargo build --quiet --release -p mockgpu-nvml
cargo build --quiet -p mockgpu-agent
LIB=target/release/libnvidia_ml.so
AGENT=target/debug/mockgpu-agent
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Consumers load the library by its SONAME.
mkdir -p "$WORK/lib"
cp "$LIB" "$WORK/lib/libnvidia-ml.so.1"

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

for profile in gb300 h100 t4; do
  root=$WORK/$profile
  "$AGENT" render --profile "$profile" --node-name node-1 --sysfs agent/tests/fixtures/two-socket --out "$root" >/dev/null
  bus=$(ls "$root/proc/driver/nvidia/gpus" | head -1)
  for b in $(ls "$root/proc/driver/nvidia/gpus"); do
    minor=$(sed -n 's/^Device Minor:\s*//p' "$root/proc/driver/nvidia/gpus/$b/information")
    if [ "$minor" = 0 ]; then bus=$b; fi
  done
  info=$root/proc/driver/nvidia/gpus/$bus/information
  data=$root/nvml/gpus/$bus
  value() { sed -n "s/^$1:\s*//p" "$2"; }
  links=$(value "NVLink Remote" "$data" | tr ',' '\n' | grep -c . || true)
  fabric=0
  if grep -q "^Fabric Cluster UUID:" "$data"; then fabric=1; fi
  MOCKFS_ROOT=$root LD_LIBRARY_PATH=$WORK/lib "$WORK/abi" "$(value Model "$info")" "$bus" \
    "$(value "Memory Total" "$data")" "$(value "Memory Reserved" "$data")" \
    "$(value "Memory Clock" "$data")" "$(value Architecture "$data")" "$(value Brand "$data")" \
    "$links" "$fabric"
  MOCKFS_ROOT=$root LD_LIBRARY_PATH=$WORK/lib "$CACHE/venv/bin/python" tests/nvml/pynvml_check.py \
    "api/profiles/$profile.yaml"
done
echo "tests/nvml/run.sh: all passed"
