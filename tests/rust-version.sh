#!/usr/bin/env bash
# rust-version.sh: the workspace's declared `rust-version` is at least the `rust-version` of every
# package in Cargo.lock (cargo builds with a newer compiler without complaint, so a dependency
# update can silently make the declared minimum false).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo metadata --locked --format-version 1 | python3 -c '
import json, sys
meta = json.load(sys.stdin)
ver = lambda v: tuple((list(map(int, v.split("."))) + [0, 0])[:3])
txt = lambda r: ".".join(map(str, r))
ours = {p["id"] for p in meta["packages"] if p["id"] in meta["workspace_members"]}
declared = {p["rust_version"] for p in meta["packages"] if p["id"] in ours}
if len(declared) != 1 or None in declared:
    sys.exit(f"rust-version.sh: the workspace members declare {sorted(map(str, declared))}, not one rust-version")
(declared,) = declared
need = sorted(((ver(p["rust_version"]), p["name"], p["version"]) for p in meta["packages"]
               if p["id"] not in ours and p["rust_version"]), reverse=True)
too_new = [f"{n} {v} needs {txt(r)}" for r, n, v in need if r > ver(declared)]
if too_new:
    sys.exit(f"rust-version.sh: rust-version is {declared}, but " + "; ".join(too_new))
print(f"rust-version.sh: rust-version {declared} covers every locked package (the highest: {need[0][1]} {need[0][2]}, {txt(need[0][0])})")
'
