#!/usr/bin/env bash
# images.sh: what the images under images/ are made of, read from their Dockerfiles.
#   images.sh BUILD_DIR [ARCH]     every file that an image copies out of a release build
#       (`target/$triple/release/NAME`) exists in BUILD_DIR (a build of the same packages, such as
#       tests/arm64/run.sh's debug one: the same names), and with ARCH (x86_64 or aarch64)
#       each such ELF file is one for ARCH. Catches a renamed or dropped artifact without Docker.
#       Each build stage installs its Rust toolchain from rust-toolchain.toml.
#   images.sh installs DOCKERFILE    "NAME PATH MODE" for each `install -D -m MODE
#       target/$triple/release/NAME /out/PATH` of its build stage: the file and where the final
#       image has it (the build copies /out/ to /)
#   images.sh config DOCKERFILE      the OCI image config (Entrypoint, Cmd, User, Env) of its final
#       stage, as JSON
# The images themselves are built from the Dockerfiles by buildah (tests/images-build.sh); the test
# bed's product-images scenario checks them against these two answers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

installs() {
  local re='install -D -m ([0-7]+) "?target/"?\$triple"?/release/([A-Za-z0-9_.+-]+)"? +/out(/[^ ]+)'
  grep -oE "$re" "$1" | sed -E "s|$re|\2 \3 \1|"
}

config() {  # the last ENTRYPOINT / CMD / USER of the file: the final stage's (exec form only)
  local f=$1 ep cmd user
  ep=$(grep -E '^ENTRYPOINT \[' "$f" | tail -1 | sed 's/^ENTRYPOINT //')
  cmd=$(grep -E '^CMD \[' "$f" | tail -1 | sed 's/^CMD //')
  user=$(awk '/^FROM /{u=""} /^USER /{u=$2} END{print u}' "$f")
  [ -n "$ep" ] || { echo "images.sh: $f has no ENTRYPOINT [...] (exec form)" >&2; exit 1; }
  printf '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s' "$ep"
  [ -z "$cmd" ] || printf ',"Cmd":%s' "$cmd"
  [ -z "$user" ] || printf ',"User":"%s"' "$user"
  printf ',"WorkingDir":"/"}\n'
}

case ${1:-} in
  installs) installs "${2:?usage: images.sh installs DOCKERFILE}"; exit ;;
  config) config "${2:?usage: images.sh config DOCKERFILE}"; exit ;;
esac

dir=${1:?usage: images.sh BUILD_DIR [x86_64|aarch64] | installs DOCKERFILE | config DOCKERFILE}
case ${2:-} in
  '') want= ;; x86_64) want=62 ;; aarch64) want=183 ;;
  *) echo "images.sh: unknown architecture $2" >&2; exit 2 ;;
esac
n=0 bad=0
for f in images/*.Dockerfile; do
  lines=$(installs "$f")
  # every file copied out of a release build must be installed into the image by that rule
  copied=$(grep -oE 'target/"?\$triple"?/release/[A-Za-z0-9_.+-]+' "$f" | sed 's|.*/||' | sort -u)
  [ "$copied" = "$(awk '{print $1}' <<< "$lines" | sort -u)" ] \
    || { echo "images.sh: $f copies [$(echo $copied)] out of the release build but installs [$(awk '{print $1}' <<< "$lines" | tr '\n' ' ')]as 'install -D -m MODE target/\$triple/release/NAME /out/PATH'" >&2; bad=$((bad + 1)); }
  config "$f" > /dev/null || bad=$((bad + 1))
  # the build stage compiles with the toolchain rust-toolchain.toml pins (the tests' own):
  # cross-build installs the one the file names, so the file must be there first
  copy=$(grep -nE '^COPY rust-toolchain\.toml ' "$f" | head -1 | cut -d: -f1 || true)
  tool=$(grep -nE '^RUN cross-build toolchain ' "$f" | head -1 | cut -d: -f1 || true)
  [ -n "$copy" ] && [ -n "$tool" ] && [ "$copy" -lt "$tool" ] \
    || { echo "images.sh: $f does not COPY rust-toolchain.toml before RUN cross-build toolchain" >&2; bad=$((bad + 1)); }
  while read -r name _ _; do
    [ -n "$name" ] || continue
    n=$((n + 1)); p=$dir/$name
    if [ ! -f "$p" ]; then echo "images.sh: $f copies $name, which $dir lacks" >&2; bad=$((bad + 1)); continue; fi
    if [ -n "$want" ] && [ "$(head -c4 "$p" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      m=$(od -An -j18 -N2 -tu2 "$p" | tr -d ' ')
      [ "$m" = "$want" ] || { echo "images.sh: $p has e_machine $m, not $want ($2)" >&2; bad=$((bad + 1)); }
    fi
  done <<< "$lines"
done
[ $n -gt 0 ] || { echo "images.sh: no file copied out of a release build in images/*.Dockerfile" >&2; exit 1; }
[ $bad = 0 ] || exit 1
echo "images.sh: the $n files the images copy are in $dir${2:+ and are $2}"
