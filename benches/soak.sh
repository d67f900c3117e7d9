#!/usr/bin/env bash
# Question: does corral stay flat under hours-like load with constant recycling? Runs corral
# (http listener → a static pool of php-cgi workers recycled every MAX_REQUESTS requests) under
# wrk -t1 for DURATION seconds and samples, every STEP seconds: corral's open descriptors,
# RSS and threads, the live worker count, and how many workers have been recycled. Prints the
# curve as a table, then wrk's totals (any non-2xx or socket error is a failure).
#   DURATION=600 STEP=30 bash benches/soak.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CORRAL=${CORRAL:-target/release/corral}
DURATION=${DURATION:-600}
STEP=${STEP:-30}
MAX_REQUESTS=${MAX_REQUESTS:-300}
CONNS=${CONNS:-8}
[ -x "$CORRAL" ] || cargo build --release --quiet
scratch=$(mktemp -d /tmp/corral-soak.XXXXXX)
chmod 755 "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
status=$(free_port)
mkdir -p "$scratch/www"
echo '<?php echo str_repeat("x", 2048);' > "$scratch/www/x.php"
chmod -R a+rX "$scratch/www"
cat > "$scratch/c.toml" <<TOML
[server]
runtime_dir = "$scratch/run"
log_level = "warn"
[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[status]
address = "127.0.0.1:$status"
[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2
max_requests = $MAX_REQUESTS
[[contexts]]
root = "$scratch/www"
pool = "php"
TOML
"$CORRAL" run -c "$scratch/c.toml" 2>"$scratch/corral.log" &
corral=$!
pids+=("$corral")
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/x.php" && break; sleep 0.1; done
wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$port/x.php" >"$scratch/wrk.txt" &
wrk=$!
pids+=("$wrk")
sample() {
  local fds rss threads workers accepted
  fds=$(ls "/proc/$corral/fd" | wc -l)
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$corral/status")
  threads=$(awk '/Threads/ {print $2}' "/proc/$corral/status")
  workers=$(pgrep -c -P "$corral" php-cgi || true)
  accepted=$(curl -s "http://127.0.0.1:$status/status" | awk -F: '/^accepted conn/ {gsub(/ /,"",$2); print $2}')
  printf '%6s %6s %9s %8s %8s %10s\n' "$1" "$fds" "$rss" "$threads" "$workers" "$accepted"
}
printf '%6s %6s %9s %8s %8s %10s\n' "t (s)" fds "RSS KiB" threads workers requests
t=0
sample "$t"
while kill -0 "$wrk" 2>/dev/null && [ "$t" -lt "$DURATION" ]; do
  sleep "$STEP"
  t=$((t + STEP))
  sample "$t"
done
wait "$wrk" || true
echo
cat "$scratch/wrk.txt"
echo "workers recycled (from /metrics):"
curl -s "http://127.0.0.1:$status/metrics" | grep 'worker_recycles_total' | grep -v '^#' || true
echo "corral warnings and errors logged: $(grep -cE ' (WARN|ERROR) ' "$scratch/corral.log" || true)"
