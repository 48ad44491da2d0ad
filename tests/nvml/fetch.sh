#!/usr/bin/env bash
# fetch.sh CACHE: makes in CACHE what tests/nvml/run.sh's consumers need, each once, so that a
# rerun needs no network: NVIDIA's nvml.h, Debian bookworm's python3-pynvml (both .deb files
# pinned by SHA-256 and unpacked, nothing installed on the system) and the Python environments
# of requirements-*.txt (made again when the file changes). go/build.sh caches go-nvml.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
CACHE=$1
mkdir -p "$CACHE"

# deb PATH SHA256 DIR: unpacks the Debian pool's file PATH into DIR.
deb() {
  local file=$CACHE/${1##*/}
  [ -d "$3" ] && return 0
  curl -fsSL -o "$file" "http://deb.debian.org/debian/pool/$1"
  if ! echo "$2  $file" | sha256sum -c --quiet; then
    echo "tests/nvml/fetch.sh: $1: not the SHA-256 pinned here" >&2
    exit 1
  fi
  dpkg-deb -x "$file" "$3.tmp"
  mv "$3.tmp" "$3"
  rm -f "$file"
}

# The header is the same on every architecture; the amd64 package carries it.
if [ ! -f "$CACHE/include/nvml.h" ]; then
  deb non-free/n/nvidia-cuda-toolkit/libnvidia-ml-dev_12.4.127~12.4.1-2_amd64.deb \
    6f796a688ee18e21495f4b9a28fe1f9b67e3a95f709880d751eb4c8d483bbfbb "$CACHE/deb"
  mkdir -p "$CACHE/include"
  cp "$CACHE/deb/usr/include/nvml.h" "$CACHE/include/nvml.h"
  rm -rf "$CACHE/deb"
fi

# The bindings are pure Python: run.sh puts their directory on Debian's python3's path.
deb contrib/p/python-pynvml/python3-pynvml_11.525.112-1_amd64.deb \
  1075f7f1ec460d6da28923e7d2f794927103ecbefaa5ee263c4757b36d4c0d0c "$CACHE/debian-pynvml"

# venv DIR REQUIREMENTS: a Python environment with these pinned packages.
venv() {
  [ -x "$1/bin/python" ] || python3 -m venv "$1"
  if ! cmp -s "$2" "$1/requirements.txt"; then
    "$1/bin/pip" install --quiet --disable-pip-version-check -r "$2"
    cp "$2" "$1/requirements.txt"
  fi
}
venv "$CACHE/venv" requirements-pynvml.txt
venv "$CACHE/tools" requirements-tools.txt

