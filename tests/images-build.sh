#!/usr/bin/env bash
# images-build.sh: the product images, built from images/*.Dockerfile by a real builder (buildah,
# Debian's), as the README's `docker build` commands build them; no Docker engine, no registry.
#   images-build.sh          builds localhost/mockgpu-<name>:1 for each images/<name>.Dockerfile
#       and writes them all into one OCI image layout, as a tar ($MGI/product.tar, which it
#       prints last); reused as it is while the images' ids are the ones it holds
#   images-build.sh base     only the base images
# The Dockerfiles' FROM lines name debian:trixie and debian:trixie-slim; nothing is pulled
# (--pull=never): both are made here from one debootstrap of trixie (minbase, as Debian's official
# images are; slim: documentation, man pages and locales removed and kept out by dpkg, as
# debuerreotype's slimify does) and tagged docker.io/library/debian:trixie(-slim), the names the
# FROM lines resolve to. They are remade when this script's recipe, the mirror or the machine's
# own certificate authorities (which the build stage's base trusts, see make_bases) change.
# Caches, all in $MGI (/var/tmp/mgimages), reused by every run:
#   storage/    buildah's own storage (overlay; --root, so the host's default storage is never
#               touched; --runroot in /run/<basename of $MGI>), with the layer cache (--layers): a step
#               whose inputs are unchanged is not run again (the build stage's apt and rustup
#               layers; the whole image for an unchanged tree)
#   tmp/buildah-cache/   the Dockerfiles' `RUN --mount=type=cache` directories: cargo's registry
#               and the target directory, so a changed source file rebuilds only what depends on it
#   debs/       debootstrap's packages
# Remove $MGI (`rm -rf /var/tmp/mgimages`, after `umount` of anything below it) to start cold.
# Needs root. Env: MGI, MIRROR (from the apt sources), BUILDAH_ARGS (extra `buildah build` args).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
MGI=${MGI:-/var/tmp/mgimages}
RUNROOT=/run/$(basename "$MGI")   # buildah's transient state (tmpfs: cleared at boot, as it expects)
MIRROR=${MIRROR:-$( { grep -h -o -m1 -E '^(URIs:|deb) +[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } | head -1 | awk '{print $2}')}
SUITE=trixie
ARCH=$(dpkg --print-architecture)   # the images are for this machine's architecture
log() { echo "images-build: $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (buildah's storage in $MGI, debootstrap)"
# runc: crun refuses this machine's hybrid cgroup layout (v1 controllers and cgroup2)
bash tests/apt-ensure.sh buildah runc debootstrap
mkdir -p "$MGI/tmp" "$MGI/debs" "$RUNROOT"
# buildah keeps the cache mounts of RUN --mount=type=cache in $TMPDIR/buildah-cache
export TMPDIR=$MGI/tmp
B=(buildah --root "$MGI/storage" --runroot "$RUNROOT" --storage-driver overlay)
# one build at a time: two test beds (trixie, sid) may ask at once; they share the result
exec 8> "$MGI/lock"
flock 8

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# (one line a tag: the README's `-t` gives each image a second name; sed reads them all, where
# `head -1` could leave buildah to die of SIGPIPE, which pipefail and set -e made a silent exit)
image_id() { "${B[@]}" images --noheading --no-trunc --format '{{.ID}}' "$1" 2> /dev/null | sed -n 1p; }

# ---------------------------------------------------------------------------------------------
# base images: docker.io/library/debian:trixie and :trixie-slim

# a site's own certificate authorities (this machine's, say, for a proxy that intercepts TLS)
LOCAL_CAS=$(compgen -G "/usr/local/share/ca-certificates/*.crt" || true)

base_key() {
  # shellcheck disable=SC2086 # LOCAL_CAS: file names
  { echo "suite=$SUITE mirror=$MIRROR"; [ -z "$LOCAL_CAS" ] || cat $LOCAL_CAS; declare -f make_bases slimify commit_root; } | sha256sum | cut -c1-16
}

slimify() {  # slimify <root>: what debian:*-slim leaves out (debuerreotype-slimify), now and later
  local r=$1
  mkdir -p "$r/etc/dpkg/dpkg.cfg.d"
  cat > "$r/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# the slim image's exclusions (debuerreotype's slimify)
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
EOF
  find "$r/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
  find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$r/usr/share/groff"/* "$r/usr/share/info"/* "$r/usr/share/linda"/* "$r/usr/share/lintian/overrides"/* "$r/usr/share/man"/*
  find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
}

commit_root() {  # commit_root <root> <image>: an image of one layer, the root's files
  local ctr mnt
  ctr=$("${B[@]}" from --pull=never scratch)
  mnt=$("${B[@]}" mount "$ctr")
  cp -a "$1/." "$mnt/"
  "${B[@]}" umount "$ctr" > /dev/null
  "${B[@]}" config --os linux --arch "$ARCH" --cmd bash \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  "${B[@]}" commit --quiet --rm "$ctr" "$2" > /dev/null
}

make_bases() {
  local d=$MGI/rootfs
  [ -n "$MIRROR" ] || fail "no Debian mirror in the apt sources; set MIRROR"
  rm -rf "$d"; mkdir -p "$d"
  debootstrap --variant=minbase --cache-dir="$MGI/debs" "$SUITE" "$d" "$MIRROR" > "$MGI/debootstrap.log" 2>&1 \
    || { tail "$MGI/debootstrap.log" >&2; fail "debootstrap $SUITE from $MIRROR (log $MGI/debootstrap.log)"; }
  # as in Debian's images: apt sources in deb822, no package lists or caches, no logs
  rm -f "$d/etc/apt/sources.list"
  printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$MIRROR" "$SUITE" "$SUITE" > "$d/etc/apt/sources.list.d/debian.sources"
  rm -rf "$d/var/lib/apt/lists"/* "$d/var/cache/apt"/*.bin "$d/var/cache/apt/archives"/*.deb "$d/var/log"/* "$d/tmp"/*
  : > "$d/etc/resolv.conf"; : > "$d/etc/hostname"; rm -f "$d/etc/machine-id" "$d/var/lib/dbus/machine-id"
  # the build stage downloads (rustup-init, the toolchain, crates.io) over TLS: the site's
  # authorities are trusted there as on this machine; the build stage's `apt-get install
  # ca-certificates` adds them to its bundle (update-ca-certificates reads this directory)
  # shellcheck disable=SC2086 # LOCAL_CAS: file names
  [ -z "$LOCAL_CAS" ] || { mkdir -p "$d/usr/local/share/ca-certificates"; cp $LOCAL_CAS "$d/usr/local/share/ca-certificates/"; }
  commit_root "$d" "docker.io/library/debian:$SUITE"
  rm -f "$d/usr/local/share/ca-certificates"/*
  slimify "$d"
  commit_root "$d" "docker.io/library/debian:$SUITE-slim"
  rm -rf "$d"
}

bases() {
  local key t; key=$(base_key)
  if [ "$(cat "$MGI/base.key" 2> /dev/null)" = "$key" ] \
    && [ -n "$(image_id "docker.io/library/debian:$SUITE")" ] && [ -n "$(image_id "docker.io/library/debian:$SUITE-slim")" ]; then
    return 0
  fi
  log "base images: debootstrap $SUITE (minbase) from $MIRROR -> debian:$SUITE, debian:$SUITE-slim"
  t=$(date +%s%N); rm -f "$MGI/base.key"
  make_bases
  echo "$key" > "$MGI/base.key"
  log "TIMING base-images: $(ms "$t") ms"
}

# ---------------------------------------------------------------------------------------------
# the product images

# readme_build <Dockerfile>: the README's `docker build -f <Dockerfile> ...` line, one per
# images/*.Dockerfile, what users run and so what is built here, by buildah with the same
# arguments: the words after `docker build`, shell quoting undone, each ended by a NUL
readme_build() {
  python3 - README.md "$1" <<'PY'
import shlex, sys
for line in open(sys.argv[1]):
    if line.startswith("docker build "):
        w = shlex.split(line)[2:]
        if any(x in ("-f", "--file") and y == sys.argv[2] for x, y in zip(w, w[1:])):
            sys.stdout.write("".join(x + "\0" for x in w))
            break
PY
}

build_one() {  # build_one <Dockerfile> <image> <docker build args...>: buildah build, its output in $MGI/<name>.log
  local f=$1 img=$2 ign=() log; shift 2
  log=$MGI/$(basename "$f" .Dockerfile).log
  # BuildKit reads <Dockerfile>.dockerignore by itself; buildah is told
  [ ! -f "$f.dockerignore" ] || ign=(--ignorefile "$f.dockerignore")
  # BUILDARCH/TARGETARCH: BuildKit sets them; buildah 1.28 (bookworm's) does not.
  # shellcheck disable=SC2086 # BUILDAH_ARGS: words
  if ! "${B[@]}" build --layers --force-rm --pull=never --network host --isolation oci --runtime runc "${ign[@]}" \
      --build-arg BUILDARCH="$ARCH" --build-arg TARGETARCH="$ARCH" ${BUILDAH_ARGS:-} \
      -t "$img" "$@" > "$log" 2>&1; then
    tail -25 "$log" >&2
    fail "$f does not build: buildah build ${*} (its log: $log)"
  fi
  # the build stage's last image has no name and no child (the final stage is the slim one's):
  # named, it survives the pruning below, and an unchanged tree takes its cargo step from it
  local last; last=$(awk '/^\[[0-9]+\/[0-9]+\] STEP 1\// && NR > 1 {print id; exit} /^--> / {id = $NF}' "$log")
  [ -z "$last" ] || "${B[@]}" tag "$last" "$img-build" > /dev/null 2>&1 || true
}

prune() {  # what no current image needs: working containers left behind, images without a name
  # (earlier trees' layers); the layer cache of the current images stays
  "${B[@]}" rm --all > /dev/null 2>&1 || true
  local n=0 before; before=$(du -sm "$MGI/storage" | cut -f1)
  while [ $n -lt 10 ] && "${B[@]}" rmi --prune 2> /dev/null | grep -q .; do n=$((n + 1)); done
  log "pruned: storage $before -> $(du -sm "$MGI/storage" | cut -f1) MiB"
}

products() {
  local f name img ids="" t t1 O=$MGI/oci args
  t=$(date +%s%N)
  for f in images/*.Dockerfile; do
    name=mockgpu-$(basename "$f" .Dockerfile); img=localhost/$name:1
    mapfile -d '' -t args < <(readme_build "$f")
    [ ${#args[@]} -gt 0 ] || fail "README.md has no 'docker build -f $f ...' line (users build the images so; CI does too)"
    t1=$(date +%s%N)
    build_one "$f" "$img" "${args[@]}"
    log "TIMING $name: $(ms "$t1") ms (buildah build --layers)"
    ids="$ids$img $(image_id "$img")"$'\n'
  done
  # the same images as last time (every layer from the cache): the archive is current
  if [ -s "$MGI/product.tar" ] && [ "$(cat "$MGI/product.ids" 2> /dev/null)" = "${ids%$'\n'}" ]; then
    log "unchanged images, $MGI/product.tar reused"
  else
    rm -rf "$O" "$MGI/product.tar" "$MGI/product.ids"
    while read -r img _; do
      [ -n "$img" ] || continue
      # one layout for both: the slim base layer is stored once
      "${B[@]}" push --quiet "$img" "oci:$O:$img"
    done <<< "$ids"
    # containerd names each image by this annotation (ctr images import)
    python3 - "$O/index.json" <<'EOF'
import json, sys
p = sys.argv[1]
idx = json.load(open(p))
for m in idx["manifests"]:
    a = m.setdefault("annotations", {})
    a["io.containerd.image.name"] = a["org.opencontainers.image.ref.name"]
json.dump(idx, open(p, "w"))
EOF
    tar -C "$O" -cf "$MGI/product.tar.new" . && mv "$MGI/product.tar.new" "$MGI/product.tar"
    rm -rf "$O"; printf '%s' "$ids" > "$MGI/product.ids"
  fi
  prune
  log "TIMING product-images: $(ms "$t") ms ($(du -sh "$MGI/product.tar" | cut -f1) archive)"
}

case ${1:-} in
  base) bases ;;
  '') bases; products; echo "$MGI/product.tar" ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
