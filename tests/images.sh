#!/usr/bin/env bash
# images.sh RELEASE_DIR [ARCH]: every file that an image under images/ copies out of a release
# build (`target/$triple/release/NAME` in its Dockerfile) exists in RELEASE_DIR, and with ARCH
# (x86_64 or aarch64) each such ELF file is one for ARCH. Catches a renamed or dropped artifact
# without building the image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:?usage: images.sh RELEASE_DIR [x86_64|aarch64]}
case ${2:-} in
  '') want= ;; x86_64) want=62 ;; aarch64) want=183 ;;
  *) echo "images.sh: unknown architecture $2" >&2; exit 2 ;;
esac
n=0 bad=0
for f in images/*.Dockerfile; do
  for name in $(grep -oE 'target/"?\$triple"?/release/[A-Za-z0-9_.+-]+' "$f" | sed 's|.*/||' | sort -u); do
    n=$((n + 1)); p=$dir/$name
    if [ ! -f "$p" ]; then echo "images.sh: $f copies $name, which $dir lacks" >&2; bad=$((bad + 1)); continue; fi
    if [ -n "$want" ] && [ "$(head -c4 "$p" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      m=$(od -An -j18 -N2 -tu2 "$p" | tr -d ' ')
      [ "$m" = "$want" ] || { echo "images.sh: $p has e_machine $m, not $want ($2)" >&2; bad=$((bad + 1)); }
    fi
  done
done
[ $n -gt 0 ] || { echo "images.sh: no file copied out of a release build in images/*.Dockerfile" >&2; exit 1; }
[ $bad = 0 ] || exit 1
echo "images.sh: the $n files the images copy are in $dir${2:+ and are $2}"
