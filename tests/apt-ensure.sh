#!/usr/bin/env bash
# apt-ensure.sh PKG...: installs the Debian packages among PKG that are not installed yet.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'ok installed' > /dev/null || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
echo "apt-ensure: installing ${missing[*]}"
apt-get update -q > /dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" > /dev/null
