#!/usr/bin/env bash
# Builds corral with profile-guided optimisation (PGO): an instrumented build serves a
# training load, and the profile it wrote guides a second release build, which lays each hot
# path out in one piece and inlines and unrolls by what really ran. On the http → null FastCGI
# path that is about a fifth fewer instructions and a quarter fewer code lines per request than
# `cargo build --release` (docs/decisions.md, decision 40; benches/RESULTS.md, "callgrind-http-pgo").
#
#   bash scripts/build-pgo.sh        # the binary's path is the last line: target/pgo/release/corral
#   bash scripts/build-pgo.sh --train BINARY   # only the training load, served by BINARY
#                                              # (tests/build_pgo.rs: the load still runs clean)
#
# The training load (`train` below) is corral's own: `corral null-backend` behind pools of each
# backend protocol (FastCGI, SCGI, LSAPI), and `corral bench` through each front listener
# (HTTP with and without keep-alive, FastCGI, SCGI), with a PHP-style context (a root, the
# script guard, static files, a request body) and an app mount; nothing else is needed. What the
# load does not run is laid out as cold: a path that matters must be in it. Every run of the load
# must answer every request without an error, or the script stops.
#
# Needs llvm-profdata of the LLVM version rustc was built with (`rustc -vV`): rustup's
# llvm-tools component, or Debian's llvm-N package (`apt-get install llvm-22` for rustc 1.95).
# Env: PROFDATA (that program's path, if it is elsewhere), TRAIN_SECS (2: each load's length).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
train_only=""
case "${1:-}" in
--train) train_only=$(realpath "${2:?--train needs the corral binary to train}") ;;
"") ;;
*) echo "build-pgo.sh: unknown argument '$1'" >&2; exit 64 ;;
esac
secs=${TRAIN_SECS:-2}
work=$(mktemp -d /tmp/corral-pgo.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# One `corral bench` run of the load: its table must show requests and no error at each level.
bench() {
    local out
    out=$("$@") || { echo "build-pgo.sh: failed: $*" >&2; return 1; }
    echo "$out"
    awk '$2 ~ /^[0-9]+$/ && NF >= 11 { n++; if ($3 == 0 || $10 != 0) bad++ }
         END { exit (n == 0 || bad > 0) }' <<< "$out" \
        || { echo "build-pgo.sh: a run of the training load failed or had errors: $*" >&2; return 1; }
}

# The training load, served by the corral binary $1.
train() {
    local c=$1 port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$work/www/static" "$work/run"
    echo '<?php echo "hello";' > "$work/www/index.php"
    head -c 1700 /dev/zero | tr '\0' a > "$work/www/static/page.css"  # 1.7 KiB, about benches/static.sh's file
    for proto in fastcgi scgi lsapi; do
        "$c" null-backend --protocol "$proto" --listen "unix:$work/null-$proto.sock" > /dev/null 2>&1 &
        pids+=($!)
    done
    cat > "$work/corral.toml" <<EOF
[server]
runtime_dir = "$work/run"
log_level = "warn"

[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[[listen]]
address = "unix:$work/front-fastcgi.sock"
protocol = "fastcgi"
[[listen]]
address = "unix:$work/front-scgi.sock"
protocol = "scgi"

[pools.php]
servers = ["unix:$work/null-fastcgi.sock"]
concurrency = 64
[pools.scgi]
servers = ["unix:$work/null-scgi.sock"]
protocol = "scgi"
concurrency = 64
[pools.lsapi]
servers = ["unix:$work/null-lsapi.sock"]
protocol = "lsapi"
concurrency = 64

[[contexts]]
prefix = "/scgi"
pool = "scgi"
[[contexts]]
prefix = "/lsapi"
pool = "lsapi"
[[contexts]]
prefix = "/app"
pool = "php"
[[contexts]]
root = "$work/www"
static_files = true
pool = "php"
EOF
    for _ in $(seq 100); do
        [ -S "$work/null-fastcgi.sock" ] && [ -S "$work/null-scgi.sock" ] && [ -S "$work/null-lsapi.sock" ] && break
        sleep 0.05
    done
    "$c" run -c "$work/corral.toml" > "$work/corral.log" 2>&1 &
    local corral=$!
    pids+=("$corral")
    for _ in $(seq 200); do
        curl -sf -o /dev/null "http://127.0.0.1:$port/index.php" && break
        sleep 0.05
    done
    local b=(bench "$c" bench --duration "${secs}s" --warmup 0s --concurrency 1,16)
    local http=(--protocol http --target "127.0.0.1:$port")
    "${b[@]}" "${http[@]}" --path /index.php --keepalive on || return 1
    "${b[@]}" "${http[@]}" --path /index.php --keepalive off || return 1
    "${b[@]}" "${http[@]}" --path /index.php --method POST --body-size 4096 --keepalive on || return 1
    "${b[@]}" "${http[@]}" --path /static/page.css --keepalive on || return 1
    "${b[@]}" "${http[@]}" --path /app/some/path --keepalive on || return 1
    "${b[@]}" "${http[@]}" --path /scgi/x --keepalive on || return 1
    "${b[@]}" "${http[@]}" --path /lsapi/x --keepalive on || return 1
    "${b[@]}" --protocol fastcgi --target "unix:$work/front-fastcgi.sock" --path /index.php \
        --script-filename "$work/www/index.php" --keepalive off || return 1
    "${b[@]}" --protocol fastcgi --target "unix:$work/front-fastcgi.sock" --path /index.php \
        --script-filename "$work/www/index.php" --keepalive on || return 1
    "${b[@]}" --protocol scgi --target "unix:$work/front-scgi.sock" --path /index.php \
        --script-filename "$work/www/index.php" || return 1
    # The profile is written when the process exits.
    kill -TERM "$corral"
    wait "$corral"
}
if [ -n "$train_only" ]; then
    train "$train_only"
    exit
fi

major=$(rustc -vV | awk '/^LLVM version:/ { split($3, v, "."); print v[1] }')
if [ -z "${PROFDATA:-}" ]; then
    for p in "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata "/usr/lib/llvm-$major/bin/llvm-profdata"; do
        [ -x "$p" ] && { PROFDATA=$p; break; }
    done
fi
if [ -z "${PROFDATA:-}" ]; then
    echo "build-pgo.sh: no llvm-profdata for LLVM $major (rustc's): 'rustup component add llvm-tools'" \
        "or 'apt-get install llvm-$major', or set PROFDATA" >&2
    exit 69
fi

# 1. The instrumented build. Its own target directory: flags that differ from the plain
# release build's would otherwise rebuild target/release from scratch each time.
echo "build-pgo.sh: the instrumented build (target/pgo-generate)" >&2
RUSTFLAGS="-Cprofile-generate=$work/raw" CARGO_TARGET_DIR="$repo/target/pgo-generate" \
    cargo build --release --bin corral

# 2. The training load; the profile is written as each process exits.
echo "build-pgo.sh: the training load" >&2
train "$repo/target/pgo-generate/release/corral" > "$work/train.log" 2>&1 \
    || { cat "$work/train.log" "$work/corral.log" >&2; exit 1; }
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()
"$PROFDATA" merge -o "$work/corral.profdata" "$work/raw"

# 3. The optimised build.
echo "build-pgo.sh: the optimised build (target/pgo)" >&2
RUSTFLAGS="-Cprofile-use=$work/corral.profdata" CARGO_TARGET_DIR="$repo/target/pgo" \
    cargo build --release --bin corral
echo "$repo/target/pgo/release/corral"
