#!/bin/sh
# cross-build.sh: the build stage shared by images/*.Dockerfile (Debian trixie, run on the build
# machine's own platform, so nothing is emulated while compiling).
#   cross-build.sh toolchain TARGETARCH BUILDARCH   the GNU toolchain for TARGETARCH, and the Rust
#       toolchain that ./rust-toolchain.toml pins (the one the tests use) with the standard
#       library for TARGETARCH, installed by rustup-init (pinned by version and checksum) into
#       $RUSTUP_HOME and $CARGO_HOME
#   cross-build.sh cargo TARGETARCH PACKAGE...      cargo build --release of the packages for
#       TARGETARCH, into target/<triple>/release; prints the triple. target/ may be a cache that
#       builds of other trees (older or newer) have written: see fresh_by_content
set -eu
RUSTUP_VERSION=1.28.2
triple() {  # triple ARCH: "<rust triple> <gnu prefix> <gcc package suffix>"
  case $1 in
    amd64) echo x86_64-unknown-linux-gnu x86_64-linux-gnu x86-64-linux-gnu ;;
    arm64) echo aarch64-unknown-linux-gnu aarch64-linux-gnu aarch64-linux-gnu ;;
    *) echo "cross-build.sh: unsupported architecture $1" >&2; exit 1 ;;
  esac
}
rustup_init_sha256() {  # of rustup-init $RUSTUP_VERSION for the build machine's triple
  case $1 in
    x86_64-unknown-linux-gnu) echo 20a06e644b0d9bd2fbdbfd52d42540bdde820ea7df86e92e533c073da0cdd43c ;;
    aarch64-unknown-linux-gnu) echo e3853c5a252fca15252d07cb23a1bdd9377a8c6f3efa01531109281ae47f841c ;;
  esac
}
# fresh_by_content KEY: cargo takes a crate's outputs for current when no source file is newer
# than they are; in a target directory that builds of other trees share (a cache mount), a file
# of an older tree with other content would pass for built. So the file times are set from
# content: a file as the last build of this package set (KEY) saw it gets an old time, any other
# file the present one. target/.sources/KEY.sha256 lists the files (sha256sum) that every output
# of that set was built from; before each build every set's list loses the lines this tree
# changes (the sets share outputs, and this build, even one that fails, may remake them), and a
# build that succeeds leaves its tree as its own set's list. No list: every file is new.
S=target/.sources
fresh_by_content() {
  mkdir -p "$S"
  find . -path ./target -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum > "$S/tree"
  m=$S/$1.sha256
  [ -f "$m" ] || : > "$m"
  for l in "$S"/*.sha256; do
    awk 'FILENAME == ARGV[1] {t[$0] = 1; next} $0 in t' "$S/tree" "$l" > "$l.new" && mv "$l.new" "$l"
  done
  # sha256sum's lines: 64 hex digits, two spaces, the name
  awk -v same=1 'FILENAME == ARGV[1] {k[$0] = 1; next} ($0 in k) == same {print substr($0, 67)}' "$m" "$S/tree" \
    | tr '\n' '\0' | xargs -0 -r touch -d @946684800
  awk -v same=0 'FILENAME == ARGV[1] {k[$0] = 1; next} ($0 in k) == same {print substr($0, 67)}' "$m" "$S/tree" \
    | tr '\n' '\0' | xargs -0 -r touch
}

case ${1:-} in
  toolchain)
    [ -f rust-toolchain.toml ] || { echo "cross-build.sh: run it where rust-toolchain.toml is" >&2; exit 1; }
    tr=$(triple "$2") && build=$(triple "$3") || exit 1
    set -- "$2" "$3" $tr ${build%% *}
    if [ "$1" = "$2" ]; then cross="gcc libc6-dev"
    else cross="gcc gcc-$5 libc6-dev-$1-cross"; fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates curl $cross
    rm -rf /var/lib/apt/lists/*
    init=/tmp/rustup-init
    curl --proto '=https' --tlsv1.2 -fsSL -o "$init" \
      "https://static.rust-lang.org/rustup/archive/$RUSTUP_VERSION/$6/rustup-init"
    echo "$(rustup_init_sha256 "$6")  $init" | sha256sum -c -
    chmod +x "$init"
    "$init" -y --quiet --no-modify-path --profile minimal --default-toolchain none
    rm "$init"
    # Without a name, rustup installs the toolchain that rust-toolchain.toml names, with its
    # components; the target's standard library goes to that toolchain.
    rustup toolchain install
    rustup target add "$3"
    rustc --version ;;
  cargo)
    tr=$(triple "$2") || exit 1
    shift 2; set -- $tr "$@"
    t=$1 gnu=$2; shift 3
    export "CARGO_TARGET_$(echo "$t" | tr a-z- A-Z_)_LINKER=$gnu-gcc"
    key=$(echo "$t $*" | tr ' ' '+')
    fresh_by_content "$key"
    for p in "$@"; do set -- "$@" -p "$p"; shift; done
    cargo build --locked --release --target "$t" "$@" >&2
    cp "$S/tree" "$S/$key.sha256"
    echo "$t" ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
