#!/bin/sh
# cross-build.sh: the build stage shared by images/*.Dockerfile (Debian trixie, run on the build
# machine's own platform, so nothing is emulated while compiling).
#   cross-build.sh toolchain TARGETARCH BUILDARCH   Debian's Rust (rustc-web, with the standard
#       library for TARGETARCH) and the GNU toolchain for TARGETARCH
#   cross-build.sh cargo TARGETARCH PACKAGE...      cargo build --release of the packages for
#       TARGETARCH, into target/<triple>/release; prints the triple
set -eu
triple() {  # triple TARGETARCH: "<rust triple> <gnu prefix> <gcc package suffix>"
  case $1 in
    amd64) echo x86_64-unknown-linux-gnu x86_64-linux-gnu x86-64-linux-gnu ;;
    arm64) echo aarch64-unknown-linux-gnu aarch64-linux-gnu aarch64-linux-gnu ;;
    *) echo "cross-build.sh: unsupported TARGETARCH $1" >&2; exit 1 ;;
  esac
}
case ${1:-} in
  toolchain)
    tr=$(triple "$2") || exit 1
    set -- "$2" "$3" $tr
    if [ "$1" = "$2" ]; then cross="gcc libc6-dev"
    else cross="gcc gcc-$5 libc6-dev-$1-cross"; dpkg --add-architecture "$1"; fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates rustc-web cargo-web "libstd-rust-web-dev:$1" $cross
    rm -rf /var/lib/apt/lists/* ;;
  cargo)
    tr=$(triple "$2") || exit 1
    shift 2; set -- $tr "$@"
    t=$1 gnu=$2; shift 3
    export "CARGO_TARGET_$(echo "$t" | tr a-z- A-Z_)_LINKER=$gnu-gcc"
    for p in "$@"; do set -- "$@" -p "$p"; shift; done
    cargo build --locked --release --target "$t" "$@" >&2
    echo "$t" ;;
  *) sed -n '2,7p' "$0" >&2; exit 2 ;;
esac
