#!/usr/bin/env bash
# build.sh CACHE OUT: builds nvmllist (this directory) to OUT with go-nvml as go.sum pins it; the
# module cache and the build cache live in CACHE/go, so a rebuild needs no network and takes
# seconds (the first, go-nvml's cgo part, about a minute).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export GOMODCACHE=$1/go/mod GOCACHE=$1/go/build GOTOOLCHAIN=local
# -modcacherw: the module cache can be deleted like any directory.
export GOFLAGS="-mod=readonly -modcacherw -buildvcs=false"
# go-nvml's cgo part calls the functions the 13.x header marks deprecated: a warning for each.
export CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
go build -o "$2" .
