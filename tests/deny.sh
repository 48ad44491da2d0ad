#!/usr/bin/env bash
# deny.sh: cargo-deny's checks of the dependency tree against deny.toml (licenses, duplicate
# versions, sources), installing the pinned cargo-deny into ~/.cargo/bin when it is missing.
#   deny.sh                the lint step's checks: licenses bans sources
#   deny.sh CHECK...       those checks instead; `advisories` fetches RustSec's advisory database
#                          from github.com, so it needs that host
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CARGO_DENY_VERSION=0.20.2
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  echo "deny.sh: installing cargo-deny $CARGO_DENY_VERSION" >&2
  cargo install --locked "cargo-deny@$CARGO_DENY_VERSION"
fi
[ $# -gt 0 ] || set -- licenses bans sources
cargo deny --locked check "$@"
