#!/usr/bin/env bash
# Questions: how long from "no worker" to the first answer (php-cgi, lsphp), and does a pool
# give its memory back when load stops? Measures, through corral's http listener:
#   1. the first request to an idle on-demand pool (spawn + ready + request), 5 times each
#      for php-cgi and lsphp, after the pool has gone back to zero;
#   2. a dynamic php-cgi pool (min 1, max 16, idle_timeout 2s) under wrk -c32 load and 5 s
#      after the load stops: worker count and summed PSS of the workers.
# Loopback only; every process it starts it stops. Needs php-cgi, lsphp, wrk, curl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CORRAL=${CORRAL:-target/release/corral}
LSPHP=${LSPHP:-/var/cache/corral/lsphp-8.2/lsphp}
[ -x "$CORRAL" ] || cargo build --release --quiet
scratch=$(mktemp -d /tmp/corral-sup.XXXXXX)
chmod 755 "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkdir -p "$scratch/www" "$scratch/run"
echo '<?php echo "Hello, world\n";' > "$scratch/www/hello.php"
chmod 644 "$scratch/www/hello.php"

children() { # pids of the live processes whose parent is $1
  local parent=$1 s line rest
  for s in /proc/[0-9]*/stat; do
    read -r line < "$s" 2>/dev/null || continue
    rest=${line##*) }
    read -r state ppid _ <<< "$rest"
    [ "$ppid" = "$parent" ] && [ "$state" != Z ] && { p=${s#/proc/}; echo "${p%/stat}"; }
  done
  return 0
}
pss_sum() { # summed PSS in MiB of the given pids
  local total=0
  for p in "$@"; do
    v=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)
    total=$((total + ${v:-0}))
  done
  awk -v t="$total" 'BEGIN {printf "%.1f", t/1024}'
}

start_corral() { # $1 = pool lines; sets $corral and $port
  port=$(free_port)
  cat > "$scratch/corral.toml" <<CONF
[server]
runtime_dir = "$scratch/run"
log_level = "warn"
[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[pools.php]
$1
[[contexts]]
pool = "php"
root = "$scratch/www"
CONF
  "$CORRAL" run -c "$scratch/corral.toml" >/dev/null 2>"$scratch/corral.log" & corral=$!; pids+=($corral)
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
}
stop_corral() { kill "$corral"; wait "$corral" 2>/dev/null || true; }

for kind in php-cgi lsphp; do
  if [ "$kind" = php-cgi ]; then cmd='command = ["php-cgi"]'; else cmd="protocol = \"lsapi\"
command = [\"$LSPHP\", \"-n\"]"; fi
  start_corral "$cmd
mode = \"ondemand\"
max = 2
idle_timeout = \"1s\""
  times=()
  for i in 1 2 3 4 5; do
    while [ -n "$(children "$corral")" ]; do sleep 0.1; done   # back to zero workers
    t=$(curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$port/hello.php")
    times+=("$(awk -v t="$t" 'BEGIN {printf "%.1f", t*1000}')")
  done
  warm=$(curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$port/hello.php")
  echo "$kind on-demand first request (spawn + ready + answer), ms: ${times[*]}; a warm request: $(awk -v t="$warm" 'BEGIN {printf "%.2f", t*1000}') ms"
  stop_corral
done

start_corral 'command = ["php-cgi"]
mode = "dynamic"
min = 1
max = 16
spare_min = 1
spare_max = 2
idle_timeout = "2s"
max_conns = 16'
wrk -t1 -c32 -d6s "http://127.0.0.1:$port/hello.php" > "$scratch/wrk.txt" &
wrk_pid=$!
sleep 4
w=$(children "$corral"); n=$(echo "$w" | wc -w)
echo "dynamic php-cgi pool under wrk -c32: $n workers, summed PSS $(pss_sum $w) MiB ($(awk '/Requests\/sec/ {print $2}' "$scratch/wrk.txt" 2>/dev/null) req/s so far)"
wait "$wrk_pid"
echo "  wrk: $(awk '/Requests\/sec/ {print $2 " req/s"}' "$scratch/wrk.txt")"
sleep 5
w=$(children "$corral"); n=$(echo "$w" | wc -w)
echo "5 s after the load stopped: $n workers, summed PSS $(pss_sum $w) MiB; corral itself $(awk '/VmRSS/ {print $2/1024 " MiB RSS"}' /proc/$corral/status)"
stop_corral
