#!/usr/bin/env bash
# apt-ensure.sh PKG...: installs the Debian packages among PKG that are not installed yet.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'ok installed' > /dev/null || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
# one at a time: tests/run.sh's background builds install their tools beside its steps
exec 9> /var/lock/mockgpu-apt-ensure.lock
flock 9
echo "apt-ensure: installing ${missing[*]}"
apt-get update -q > /dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" > /dev/null
