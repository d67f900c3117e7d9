#!/usr/bin/env bash
# Fuzzes every target of protocols/fuzz for a bounded time, on the stable toolchain.
#
#   FUZZ_SECONDS=20 bash scripts/fuzz.sh            # every target, 20 s each (the default)
#   FUZZ_TARGETS="front_listener" bash scripts/fuzz.sh
#
# cargo-fuzz is installed from crates.io when missing (into ~/.cargo/bin, which a CI cache
# keeps; the targets' build lands in protocols/fuzz/target, also worth caching). It needs
# nightly-only flags (-Zsanitizer, -Cpasses=sancov-module, ...): RUSTC_BOOTSTRAP=1 lets the
# stable compiler accept them, so no nightly toolchain is needed. Every target is built and
# run with the address sanitizer, checked in each binary; a host that cannot fails the run.
#
# Each target starts from its committed corpus (protocols/fuzz/corpus/TARGET, read only: new
# inputs go to a scratch directory, so a run never dirties the tree). A crash input is kept
# under protocols/fuzz/artifacts/TARGET/ and fails the run; copy it into the target's corpus
# once fixed, so protocols/tests/fuzz_corpus.rs replays it forever. The executions of every
# target are printed as one table at the end.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../protocols/fuzz"

FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
CARGO_FUZZ_VERSION="${CARGO_FUZZ_VERSION:-0.13.2}"
# Per input: a hang longer than this is reported as a crash (a timeout artifact).
FUZZ_INPUT_TIMEOUT="${FUZZ_INPUT_TIMEOUT:-30}"
export RUSTC_BOOTSTRAP=1

log() { printf '[fuzz] %s\n' "$*"; }
start=$SECONDS

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io"
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi
log "$(cargo fuzz --version), $(rustc --version)"

# rustfmt of the fuzz crate: it is outside the workspace, so `cargo fmt --all` skips it.
cargo fmt --check

triple="$(rustc -vV | sed -n 's/^host: //p')"
# Only with the address sanitizer: `-Zsanitizer=address` works on stable with
# RUSTC_BOOTSTRAP=1 because rustc ships the ASan runtime for x86_64-unknown-linux-gnu, and it
# turns out-of-bounds reads and use-after-free in unsafe code (ours: none; our dependencies':
# some) into crashes instead of silent reads. A run without it would stay green while
# checking less than it says, so there is no fallback: a host that cannot build with ASan
# fails here, naming what is missing.
fail() { log "FAILED: $*"; exit 1; }
case "$triple" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) ;;
    *) fail "rustc ships no address-sanitizer runtime for $triple: fuzz on x86_64 or aarch64 Linux" ;;
esac
sysroot_lib="$(rustc --print sysroot)/lib/rustlib/$triple/lib"
compgen -G "$sysroot_lib/librustc-*_rt.asan.a" >/dev/null ||
    fail "no address-sanitizer runtime (librustc-*_rt.asan.a) in $sysroot_lib: a minimal rustup profile or a distribution rustc without it cannot fuzz with ASan"
# libfuzzer-sys compiles libFuzzer itself, which is C++.
if ! command -v c++ >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing g++ (libfuzzer-sys compiles libFuzzer)"
        apt-get install -y -qq --no-install-recommends g++ >/tmp/corral-fuzz-apt.log 2>&1 ||
            { apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ \
                >/tmp/corral-fuzz-apt.log 2>&1; } ||
            { tail -n 40 /tmp/corral-fuzz-apt.log >&2; fail "cannot install g++"; }
    else
        fail "no C++ compiler (c++): libfuzzer-sys compiles libFuzzer; install g++"
    fi
fi
sanitizer=address
build_start=$SECONDS
cargo fuzz build --release --sanitizer address ||
    fail "the build with the address sanitizer failed on $triple (see above)"
log "built with sanitizer=$sanitizer in $((SECONDS - build_start)) s"

targets="${FUZZ_TARGETS:-$(cargo fuzz list)}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
bins="target/$triple/release"

failed=0
rows=()
for t in $targets; do
    # The instrumentation is in the binary, or this run checks less than it says.
    grep -qa __asan_init "$bins/$t" || fail "$bins/$t was built without the address sanitizer"
    mkdir -p "artifacts/$t" "corpus/$t" "$scratch/$t" "$scratch/tmp"
    out="$scratch/$t.log"
    log "fuzzing $t for $FUZZ_SECONDS s"
    status=ok
    # -print_final_stats=1 prints stat::number_of_executed_units at the end. The scratch
    # directory comes first: libFuzzer writes new inputs into the first corpus directory.
    # TMPDIR too: a target's fixture (front_listener's sockets and scripts) is never
    # removed by the target, which libFuzzer ends with `exit`.
    if ! TMPDIR="$scratch/tmp" "$bins/$t" -max_total_time="$FUZZ_SECONDS" -timeout="$FUZZ_INPUT_TIMEOUT" \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
        "$scratch/$t" "corpus/$t" >"$out" 2>&1; then
        status=CRASH
        failed=1
        tail -n 60 "$out" >&2
        log "$t: crash input(s) kept: $(find "artifacts/$t" -type f | tr '\n' ' ')"
    fi
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n 1)"
    if [ -z "$execs" ]; then
        execs="$(sed -n 's/^#\([0-9]*\).*DONE.*/\1/p' "$out" | tail -n 1)"
    fi
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out" | tail -n 1)"
    rows+=("$(printf '%-20s %12s %10s  %s' "$t" "${execs:-?}" "${rate:-?}" "$status")")
done

printf '\n%-20s %12s %10s  %s\n' target executions exec/s result
for row in "${rows[@]}"; do
    printf '%s\n' "$row"
done
log "sanitizer=$sanitizer, ${FUZZ_SECONDS} s per target, $((SECONDS - start)) s in all"
if [ "$failed" != 0 ]; then
    log "crashes found: inputs under protocols/fuzz/artifacts/"
    exit 1
fi
