#!/usr/bin/env bash
# The one test command: installs the real peers (scripts/setup-peers.sh),
# then runs every test of the workspace, clippy with warnings denied, and the
# rustfmt check. Exits non-zero on the first failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

section() {
    printf '\n==== %s ====\n' "$*"
}

start=$SECONDS

section "peers (scripts/setup-peers.sh)"
bash scripts/setup-peers.sh

section "cargo test --workspace --locked"
cargo test --workspace --locked

section "cargo clippy --workspace --all-targets --locked -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

section "cargo fmt --all --check"
cargo fmt --all --check

section "all passed in $((SECONDS - start)) s"
