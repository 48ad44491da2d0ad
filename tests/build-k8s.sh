#!/usr/bin/env bash
# build-k8s.sh - builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl,
# kube-proxy (k8s.io/kubernetes at $K8S_VERSION), helm ($HELM_VERSION) and coredns
# ($COREDNS_VERSION, with $COREDNS_PLUGINS) from the Go module proxy with the ordinary `go` command, static
# (CGO_ENABLED=0), into $MGK8S_CACHE/<key>/bin, the key naming the three versions and the Go
# toolchain (CoreDNS's plugins are in bin/.coredns-plugins). All eight are built in one module, so
# that Go's version selection gives them one set of dependencies and the packages they share
# (k8s.io/api, apimachinery, client-go, golang.org/x/net, protobuf, ...) compile once: in three
# modules they differed in golang.org/x/net, x/sys and protobuf, and each built all of them.
# Each binary is built when it is missing, so a binary added to the list costs only its own build. Prints the bin directory on the
# last line of stdout (`--print-dir` prints it without building).
# Env: MGK8S_CACHE (/var/tmp/mgk8s: binaries, module and build caches; keep it between CI runs),
# GOMAXPROCS (2), NICE (15), MGK8S_KEEP_GOCACHE (0: the 5 GB Go build cache is removed once the
# binaries are in place; 1 keeps it for a faster rebuild at other versions).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/k8s-versions.sh"
CACHE=${MGK8S_CACHE:-/var/tmp/mgk8s}
# Go's own installer puts it in /usr/local/go, which a non-login shell may not have on PATH.
command -v go > /dev/null || [ ! -x /usr/local/go/bin/go ] || PATH=/usr/local/go/bin:$PATH
command -v go > /dev/null || { echo "build-k8s.sh: no \`go\` on PATH (Go 1.25 or later is needed)" >&2; exit 1; }
GOV=$(go env GOVERSION)
KEY=k8s-$K8S_VERSION-helm-$HELM_VERSION-coredns-$COREDNS_VERSION-$GOV
BIN=$CACHE/$KEY/bin
if [ "${1:-}" = --print-dir ]; then echo "$BIN"; exit 0; fi

have() {  # have <binary>: built, at the pinned version (and CoreDNS with its plugins)
  [ -x "$BIN/$1" ] && { [ "$1" != coredns ] || [ "$(cat "$BIN/.coredns-plugins" 2> /dev/null)" = "$COREDNS_PLUGINS" ]; }
}
missing=
for b in $K8S_BINARIES helm coredns; do have "$b" || missing="$missing $b"; done
if [ -z "$missing" ]; then
  echo "build-k8s.sh: cached in $BIN ($K8S_VERSION, helm $HELM_VERSION, coredns $COREDNS_VERSION, $GOV)" >&2
  echo "$BIN"; exit 0
fi
echo "build-k8s.sh: to build:$missing" >&2
wanted() { [[ " $missing " == *" $1 "* ]]; }

export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gobuild GOFLAGS=-mod=mod CGO_ENABLED=0
export GOTOOLCHAIN=local GOMAXPROCS=${GOMAXPROCS:-2}
NICE=${NICE:-15}
W=$CACHE/$KEY/work; mkdir -p "$W/k8s/coredns" "$BIN"
gorun() { local d=$1; shift; (cd "$d" && nice -n "$NICE" go "$@"); }
# gobuild <module dir> <binary> <ldflags> <package>: built beside, then moved in (a binary in $BIN is whole)
gobuild() {
  local tb; tb=$(date +%s)
  echo "build-k8s.sh: building $2" >&2
  gorun "$1" build -trimpath -ldflags "$3" -o "$BIN/.$2.tmp" "$4"
  if command -v file > /dev/null && ! file "$BIN/.$2.tmp" | grep -q 'statically linked'; then
    echo "build-k8s.sh: $2 is not static" >&2; exit 1
  fi
  mv "$BIN/.$2.tmp" "$BIN/$2"
  echo "TIMING build-$2: $(( $(date +%s) - tb )) s" >&2
}
T0=$(date +%s)

