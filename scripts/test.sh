#!/usr/bin/env bash
# The one test command: installs the real peers (scripts/setup-peers.sh),
# then runs every test of the workspace, clippy with warnings denied, the
# rustfmt check, the documentation with rustdoc's warnings denied (broken
# intra-doc links, public docs linking private items, code blocks that do
# not parse), the check of the results writer (benches/lib/check.sh),
# and a bounded fuzzing run of every fuzz target (scripts/fuzz.sh). Exits
# non-zero on the first failing section; the tests run to the end
# (--no-fail-fast) so that one run names every failing test.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

section() {
    printf '\n==== %s ====\n' "$*"
}

start=$SECONDS

# No incremental caches: a run builds every test binary once, and the caches
# would add gigabytes under target/ (see [profile.dev] in Cargo.toml). The
# free space is printed so that a full disk shows in the log before it fails.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
df -h . | sed 's/^/[disk] /'

section "peers (scripts/setup-peers.sh)"
bash scripts/setup-peers.sh

section "cargo test --workspace --locked --no-fail-fast"
cargo test --workspace --locked --no-fail-fast

section "cargo clippy --workspace --all-targets --locked -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

section "cargo fmt --all --check"
cargo fmt --all --check

section "RUSTDOCFLAGS=\"-D warnings\" cargo doc --workspace --no-deps --locked"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

section "benches/lib/check.sh (the writer of benches/RESULTS.md's sections)"
bash benches/lib/check.sh

# Fuzzing, last: FUZZ_SECONDS per target (10 targets). Measured on 2 cores:
# installing cargo-fuzz 1 min (once per ~/.cargo cache), building the targets
# 8 min cold (20 s when protocols/fuzz/target is cached), then 10 x 20 s, so
# about 13 minutes cold next to the ~10 of peers and tests. FUZZ_BUDGET is a
# hard cap on the whole section, far under the CI job's 90 minutes.
FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
FUZZ_BUDGET="${FUZZ_BUDGET:-1800}"
section "fuzz every target for $FUZZ_SECONDS s (scripts/fuzz.sh, at most $FUZZ_BUDGET s)"
FUZZ_SECONDS="$FUZZ_SECONDS" timeout "$FUZZ_BUDGET" bash scripts/fuzz.sh

section "all passed in $((SECONDS - start)) s"
