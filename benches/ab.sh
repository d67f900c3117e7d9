#!/usr/bin/env bash
# Question: is one corral binary cheaper per request than another? Two corrals (A and B, e.g.
# the last release build of main and a change) serve the same null FastCGI backend side by
# side; wrk -t1 loads each path of each in turn, interleaved, ROUNDS times, and each corral's
# CPU time (utime + stime from /proc/PID/stat) over its runs gives CPU µs per request.
#   paths: nginx plain fastcgi_pass -> corral fastcgi listener (a new connection per request),
#          nginx fastcgi_keep_conn -> corral fastcgi listener, wrk -> corral http listener,
#          and the same with `Connection: close` (a new client connection per request, as
#          nginx's `proxy_pass` without upstream keep-alive makes); nginx's own http listener
#          (`fastcgi_keep_conn` to the same null backend) is measured on the last two as a
#          reference, its CPU in the corral columns.
# Usage: bash benches/ab.sh A_BINARY B_BINARY   (env: SECS=5 ROUNDS=3 CONC=25 THREADS_A/B)
# THREADS_A / THREADS_B set `[server] threads` of each (default: unset, one per CPU), so the
# same binary can be measured against itself with 1 and 2 runtime threads; SCHED_A / SCHED_B
# set `[server] scheduler` ("per-thread" or "work-stealing"; default: unset, corral's default).
# wrk's errors and timeouts are counted per path and binary; a path with any prints — for
# B/A. The table goes to stdout and to the `ab` section of OUT (default benches/RESULTS.md;
# OUT= prints only; RESULTS_SECTION=ab-NAME keeps another comparison beside it;
# benches/lib/results.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="SECS ROUNDS CONC THREADS_A THREADS_B SCHED_A SCHED_B"
results_start "$@"
a_bin=$(realpath "$1")
b_bin=$(realpath "$2")
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
CONC=${CONC:-25}
s=$(mktemp -d /tmp/corral-ab.XXXXXX)
chmod 755 "$s"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] && { tail -n 20 "$s"/*.log >&2; }; rm -rf "$s"; }
trap cleanup EXIT
"$b_bin" null-backend --protocol fastcgi --listen "unix:$s/null.sock" & pids+=($!)
for _ in $(seq 100); do [ -S "$s/null.sock" ] && break; sleep 0.05; done
chmod 666 "$s/null.sock"
conf() { # NAME HTTP_PORT THREADS SCHEDULER
  local sched=""
  [ -n "$4" ] && sched="scheduler = \"$4\""
  cat > "$s/$1.toml" <<EOF
[server]
runtime_dir = "$s/$1.d"
log_level = "warn"
${3:+threads = $3}
$sched
[[listen]]
address = "127.0.0.1:$2"
protocol = "http"
[[listen]]
address = "unix:$s/$1.sock"
protocol = "fastcgi"
mode = "0666"
[pools.null]
servers = ["unix:$s/null.sock"]
concurrency = 128
[[contexts]]
pool = "null"
EOF
}
conf a 18801 "${THREADS_A:-}" "${SCHED_A:-}"
conf b 18802 "${THREADS_B:-}" "${SCHED_B:-}"
"$a_bin" run -c "$s/a.toml" > "$s/a.log" 2>&1 & a_pid=$!; pids+=($a_pid)
"$b_bin" run -c "$s/b.toml" > "$s/b.log" 2>&1 & b_pid=$!; pids+=($b_pid)
cat > "$s/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $s/nginx.pid;
error_log $s/nginx.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $s/nginx; fastcgi_temp_path $s/nginx; proxy_temp_path $s/nginx; scgi_temp_path $s/nginx; uwsgi_temp_path $s/nginx;
  upstream a_k { server unix:$s/a.sock; keepalive 16; }
  upstream b_k { server unix:$s/b.sock; keepalive 16; }
  upstream null_k { server unix:$s/null.sock; keepalive 16; }
  server { listen 127.0.0.1:18811; location / { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/a.sock; } }
  server { listen 127.0.0.1:18812; location / { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/b.sock; } }
  server { listen 127.0.0.1:18821; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass a_k; } }
  server { listen 127.0.0.1:18822; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass b_k; } }
  server { listen 127.0.0.1:18831; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass null_k; } }
}
EOF
nginx -c "$s/nginx.conf" & nginx=$!; pids+=($nginx)
for port in 18801 18802 18811 18812 18821 18822 18831; do
  for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$port/x" && break; sleep 0.05; done
done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Context switches of every thread of $1 (voluntary: it slept; the wake-ups a design saves).
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ {n += $2} END {print n + 0}'; }
nginx_ticks() { local t=0 p; for p in $(pgrep -P "$nginx") "$nginx"; do t=$((t + $(ticks "$p"))); done; echo $t; }
hz=$(getconf CLK_TCK)
declare -A reqs cpu ncpu csw errs

run() { # KEY PID URL [WRK-ARGS...]
  local b nb out n
  b=$(ticks "$2"); nb=$(nginx_ticks); local sw; sw=$(switches "$2")
  out=$(wrk -t1 -c"$CONC" -d"${SECS}s" "${@:4}" "$3" 2>&1)
  n=$(awk '/requests in/ {print $1}' <<< "$out")
  reqs[$1]=$(( ${reqs[$1]:-0} + ${n:-0} ))
  local e to; read -r e to < <(wrk_errors <<< "$out")
  errs[$1]=$(( ${errs[$1]:-0} + e + to ))
  cpu[$1]=$(( ${cpu[$1]:-0} + $(ticks "$2") - b ))
  ncpu[$1]=$(( ${ncpu[$1]:-0} + $(nginx_ticks) - nb ))
  csw[$1]=$(( ${csw[$1]:-0} + $(switches "$2") - sw ))
}
for _ in $(seq "$ROUNDS"); do
  run plain-a "$a_pid" http://127.0.0.1:18811/x; run plain-b "$b_pid" http://127.0.0.1:18812/x
  run keep-a "$a_pid" http://127.0.0.1:18821/x; run keep-b "$b_pid" http://127.0.0.1:18822/x
  run http-a "$a_pid" http://127.0.0.1:18801/x; run http-b "$b_pid" http://127.0.0.1:18802/x
  run http-n "$nginx" http://127.0.0.1:18831/x
  for k in a b n; do
    case $k in a) pid=$a_pid port=18801 ;; b) pid=$b_pid port=18802 ;; n) pid=$nginx port=18831 ;; esac
    run "close-$k" "$pid" "http://127.0.0.1:$port/x" -H "Connection: close"
  done
done
report=$s/report.txt
exec 3>&1 1>"$report"
echo "wrk -t1 -c$CONC, ${SECS}s x $ROUNDS rounds interleaved; A = $1${THREADS_A:+ (threads $THREADS_A)}${SCHED_A:+ ($SCHED_A)}, B = $2${THREADS_B:+ (threads $THREADS_B)}${SCHED_B:+ ($SCHED_B)}"
printf '%-22s %10s %10s %12s %12s %12s\n' path "A req/s" "B req/s" "A corral µs" "B corral µs" "B/A CPU"
for p in plain keep http close; do
  awk -v p="$p" -v ra="${reqs[$p-a]}" -v rb="${reqs[$p-b]}" -v ca="${cpu[$p-a]}" -v cb="${cpu[$p-b]}" \
      -v rn="${reqs[$p-n]:-}" -v cn="${ncpu[$p-n]:-}" -v en="${errs[$p-n]:-0}" \
      -v na="${ncpu[$p-a]}" -v nb="${ncpu[$p-b]}" -v sa="${csw[$p-a]}" -v sb="${csw[$p-b]}" -v t="$((SECS * ROUNDS))" -v hz="$hz" \
      -v ea="${errs[$p-a]}" -v eb="${errs[$p-b]}" 'BEGIN {
    name = (p == "http") ? "wrk -> corral http" : (p == "close") ? "wrk close -> corral http" : "nginx " p " -> corral"
    if (ea + eb > 0 || ra == 0 || rb == 0) {
      printf "%-22s %10.0f %10.0f %12s %12s %12s   (invalid: wrk errors and timeouts A %d, B %d)\n", name, ra / t, rb / t, "-", "-", "—", ea, eb
      exit }
    ua = ca / hz * 1e6 / ra; ub = cb / hz * 1e6 / rb
    printf "%-22s %10.0f %10.0f %12.1f %12.1f %12.2f", name, ra / t, rb / t, ua, ub, ub / ua
    printf "   (sleeps/req: A %.2f, B %.2f)", sa / ra, sb / rb
    if (p == "plain" || p == "keep") printf "   (nginx µs: A %.1f, B %.1f)", na / hz * 1e6 / ra, nb / hz * 1e6 / rb
    printf "\n"
    if (rn != "") {
      if (en > 0 || rn == 0) printf "%-22s %10.0f   (invalid: wrk errors and timeouts %d)\n", "  nginx http (same)", rn / t, en
      else printf "%-22s %10.0f %10s %12.1f   (the reference: nginx, its http listener)\n", "  nginx http (same)", rn / t, "", cn / hz * 1e6 / rn
    } }'
done
exec 1>&3
{ echo '```'; cat "$report"; echo '```'; } > "$s/report.md"
cat "$report"
results_write ab "Side by side at c=$CONC: A = $1${THREADS_A:+ (threads $THREADS_A)}${SCHED_A:+ ($SCHED_A)}, B = $2${THREADS_B:+ (threads $THREADS_B)}${SCHED_B:+ ($SCHED_B)}" "$s/report.md"
