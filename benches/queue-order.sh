#!/usr/bin/env bash
# Question: in what order does corral serve the requests that wait for a slot, and what does
# the number of serving threads cost the PHP workers? A PHP script that sleeps SLEEP_MS (20)
# spends its time waiting, not computing, so its latencies under load are set by the order of
# the queue, not by the CPU the machine has left: with C clients on 2 workers every request
# waits for about C / 2 others, and a queue served in arrival order gives p99 close to p50.
# SCRIPT=hello runs a hello world instead: then corral's and PHP's CPU are the load, and the
# rows compare req/s and corral's CPU per request.
#
# Rows: nginx -> php-fpm (pm = static, 2 children) for reference, and each corral given as
# NAME=BINARY[:THREADS] (THREADS empty = corral's default), its http listener -> a php-cgi pool
# (static, 2 workers); wrk -t1 -cC --latency -d SECS interleaved per round (ROUNDS), after a
# 2 s warm-up each; p50, p90, p99 and max per round, and corral's CPU per request
# (/proc/PID/task/*/schedstat).
#
#   bash benches/queue-order.sh main=target/release/corral:2 new=/tmp/corral
#   SCRIPT=hello C=25 bash benches/queue-order.sh a=old/corral:1 b=old/corral:2
# Env: SECS (10), ROUNDS (3), C (10), SLEEP_MS (20), SCRIPT (sleep or hello), OUT (default
# benches/RESULTS.md, section `queue-order` or `queue-order-hello`; OUT= prints only).
# Needs root (the workers run as www-data), php-cgi, php-fpm8.2, nginx, wrk.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="SECS ROUNDS C SLEEP_MS SCRIPT"
results_start "$@"
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-3}
C=${C:-10}
SLEEP_MS=${SLEEP_MS:-20}
SCRIPT=${SCRIPT:-sleep}
[ $# -ge 1 ] || { echo "usage: bash benches/queue-order.sh NAME=BINARY[:THREADS]..." >&2; exit 2; }
s=$(mktemp -d /tmp/corral-qorder.XXXXXX)
chmod 755 "$s"
pids=()
cleanup() {
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null || true; done
  rm -rf "$s"
}
trap cleanup EXIT
case $SCRIPT in
  sleep) printf '<?php usleep(%d); echo "ok\\n";\n' $((SLEEP_MS * 1000)) > "$s/q.php" ;;
  hello) printf '<?php echo "hello\\n";\n' > "$s/q.php" ;;
  *) echo "SCRIPT is sleep or hello" >&2; exit 2 ;;
esac
chmod 644 "$s/q.php"
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2> /dev/null | awk '{t += $1} END {printf "%d", t}'; }
wait_port() { for _ in $(seq 200); do curl -sf -o /dev/null "http://127.0.0.1:$1/q.php" && return 0; sleep 0.05; done; echo "nothing answers on $1" >&2; tail -n 5 "$s"/*.log >&2; exit 1; }

declare -A port cpid
rows="fpm"
port[fpm]=18970
cat > "$s/fpm.conf" << CONF
[global]
pid = $s/fpm.pid
error_log = $s/fpm.log
daemonize = no
[www]
user = www-data
group = www-data
listen = $s/fpm.sock
listen.owner = www-data
pm = static
pm.max_children = 2
CONF
php-fpm8.2 -F -y "$s/fpm.conf" & pids+=($!)
cat > "$s/nginx.conf" << CONF
user www-data; worker_processes 1; daemon off; pid $s/nginx.pid; error_log $s/nginx.log;
events {}
http { access_log off; server { listen 127.0.0.1:${port[fpm]}; root $s;
  location ~ \.php\$ { include /etc/nginx/fastcgi_params;
    fastcgi_param SCRIPT_FILENAME \$document_root\$fastcgi_script_name; fastcgi_pass unix:$s/fpm.sock; } } }
CONF
nginx -c "$s/nginx.conf" & pids+=($!)
n=1
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}; bin=$(realpath "${rest%%:*}"); threads=""
  [ "$rest" = "${rest#*:}" ] || threads=${rest#*:}
  port[$name]=$((18970 + n)); n=$((n + 1))
  cat > "$s/$name.toml" << CONF
[server]
runtime_dir = "$s/$name.d"
log_level = "warn"
user = "www-data"
group = "www-data"
${threads:+threads = $threads}
[[listen]]
address = "127.0.0.1:${port[$name]}"
protocol = "http"
[pools.php]
command = ["php-cgi"]
mode = "static"
max = 2
[[contexts]]
root = "$s"
pool = "php"
CONF
  "$bin" run -c "$s/$name.toml" > "$s/$name.log" 2>&1 & pids+=($!)
  cpid[$name]=$!
  rows+=" $name"
  echo "$name: $bin${threads:+, threads = $threads}" >> "$s/rows.txt"
done
for r in $rows; do wait_port "${port[$r]}"; done
for r in $rows; do wrk -t1 -c"$C" -d2s "http://127.0.0.1:${port[$r]}/q.php" > /dev/null; done
res=$s/results.txt
for round in $(seq "$ROUNDS"); do
  for r in $rows; do
    t0=0; [ -z "${cpid[$r]:-}" ] || t0=$(cpu_ns "${cpid[$r]}")
    out=$(wrk -t1 -c"$C" -d"${SECS}s" --latency "http://127.0.0.1:${port[$r]}/q.php")
    t1=0; [ -z "${cpid[$r]:-}" ] || t1=$(cpu_ns "${cpid[$r]}")
    reqs=$(awk '/requests in/ {print $1}' <<< "$out")
    read -r errs touts < <(wrk_errors <<< "$out")
    cpu="—"; [ -z "${cpid[$r]:-}" ] || cpu=$(( (t1 - t0) / 1000 / reqs ))
    printf '| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$r" "$round" "$(bc -l <<< "$reqs / $SECS")" \
      "$(awk '$1 == "50%" {print $2}' <<< "$out")" "$(awk '$1 == "90%" {print $2}' <<< "$out")" \
      "$(awk '$1 == "99%" {print $2}' <<< "$out")" "$(awk '$1 == "Latency" {print $4}' <<< "$out")" \
      "$cpu" "$errs" "$touts" "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$res" >&2
  done
done
{
  if [ "$SCRIPT" = sleep ]; then what="a PHP script sleeping ${SLEEP_MS} ms"; else what="PHP's hello world"; fi
  echo "$what, 2 PHP workers per row: \`fpm\` = nginx (1 worker) → php-fpm8.2 pm = static; the others corral's http"
  echo "listener → a php-cgi pool (static, max = 2):"
  echo
  sed 's/^/- /' "$s/rows.txt"
  echo
  echo "wrk -t1 -c$C --latency -d${SECS}s, $ROUNDS rounds interleaved after a 2 s warm-up per row; corral µs/req from"
  echo "/proc/PID/task/*/schedstat; load = the 1-minute load average after the run."
  echo
  echo "| row | round | req/s | p50 | p90 | p99 | max | corral µs/req | errors | timeouts | load |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
  sort -s -t'|' -k2,2 "$res"
} > "$s/report.md"
cat "$s/report.md"
section=queue-order
[ "$SCRIPT" = sleep ] || section=queue-order-$SCRIPT
results_write "$section" "The slot queue's order and the serving threads: $SCRIPT, c=$C" "$s/report.md"
