#!/usr/bin/env bash
# Question: what does the access log cost per request? Two corrals (release build) serve the
# same null FastCGI backend over HTTP, one with `access_log` to a file and one without; wrk -t1
# loads them in turn (ROUNDS times each, interleaved, the machine is noisy), and each corral's
# CPU time (utime + stime from /proc/PID/stat) over a round gives CPU µs per request.
# Usage: bash benches/access-log.sh [SECONDS] [ROUNDS]   (defaults 5 and 3; c=25)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-5}"
rounds="${2:-3}"
corral=target/release/corral
[ -x "$corral" ] || cargo build --release --quiet
scratch="$(mktemp -d)"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$scratch"; }
trap cleanup EXIT

"$corral" null-backend --protocol fastcgi --listen "unix:$scratch/null.sock" & pids+=($!)
config() { # NAME PORT EXTRA
  mkdir -p "$scratch/$1"
  cat >"$scratch/$1.toml" <<EOF
[server]
runtime_dir = "$scratch/$1"
log_level = "warn"
$3

[[listen]]
address = "127.0.0.1:$2"
protocol = "http"

[pools.null]
servers = ["unix:$scratch/null.sock"]
concurrency = 64
max_conns = 64

[[contexts]]
pool = "null"
EOF
}
config plain 18481 ""
config logged 18482 "access_log = \"$scratch/access.log\""
"$corral" run -c "$scratch/plain.toml" >/dev/null 2>&1 & plain=$!; pids+=($plain)
"$corral" run -c "$scratch/logged.toml" >/dev/null 2>&1 & logged=$!; pids+=($logged)
for port in 18481 18482; do
  for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"
run() { # NAME PID PORT
  local before after out reqs
  before="$(ticks "$2")"
  out="$(wrk -t1 -c25 -d"${secs}s" "http://127.0.0.1:$3/" 2>&1)"
  after="$(ticks "$2")"
  reqs="$(awk '/requests in/ {print $1}' <<<"$out")"
  awk -v n="$1" -v r="$reqs" -v t="$((after - before))" -v hz="$hz" -v s="$secs" \
    'BEGIN { printf "%-8s %8.0f req/s  corral %6.2f us CPU/request\n", n, r / s, t / hz * 1e6 / r }'
}
for _ in $(seq "$rounds"); do
  run plain "$plain" 18481
  run logged "$logged" 18482
done
echo "access log lines written: $(wc -l <"$scratch/access.log")"