# k8s.io/kubernetes replaces its staging modules (k8s.io/api, k8s.io/apiserver, ...) with
# ./staging/src paths, so `go install k8s.io/kubernetes/cmd/...@v` fails. A scratch module that
# requires kubernetes and every staging module at v0.<minor>.<patch> (and replaces each with that
# version), Helm and CoreDNS builds the commands instead.
STAGING_V=v0.${K8S_VERSION#v1.}
if [ ! -s "$W/k8s/go.mod.done" ]; then
  printf 'module mockgpu.test/k8sbuild\n\ngo 1.25\n' > "$W/k8s/go.mod"
  js=$(gorun "$W/k8s" mod download -json "k8s.io/kubernetes@$K8S_VERSION")
  gm=$(sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p' <<< "$js")
  [ -s "$gm" ] || { echo "build-k8s.sh: no go.mod for k8s.io/kubernetes@$K8S_VERSION in: $js" >&2; exit 1; }
  mods=$(sed -n 's#^\s*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\1#p' "$gm" | sort -u)
  gov=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gm" | head -1)
  # The proxy does not serve every staging module (k8s.io/sample-cli-plugin and
  # k8s.io/sample-controller answer 403); no command imports those, so a local stub (a bare
  # go.mod) stands in for each module the proxy refuses.
  {
    printf 'module mockgpu.test/k8sbuild\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n' "$gov" "$K8S_VERSION"
    printf 'require helm.sh/helm/v4 %s\nrequire github.com/coredns/coredns %s\n' "$HELM_VERSION" "$COREDNS_VERSION"
    for m in $mods; do
      if gorun "$W/k8s" mod download "$m@$STAGING_V" 2> /dev/null; then
        echo "require $m $STAGING_V"; echo "replace $m => $m $STAGING_V"
      else
        echo "build-k8s.sh: $m@$STAGING_V is not on the module proxy: a stub stands in" >&2
        mkdir -p "$W/k8s/stub/$m"; printf 'module %s\n\ngo 1.25\n' "$m" > "$W/k8s/stub/$m/go.mod"
        echo "replace $m => ./stub/$m"
      fi
    done
  } > "$W/k8s/go.mod.new"
  mv "$W/k8s/go.mod.new" "$W/k8s/go.mod"
  gorun "$W/k8s" mod download
  cp "$W/k8s/go.mod" "$W/k8s/go.mod.done"
  echo "build-k8s.sh: go.mod: k8s.io/kubernetes $K8S_VERSION + $(wc -w <<< "$mods") staging modules at $STAGING_V, helm $HELM_VERSION, coredns $COREDNS_VERSION (go $gov)" >&2
fi
T1=$(date +%s)
echo "TIMING k8s-modules: $((T1 - T0)) s" >&2

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  LD="$LD -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
for b in $K8S_BINARIES; do wanted "$b" && gobuild "$W/k8s" "$b" "$LD" "k8s.io/kubernetes/cmd/$b"; done
if wanted helm; then
  gobuild "$W/k8s" helm "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" helm.sh/helm/v4/cmd/helm
fi
if wanted coredns; then
  {
    printf '// CoreDNS %s with the plugins %s (tests/k8s-versions.sh).\npackage main\n\nimport (\n' "$COREDNS_VERSION" "$COREDNS_PLUGINS"
    printf '\t"github.com/coredns/coredns/core/dnsserver"\n\t"github.com/coredns/coredns/coremain"\n'
    for p in $COREDNS_PLUGINS; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
    printf ')\n\nfunc main() {\n\tif err := dnsserver.SetDirectives([]string{'
    for p in $COREDNS_PLUGINS; do printf '"%s", ' "$p"; done
    printf '}); err != nil {\n\t\tpanic(err)\n\t}\n\tcoremain.Run()\n}\n'
  } > "$W/k8s/coredns/main.go"
  gobuild "$W/k8s" coredns "-s -w" ./coredns
  echo "$COREDNS_PLUGINS" > "$BIN/.coredns-plugins"
fi
echo "TIMING k8s-build-total: $(( $(date +%s) - T0 )) s" >&2
du -sh "$BIN" "$GOMODCACHE" "$GOCACHE" >&2 || true
if [ "${MGK8S_KEEP_GOCACHE:-0}" != 1 ]; then rm -rf "$GOCACHE"; fi
echo "$BIN"
