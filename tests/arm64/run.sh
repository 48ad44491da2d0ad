#!/bin/bash
# run.sh - mockgpu for aarch64: cross build with Debian's own Rust, then the aarch64
# test binaries of the architecture-dependent packages under qemu-user inside a Debian arm64 root.
#
# Usage: run.sh [COMMAND]   (default: all = roots, build, test)
#   roots   the two Debian trixie roots, each reused while its key (package list, steps) matches:
#           $A64/build  amd64: rustc-web/cargo-web, libstd-rust-web-dev:arm64, the aarch64 GNU
#                       toolchain, qemu-user-static
#           $A64/arm64  arm64 (debootstrap --foreign, second stage under qemu): what the tests run
#   build   cargo build --target aarch64-unknown-linux-gnu (debug) of what the images copy in the
#           build root, then the test binaries of the architecture-dependent packages
#           (ARCH_TEST_PKGS; cargo test --no-run), into $A64_TARGET (the workspace's own
#           crates cleaned first when its last build came from another clone); checks that the
#           files images/ copies are there and are aarch64 programs (tests/images.sh); compiles
#           mknod-supervisor.c (static, x86_64)
#   test [NAME...]  every aarch64 test binary inside the arm64 root under qemu-user (some tests
#           left out: see EMULATION_SKIP), or only those named (device_plugin, exec, ...), then
#           `mockgpu-agent exec` as a user runs it; non-zero when any fails
# Env: A64 (/var/tmp/mgarm64), A64_TARGET (the aarch64 target directory, $A64/target),
#      A64_TARGET_MAX_GIB (10: above it the target directory starts over), MIRROR (from the apt
#      sources), RUST_LOG (passed to the tests).
# Needs root and a kernel >= 6.7: qemu-aarch64 is registered in a binfmt_misc instance private to
# a user namespace, never host-wide.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
A64=${A64:-/var/tmp/mgarm64}
B=$A64/build
T=$A64/arm64
LOGS=$A64/logs
TRIPLE=aarch64-unknown-linux-gnu
MIRROR=${MIRROR:-$( { grep -h -o -m1 -E '^(URIs:|deb) +[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } | head -1 | awk '{print $2}')}
BUILD_PKGS="rustc-web cargo-web libstd-rust-web-dev:arm64 gcc libc6-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static protobuf-compiler ca-certificates"
ARM64_PKGS="pciutils,hwloc,python3,fuse3,procps"
ENVP=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive)

mkdir -p "$LOGS"
T0=$(date +%s)
log()  { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
timing() { echo "TIMING $1: $2" | tee -a "$LOGS/timings.txt"; }

umount_under() {  # umount_under <dir>: every mount at or below dir, deepest first
  local m; { grep -oE "^[0-9]+ [0-9]+ [0-9:]+ [^ ]+ $1(/[^ ]*)? " /proc/self/mountinfo || true; } | awk '{print $5}' | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
inchroot() { chroot "$1" /usr/bin/env -i "${ENVP[@]}" "${@:2}"; }

# ---------------------------------------------------------------------------------------------
# roots

nodoc() {  # nodoc <root>: no docs, man pages or locales; no services started by package scripts
  printf '#!/bin/sh\nexit 101\n' > "$1/usr/sbin/policy-rc.d"; chmod +x "$1/usr/sbin/policy-rc.d"
  mkdir -p "$1/etc/dpkg/dpkg.cfg.d"
  printf 'path-exclude=/usr/share/doc/*\npath-exclude=/usr/share/man/*\npath-exclude=/usr/share/locale/*\npath-include=/usr/share/locale/locale.alias\n' \
    > "$1/etc/dpkg/dpkg.cfg.d/01-nodoc"
}

bootstrap_build() {  # bootstrap_build <dir>: the amd64 build root
  local d=$1 rc=0
  debootstrap --variant=minbase trixie "$d" "$MIRROR" > "$LOGS/build-debootstrap.log" 2>&1 || { tail "$LOGS/build-debootstrap.log"; fail "debootstrap (build root)"; }
  nodoc "$d"
  mount -t proc proc "$d/proc"; mount --rbind /dev "$d/dev"; mount --make-rslave "$d/dev"
  # shellcheck disable=SC2086 # BUILD_PKGS is a list
  { inchroot "$d" dpkg --add-architecture arm64 && inchroot "$d" apt-get update -q \
      && inchroot "$d" apt-get install -y -q --no-install-recommends $BUILD_PKGS && inchroot "$d" apt-get clean; } > "$LOGS/build-apt.log" 2>&1 || rc=$?
  umount -R "$d/dev"; umount "$d/proc"
  [ $rc = 0 ] || { tail -20 "$LOGS/build-apt.log"; fail "apt-get install in the build root"; }
}

# The registration line of Debian's qemu-user-static for aarch64 ELF files, with the flags F (the
# interpreter is opened now, so it works inside a chroot) and P (argv[0] is kept).
binfmt_line() {
  local conf; conf=$(cat "$B/usr/lib/binfmt.d/qemu-aarch64.conf" 2>/dev/null || cat "$B/usr/lib/binfmt.d/qemu-aarch64-static.conf")
  # :name:type:offset:magic:mask:interpreter:flags
  awk -F: -v OFS=: -v q="$B/usr/bin/qemu-aarch64-static" '{ $7 = q; $8 = "FP"; print }' <<< "$conf"
}

# userns CMD...: CMD as root of a new user namespace (uids and gids 0-65535 mapped to themselves)
# with its own mount and PID namespaces and its own binfmt_misc instance (kernel >= 6.7), in which
# aarch64 programs run under qemu-aarch64, also after execve. Nothing of it is visible to the host.
# With SUPERVISOR (mknod-supervisor), its processes' mknod of character devices is done for them
# from outside the namespace (the kernel refuses it inside).
userns() {
  local go pid me k; k=$(uname -r | awk -F. '{ print $1 * 1000 + $2 }')
  [ "$k" -ge 6007 ] || fail "Linux $(uname -r): a binfmt_misc instance of a user namespace needs Linux 6.7 or later"
  go=$(mktemp -u "$A64/go.XXXXXX"); mkfifo "$go"
  me=$(readlink /proc/self/ns/user)
  A64=$A64 BINFMT=$(binfmt_line) ${SUPERVISOR:+"$SUPERVISOR"} unshare --user --mount --pid --fork --kill-child --propagation private -- /bin/bash -c '
    set -e; read -r _ < "$0"; rm -f "$0"
    mkdir -p "$A64/binfmt"; mount -t binfmt_misc binfmt_misc "$A64/binfmt"
    echo "$BINFMT" > "$A64/binfmt/register"
    exec "$@"' "$go" "$@" &
  pid=$!
  # the uid/gid maps of the new namespace, written from outside (we are root here)
  for _ in $(seq 200); do [ "$(readlink "/proc/$pid/ns/user" 2>/dev/null)" = "$me" ] || break; sleep 0.01; done
  [ "$(readlink "/proc/$pid/ns/user")" != "$me" ] || fail "unshare did not create a user namespace"
  echo "0 0 65536" > "/proc/$pid/uid_map"; echo "0 0 65536" > "/proc/$pid/gid_map"
  echo go > "$go"
  wait "$pid"
}

bootstrap_arm64() {  # bootstrap_arm64 <dir>: the arm64 root the tests run in
  local d=$1
  debootstrap --arch=arm64 --foreign --variant=minbase --include="$ARM64_PKGS" trixie "$d" "$MIRROR" \
    > "$LOGS/arm64-debootstrap.log" 2>&1 || { tail "$LOGS/arm64-debootstrap.log"; fail "debootstrap --foreign (arm64 root)"; }
  nodoc "$d"
  # in the root too: to run one program under it by hand as real root
  cp "$B/usr/bin/qemu-aarch64-static" "$d/usr/bin/"
  # container=lxc: debootstrap's way of saying that mknod is refused here (a user namespace)
  userns /bin/bash -c 'mount -t proc proc "$0/proc" && mount --rbind /dev "$0/dev" \
    && exec chroot "$0" /usr/bin/env -i '"${ENVP[*]}"' container=lxc /debootstrap/debootstrap --second-stage' "$d" \
    >> "$LOGS/arm64-debootstrap.log" 2>&1 || { tail "$LOGS/arm64-debootstrap.log"; fail "debootstrap --second-stage (arm64 root, under qemu)"; }
}

root_key() {  # root_key <bootstrap function> <packages>
  { echo "mirror=$MIRROR suite=trixie variant=minbase pkgs=$2"; declare -f "$1" nodoc; } | sha256sum | cut -c1-16
}

ensure_root() {  # ensure_root <dir> <bootstrap function> <packages> <name>
  local d=$1 key t; key=$(root_key "$2" "$3")
  if [ -f "$d.key" ] && [ "$(cat "$d.key")" = "$key" ]; then log "roots: reusing $d (key $key)"; return 0; fi
  [ -n "$MIRROR" ] || fail "no Debian mirror in the apt sources; set MIRROR"
  log "roots: bootstrapping $d ($4, key $key)"
  t=$(date +%s)
  umount_under "$d"; umount_under "$d.new"        # never rm -rf through a mounted /dev
  rm -rf "$d" "$d.new" "$d.key"; mkdir -p "$d.new"
  "$2" "$d.new"
  mv "$d.new" "$d"; echo "$key" > "$d.key"
  timing "root-$4" "$(( $(date +%s) - t )) s ($(du -shx "$d" | cut -f1))"
}

phase_roots() {
  [ "$(uname -m)" = x86_64 ] || fail "the build root is amd64; this host is $(uname -m)"
  ensure_root "$B" bootstrap_build "$BUILD_PKGS" build
  ensure_root "$T" bootstrap_arm64 "$ARM64_PKGS" arm64
}

# ---------------------------------------------------------------------------------------------
# build: in the build root, inside a private mount namespace (its mounts vanish with it)

# The packages whose tests run here: those whose behaviour depends on the architecture (system
# calls and their structures, the FUSE protocol, ELF and symbol versions, the NVML ABI, the device
# numbers and paths an architecture gets). The controller's, the health endpoint's and the test bed client's
# tests are plain Rust over the network and run on x86_64 only (docs/testing.md).
ARCH_TEST_PKGS="-p mockfs-shim -p mockgpu-agent -p mockgpu-api -p mockgpu-nri -p mockgpu-nvml"
HOST_CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}   # its registry cache is shared (cargo locks it)
# the aarch64 target directory: a cache beside the roots (a fresh clone rebuilds only its own
# crates), seen at the same path in both roots
TD=${A64_TARGET:-$A64/target}
TARGET_MAX_GIB=${A64_TARGET_MAX_GIB:-10}   # the target directory starts over above this size
CARGO_ENV=(CARGO_HOME=/cargo-home CARGO_TARGET_DIR="$TD" CARGO_TERM_COLOR=never
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  ${CARGO_INCREMENTAL:+CARGO_INCREMENTAL=$CARGO_INCREMENTAL})

mount_build_root() {  # mount_build_root <where $B is>: proc, dev, the repository, the cargo home
  local d=$1
  mount -t proc proc "$d/proc"; mount --rbind /dev "$d/dev"; mount -t tmpfs tmpfs "$d/tmp"
  mkdir -p "$d$REPO" "$d/cargo-home" "$HOST_CARGO_HOME" "$d$TD" "$TD"
  mount --bind "$REPO" "$d$REPO"; mount --bind "$HOST_CARGO_HOME" "$d/cargo-home"; mount --bind "$TD" "$d$TD"
}

inside_build() {
  mount_build_root "$B"
  # cargo reaches the registry through this machine's extra CA certificates, if it has any
  if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$B/usr/local/share/ca-certificates/"
    inchroot "$B" update-ca-certificates > /dev/null
  fi
  local c=(chroot "$B" /usr/bin/env -i "${ENVP[@]}" "${CARGO_ENV[@]}" /bin/bash -c)
  if [ ! "$TD/mknod-supervisor" -nt "$REPO/tests/arm64/mknod-supervisor.c" ]; then
    log "build: mknod-supervisor (static, for the host)"
    "${c[@]}" "gcc -O2 -Wall -Wextra -Werror -static -o '$TD/mknod-supervisor' '$REPO/tests/arm64/mknod-supervisor.c'"
  fi
  "${c[@]}" "cd '$REPO' && cargo --version && rustc --version"
  # The workspace's crates have the same file names whichever clone they were built from, and
  # cargo finds them up to date when no source is newer than they are: a clone whose files are
  # older than the last build from another one would be tested with that one's code. So they are
  # rebuilt whenever the last build was from another clone (the dependencies are kept).
  local stamp=$TD/built-from last pkgs
  last=$(cat "$stamp" 2>/dev/null || true)
  if [ "$last" != "$REPO" ]; then
    pkgs=$("${c[@]}" "cd '$REPO' && cargo metadata --locked --offline --no-deps --format-version 1" \
      | grep -oE '"name":"[^"]+","version":"[^"]+","id"' | cut -d'"' -f4 | sed 's/^/-p /' | tr '\n' ' ')
    [ -n "$pkgs" ] || fail "cargo metadata named no workspace package"
    log "build: last built from ${last:-an unknown clone}: the workspace's own crates again"
    "${c[@]}" "cd '$REPO' && cargo clean --target $TRIPLE $pkgs"
    rm -rf "$TD/$TRIPLE/mockfs-shim-tests"   # the shim's tests build libmockfs.so there
  fi
  echo "$REPO" > "$stamp"   # what is built from now on is this clone's
  local image_pkgs; image_pkgs=$(image_packages)
  [ -n "$image_pkgs" ] || fail "no cross-build line in images/*.Dockerfile"
  # in debug, as the tests: one profile, so the dependencies are compiled once (a release build
  # took 21 of this step's 38 minutes from cold caches; the images' own build stage is the
  # release build, tests/images-build.sh)
  log "build: cargo build --target $TRIPLE $image_pkgs (what the images copy)"
  "${c[@]}" "cd '$REPO' && cargo build --locked --target $TRIPLE $image_pkgs"
  log "build: cargo test --no-run --target $TRIPLE $ARCH_TEST_PKGS"
  "${c[@]}" "cd '$REPO' && cargo test --locked --no-run --target $TRIPLE $ARCH_TEST_PKGS --message-format=json > '$TD/tests.json'"
}

# The packages the images build (`cross-build cargo "$TARGETARCH" PKG...` in images/*.Dockerfile),
# as cargo arguments.
image_packages() {
  grep -hoE 'cross-build cargo "\$TARGETARCH"( [a-z0-9_-]+)+' "$REPO"/images/*.Dockerfile \
    | cut -d' ' -f4- | tr ' ' '\n' | sort -u | sed 's/^/-p /' | tr '\n' ' '
}

phase_build() {
  [ -f "$B.key" ] || fail "no build root: run.sh roots"
  local t size_gib; t=$(date +%s)
  # cargo never removes what it built for other dependency versions or profiles: the cache starts
  # over when the toolchain's root changes, or when it has grown past A64_TARGET_MAX_GIB (it had
  # reached 8.4 GB). A changed lock file alone builds only what changed (a full build: ~40 min).
  # (a directory without root.key predates it: kept; cargo's fingerprints name the compiler)
  if [ -f "$TD/root.key" ] && [ "$(cat "$TD/root.key")" != "$(cat "$B.key")" ]; then
    log "build: the build root changed: the target directory $TD starts over"
    umount_under "$TD"; rm -rf "$TD"
  elif [ -d "$TD" ] && size_gib=$(( $(du -sb "$TD" | cut -f1) >> 30 )) && [ "$size_gib" -ge "$TARGET_MAX_GIB" ]; then
    log "build: the target directory $TD holds $size_gib GiB (at most $TARGET_MAX_GIB): it starts over"
    umount_under "$TD"; rm -rf "$TD"
  fi
  mkdir -p "$TD"; rm -f "$TD/deps.key"; cat "$B.key" > "$TD/root.key"
  unshare --mount --propagation private -- bash "$0" _build
  local agent=$TD/$TRIPLE/debug/mockgpu-agent
  [ -x "$agent" ] || fail "$agent was not built"
  [ "$(e_machine "$agent")" = 183 ] || fail "$agent is not an aarch64 program (e_machine $(e_machine "$agent"))"
  [ -x "$TD/mknod-supervisor" ] || fail "$TD/mknod-supervisor was not built"
  bash "$REPO/tests/images.sh" "$TD/$TRIPLE/debug" aarch64   # what the arm64 image copies
  timing build "$(( $(date +%s) - t )) s ($(du -sh "$TD" | cut -f1) in $TD)"
}

e_machine() { od -An -j18 -N2 -tu2 "$1" | tr -d ' '; }   # 62: x86-64, 183: aarch64 (little-endian ELF)

# ---------------------------------------------------------------------------------------------
# test: every aarch64 test binary in the arm64 root, as a cargo test run would start it (working
# directory: its package), as root of a user namespace in which qemu-aarch64 is registered in a
# private binfmt_misc, so that the programs they start (the agent, cat, python3, lspci) run too.
# The kernel refuses mknod of a character device there (it asks for CAP_MKNOD of the initial
# namespace), so the namespace runs under mknod-supervisor, which makes such nodes for its
# processes from outside (real root): the device plugin's and render's nodes.
# Tests left out by name (printed with every run) run natively on x86_64. Two of them run
# the agent as an ordinary user who mounts through the set-user-ID fusermount3 and a /dev/fuse
# of the test's own: a device node on a file system mounted inside a user namespace (the tests'
# /tmp) cannot be opened; with /tmp mounted outside, fusermount3 runs under qemu with the
# interpreter's credentials, not its own (binfmt_misc without the flag C) and may not mount; with
# C as well, the first test hangs after the mount under qemu, and the second fails in a user
# namespace even natively (the command outlives the SIGKILLed agent). Not pursued further.
# The NVML library's confinement tests are left out too: they make cgroups and load a BPF device
# program, which only root of the initial namespaces may; what they test is the kernel's answer,
# the same on every architecture, and the library's rule, which its unit tests check here.
# The keeper's wake-up count is left out as well: it counts the context switches of every thread
# of the keeper process, and under qemu-user the emulator's own threads are among them.
EMULATION_SKIP="handover:where_agents_read_the_device_requests_never_wake_the_keeper
exec:an_ordinary_user_gets_an_owner_only_fuse_mount_through_fusermount3
exec:sigkill_of_an_ordinary_users_agent_leaves_no_fuse_mount
confinement:a_confined_job_lists_and_opens_only_its_gpus
confinement:two_concurrent_jobs_see_disjoint_pairs
confinement:without_confinement_a_job_sees_every_gpu
confinement:a_container_given_two_nodes_sees_those_two"

test_list() {  # test_list [NAME...]: "<package dir> <executable>" of every test binary of the
  # last build, or of those named (the executable's name without its hash)
  grep -E '"reason":"compiler-artifact".*"profile":\{[^}]*"test":true' "$TD/tests.json" \
    | sed -E 's/.*"manifest_path":"([^"]*)\/Cargo.toml".*"executable":"([^"]*)".*/\1 \2/' \
    | awk -v names="$*" 'BEGIN { n = split(names, w, " "); for (i = 1; i <= n; i++) want[w[i]] = 1 }
        { b = $2; sub(/.*\//, "", b); sub(/-[0-9a-f]+$/, "", b); if (n == 0 || b in want) print }'
}

mount_arm64_root() {  # the arm64 root as the tests see it; $B inside at /mgarm64-build for cargo
  mount --bind "$T" "$T"   # "/" of the tests is a mount point: they make it private (unshare)
  mount -t proc proc "$T/proc"; mount --rbind /sys "$T/sys"; mount --rbind /dev "$T/dev"
  mount -t tmpfs tmpfs "$T/tmp"; mount -t tmpfs -o mode=755 tmpfs "$T/run"
  mkdir -p "$T$REPO" "$T$TD" "$T/mgarm64-build"
  mount --bind "$REPO" "$T$REPO"; mount --bind "$TD" "$T$TD"
  mount --bind "$B" "$T/mgarm64-build"; mount_build_root "$T/mgarm64-build"
  install -m 755 "$HERE/cargo-in-build-root" "$T/usr/local/bin/cargo"
}

inside_tests() {  # inside_tests <list file>: run the listed tests, one log each
  local dir exe name t rc skip
  mount_arm64_root
  while read -r dir exe; do
    name=$(basename "$exe"); t=$(date +%s); rc=0
    skip=$(awk -F: -v b="${name%-*}" '$1 == b { printf " --skip %s", $2 }' <<< "$EMULATION_SKIP")
    # shellcheck disable=SC2086 # $skip is a list of arguments
    env -i "${ENVP[@]}" CARGO=/usr/local/bin/cargo CARGO_MANIFEST_DIR="$dir" RUST_BACKTRACE=1 ${RUST_LOG:+RUST_LOG="$RUST_LOG"} \
      CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      timeout 900 unshare --root="$T" --wd="$dir" "$exe" ${skip:+--exact$skip} > "$LOGS/tests/$name.log" 2>&1 < /dev/null || rc=$?
    echo "$([ $rc = 0 ] && echo PASS || echo "FAIL (exit $rc)") $name $(grep -h '^test result:' "$LOGS/tests/$name.log" | sed 's/^test result: //; s/; finished.*//')${skip:+ (left out:$skip)} ($(( $(date +%s) - t )) s)"
  done < "$1"
  smoke_exec
}

# The agent, as a user would run it on an arm64 node: four GB300 GPUs through FUSE.
smoke_exec() {
  local agent=$TD/$TRIPLE/debug/mockgpu-agent out rc=0
  out=$(env -i "${ENVP[@]}" timeout 120 unshare --root="$T" --wd=/ "$agent" exec -- \
    sh -c 'cat /proc/driver/nvidia/gpus/*/information' 2> "$LOGS/tests/smoke-exec.log") || rc=$?
  echo "$out" >> "$LOGS/tests/smoke-exec.log"
  if [ $rc = 0 ] && [ "$(grep -c '^Model:[[:space:]]*NVIDIA GB300$' <<< "$out")" = 4 ]; then
    echo "PASS smoke-exec: mockgpu-agent exec -- cat /proc/driver/nvidia/gpus/*/information: 4 GB300"
  else
    echo "FAIL (exit $rc) smoke-exec: mockgpu-agent exec: $(grep -c '^Model:' <<< "$out") Model lines (log: $LOGS/tests/smoke-exec.log)"
  fi
}

phase_test() {  # phase_test [NAME...]
  [ -f "$T.key" ] && [ -s "$TD/tests.json" ] && [ -x "$TD/mknod-supervisor" ] || fail "no arm64 root or no build: run.sh roots build"
  local t all=$LOGS/tests/all.txt n
  t=$(date +%s); rm -rf "$LOGS/tests"; mkdir -p "$LOGS/tests"
  test_list "$@" > "$all"
  n=$(wc -l < "$all"); [ "$n" -gt 0 ] || fail "no test binaries${*:+ named $*} in $TD/tests.json"
  log "test: $n test binaries"
  SUPERVISOR=$TD/mknod-supervisor userns bash "$0" _tests "$all" | tee "$LOGS/tests/summary.txt"
  timing test "$(( $(date +%s) - t )) s"
  local bad; bad=$(grep -vc '^PASS' "$LOGS/tests/summary.txt" || true)
  # every test binary and the smoke test
  [ "$(wc -l < "$LOGS/tests/summary.txt")" = $((n + 1)) ] || fail "only $(wc -l < "$LOGS/tests/summary.txt") of $((n + 1)) runs reported"
  [ "$bad" = 0 ] || fail "$bad of $((n + 1)) aarch64 runs failed (logs: $LOGS/tests/)"
  log "test: all $n aarch64 test binaries ($(grep -oE 'ok\. [0-9]+ passed' "$LOGS/tests/summary.txt" | awk '{ n += $2 } END { print n }') tests) and the exec smoke test passed"
}

# One run at a time (another one waits): runs share the roots, the target directory (whose
# uplifted binaries, such as debug/mockgpu-agent that the tests start, name no clone) and the logs.
lock() {
  exec 9> "$A64/lock"
  flock -n 9 || { log "waiting for another run of run.sh (flock $A64/lock)"; flock 9; }
}

case "${1:-all}" in
  test) lock; phase_test "${@:2}" ;;
  _tests) inside_tests "$2" ;;
  all) lock; phase_roots; phase_build; phase_test ;;
  roots) lock; phase_roots ;;
  build) lock; phase_build ;;
  _build) inside_build ;;
  *) sed -n '2,/^set -e/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
