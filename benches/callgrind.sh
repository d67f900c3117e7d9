#!/usr/bin/env bash
# Question: how many user-space instructions and system calls does corral spend per request
# on a path, repeatably (no timing noise), beside nginx and HAProxy measured the same way in
# the same run? Each server runs under `valgrind --tool=callgrind` (or `strace -c -f`) in
# front of corral's null FastCGI backend (`corral null-backend`, a process of its own, not
# measured); `ab -k -c4` sends N1 then, in a second run, N2 requests; the difference of the
# two totals over N2 - N1 is the server's count per request (start-up, warm-up and shutdown
# cancel out).
#   paths: http   ab -k -> SERVER's http listener -> null FastCGI over kept connections
#                 (SERVER = corral's http listener, nginx `fastcgi_keep_conn` + upstream
#                 keepalive, HAProxy `use-fcgi-app` with nbthread 1)
#          plain  nginx plain fastcgi_pass -> corral's fastcgi listener: corral's hop alone,
#                 beside nginx's whole request on the same path (nginx measured alone)
#          keep   nginx fastcgi_keep_conn -> corral's fastcgi listener: corral's hop alone
# Usage: bash benches/callgrind.sh [PATH] [N1] [N2]   (defaults: http 1000 3000)
# Env: SERVERS (which to measure, default "corral nginx haproxy" for http and "corral nginx"
# for plain/keep), CLOSE=1 (ab without -k: a new client connection per request, as nginx's
# `proxy_pass` without upstream keep-alive opens one; section `callgrind-PATH-close`),
# ACCESS=1 (corral's access log on), BODY=N (the null backend answers N bytes of body, not
# 13: what a real page's size costs each server; section `callgrind-PATH-bodyN`), SCHED
# (`[server] scheduler`), CORRAL (the binary, default the release build), OUT_DIR (where
# corral's last profile is left as callgrind.out.corral for callgrind_annotate, default
# /tmp), STRACE=0 skips the
# system-call counts, FOOTPRINT=1 adds what a request touches: each server once more under
# `valgrind --tool=lackey --trace-mem=yes` for FOOTPRINT_N (300) requests, its trace cut into
# windows of its instructions per request (ab -k -c1), the median window's distinct 64-byte
# lines of code and of data and distinct 4 KiB pages (benches/lib/footprint.py; not HAProxy,
# which did not start under lackey), and corral's code lines by crate and the functions
# touching the most, with the share of their lines' bytes that ran: after a sleep, each
# line a request needs is a cache miss if another process used the CPU meanwhile (decision
# 38), FOOTPRINT_SOURCES=1 with it also corral's code lines by source file (addr2line over
# the binary's line tables: which file's code a request's lines hold, inlined code counted
# to the file it came from), OUT (default benches/RESULTS.md, whose `callgrind-PATH`
# section, or `callgrind-PATH-access` with ACCESS=1, the table replaces; OUT= prints only;
# benches/lib/results.sh). Needs valgrind, strace, nginx, haproxy and ab.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="SERVERS CLOSE ACCESS BODY SCHED CORRAL OUT_DIR STRACE FOOTPRINT FOOTPRINT_N FOOTPRINT_SOURCES"
results_start "$@"
mode=${1:-http}
n1=${2:-1000}
n2=${3:-3000}
case $mode in
  http) default_servers="corral nginx haproxy" ;;
  plain | keep) default_servers="corral nginx" ;;
  *) echo "unknown path $mode (http, plain or keep)" >&2; exit 2 ;;
esac
SERVERS=${SERVERS:-$default_servers}
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=target/release/corral
fi
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL
out_dir=${OUT_DIR:-/tmp}
# Five TCP ports free now, picked per run, so that two runs at once (another path, another
# worktree) do not meet on fixed ones: corral's http listener, nginx's plain, keep and http
# servers, HAProxy.
read -r p_corral p_plain p_keep p_nginx p_haproxy < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')

# Writes corral's, nginx's and HAProxy's configurations into $1.
configs() {
  local s=$1 extra=""
  [ -n "${ACCESS:-}" ] && extra="access_log = \"$s/access.log\""
  [ -n "${SCHED:-}" ] && extra="$extra
scheduler = \"$SCHED\""
  cat > "$s/corral.toml" <<EOF
[server]
runtime_dir = "$s/run"
log_level = "warn"
threads = 1
$extra
[[listen]]
address = "unix:$s/fcgi.sock"
protocol = "fastcgi"
mode = "0666"
[[listen]]
address = "127.0.0.1:$p_corral"
protocol = "http"
[pools.null]
servers = ["unix:$s/null.sock"]
concurrency = 64
[[contexts]]
pool = "null"
EOF
  cat > "$s/nginx.conf" <<EOF
worker_processes 1;
master_process off;
daemon off;
pid $s/nginx.pid;
error_log $s/nginx.log;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $s/nginx; fastcgi_temp_path $s/nginx; proxy_temp_path $s/nginx; scgi_temp_path $s/nginx; uwsgi_temp_path $s/nginx;
  upstream corral_kept { server unix:$s/fcgi.sock; keepalive 8; }
  upstream null_kept { server unix:$s/null.sock; keepalive 8; }
  server { listen 127.0.0.1:$p_plain; location / { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/fcgi.sock; } }
  server { listen 127.0.0.1:$p_keep; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass corral_kept; } }
  server { listen 127.0.0.1:$p_nginx; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass null_kept; } }
}
EOF
  cat > "$s/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
fcgi-app null
  docroot /var/www/html
frontend f
  bind 127.0.0.1:$p_haproxy
  default_backend b
backend b
  use-fcgi-app null
  server s1 unix@$s/null.sock proto fcgi
EOF
}

# measure TOOL SERVER N -> the tool's total (Ir, or system calls) for SERVER serving N requests.
measure() {
  local tool=$1 server=$2 n=$3 s url wrap=() pids=() measured
  s=$(mktemp -d /tmp/corral-cg.XXXXXX)
  chmod 755 "$s"
  configs "$s"
  "$CORRAL" null-backend --protocol fastcgi --threads 1 --body-size "${BODY:-13}" --listen "unix:$s/null.sock" > /dev/null & pids+=($!)
  for _ in $(seq 100); do [ -S "$s/null.sock" ] && break; sleep 0.05; done
  chmod 666 "$s/null.sock"
  case $tool in
    callgrind) wrap=(valgrind --tool=callgrind --callgrind-out-file="$s/cg.out") ;;
    strace) wrap=(strace -c -f -o "$s/strace.out") ;;
    lackey) wrap=(valgrind --tool=lackey --trace-mem=yes --log-file="$s/trace") ;;
  esac
  # The measured server; on the plain/keep paths nginx runs too, unmeasured, in front of corral.
  case $server in
    corral)
      "${wrap[@]}" "$CORRAL" run -c "$s/corral.toml" > "$s/corral.log" 2>&1 &
      measured=$!
      if [ "$mode" != http ]; then nginx -c "$s/nginx.conf" > /dev/null 2>&1 & pids+=($!); fi
      ;;
    nginx)
      "${wrap[@]}" nginx -c "$s/nginx.conf" > /dev/null 2>&1 &
      measured=$!
      ;;
    haproxy)
      "${wrap[@]}" haproxy -f "$s/haproxy.cfg" -db > "$s/haproxy.log" 2>&1 &
      measured=$!
      ;;
  esac
  case $server/$mode in
    corral/http) url=http://127.0.0.1:$p_corral/x ;;
    nginx/http) url=http://127.0.0.1:$p_nginx/x ;;
    haproxy/http) url=http://127.0.0.1:$p_haproxy/x ;;
    */plain) url=http://127.0.0.1:$p_plain/x ;;
    */keep) url=http://127.0.0.1:$p_keep/x ;;
  esac
  if [ "$server" = nginx ] && [ "$mode" != http ]; then
    # nginx's whole request on the same path, with corral (unmeasured) behind it.
    "$CORRAL" run -c "$s/corral.toml" > "$s/corral.log" 2>&1 & pids+=($!)
  fi
  # Up to 30 s for a server to start (90 s under lackey, which runs OpenSSL's start-up slowly).
  for _ in $(seq "$([ "$tool" = lackey ] && echo 900 || echo 300)"); do curl -sf -o /dev/null "$url" && break; sleep 0.1; done
  if ! curl -sf -o /dev/null "$url"; then
    echo "$server ($tool) did not answer on $url" >&2
    kill "$measured" "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$s"
    exit 1
  fi
  # One client for lackey: with four, a window of a request's instructions would hold the
  # same step of several requests, its lines counted once.
  local conc=4
  [ "$tool" = lackey ] && conc=1
  local keep=(-k)
  [ -n "${CLOSE:-}" ] && keep=()
  ab -q "${keep[@]}" -n 200 -c "$conc" "$url" > /dev/null   # warm-up
  ab -q "${keep[@]}" -n "$n" -c "$conc" "$url" > "$s/ab.txt"
  grep -q '^Failed requests: *0$' "$s/ab.txt" || { echo "$server: failed requests" >&2; cat "$s/ab.txt" >&2; exit 1; }
  grep -q '^Non-2xx responses' "$s/ab.txt" && { echo "$server: non-2xx answers" >&2; cat "$s/ab.txt" >&2; exit 1; }
  # strace's tracee is its child; valgrind runs the program in its own process.
  local target=$measured
  [ "$tool" = strace ] && target=$(pgrep -P "$measured" | head -n 1)
  kill -TERM "$target"; wait "$measured" || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  case $tool in
    callgrind)
      awk '/^summary:/ {print $2}' "$s/cg.out"
      [ "$server" = corral ] && cp "$s/cg.out" "$out_dir/callgrind.out.corral"
      ;;
    strace) awk '$NF == "total" {print $(NF-2)}' "$s/strace.out" ;;
    lackey)
      python3 benches/lib/footprint.py "$s/trace" "$footprint_window" \
        $([ "$server" = corral ] && echo "$CORRAL ${FOOTPRINT_SOURCES:+sources}") > "$s/footprint"
      cp "$s/footprint" "$out_dir/footprint.$server"
      head -n 1 "$s/footprint"
      ;;
  esac
  rm -rf "$s"
}

per_request() { # TOOL SERVER -> count per request
  local a b
  a=$(measure "$1" "$2" "$n1")
  b=$(measure "$1" "$2" "$n2")
  awk -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" 'BEGIN { printf "%.2f", (b - a) / (n2 - n1) }'
}

note=""; [ -n "${ACCESS:-}" ] && note=" (corral's access log on)"
report=$(mktemp /tmp/corral-cg-report.XXXXXX)
exec 3>&1 1>"$report"
ab_k="-k "
[ -n "${CLOSE:-}" ] && { note="$note, a new connection per request"; ab_k=""; }
[ -n "${BODY:-}" ] && note="$note, a body of $BODY bytes from the null backend"
echo "path $mode$note, ab ${ab_k}-c4; each count is (the run of $n2 requests - the run of $n1) / $((n2 - n1)), under valgrind --tool=callgrind and strace -c -f."
[ -n "${FOOTPRINT:-}" ] && echo "What a request touches: ${FOOTPRINT_N:-300} requests more under valgrind --tool=lackey --trace-mem=yes with ab -k -c1, the trace cut into windows of the server's instructions per request; the median window's distinct 64-byte lines of code and of data, and its distinct 4 KiB pages (benches/lib/footprint.py)."
echo
if [ -n "${FOOTPRINT:-}" ]; then
  rm -f "$out_dir/footprint.corral"
  echo "| server | user-space instructions per request | system calls per request | code lines per request | data lines per request | 4 KiB pages per request |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
else
  echo "| server | user-space instructions per request | system calls per request |"
  echo "| --- | ---: | ---: |"
fi
for server in $SERVERS; do
  ir=$(per_request callgrind "$server")
  sys="-"
  [ "${STRACE:-1}" != 0 ] && sys=$(per_request strace "$server")
  touched=""
  if [ -n "${FOOTPRINT:-}" ] && [ "$server" = haproxy ]; then
    touched=" - | - | - |"  # HAProxy 2.6 did not answer within 90 s under lackey
  elif [ -n "${FOOTPRINT:-}" ]; then
    footprint_window=$ir
    read -r code data pages < <(measure lackey "$server" "${FOOTPRINT_N:-300}")
    touched=" $code | $data | $pages |"
  fi
  awk -v s="$server" -v ir="$ir" -v sys="$sys" -v m="$mode" -v t="$touched" 'BEGIN {
    who = s; if (m != "http" && s == "corral") who = "corral (its hop alone)";
    if (m != "http" && s == "nginx") who = "nginx (its whole request, corral behind it)";
    printf "| %s | %.1fk | %s |%s\n", who, ir / 1000, sys, t }'
done
if [ -n "${FOOTPRINT:-}" ] && [ -f "$out_dir/footprint.corral" ]; then
  echo
  echo "corral's code lines per request by crate (the function each line falls in):"
  echo
  echo "| crate | code lines |"
  echo "| --- | ---: |"
  sed -n '2,/^--$/p' "$out_dir/footprint.corral" | grep -v '^--$' \
    | awk '{n = $NF; $NF = ""; sub(/ $/, ""); printf "| %s | %s |\n", $0, n}'
  echo
  echo "corral's functions touching the most code lines per request (density: the share of those lines' bytes the request ran):"
  echo
  echo "| function | code lines | density |"
  echo "| --- | ---: | ---: |"
  awk '/^--$/ { part++; next } part == 1' "$out_dir/footprint.corral" \
    | awk '{n = $1; d = $2; $1 = ""; $2 = ""; sub(/^  /, ""); gsub(/\|/, "\\|"); printf "| `%s` | %s | %s |\n", $0, n, d}'
  if [ -n "${FOOTPRINT_SOURCES:-}" ]; then
    echo
    echo "corral's code lines per request by source file (each line counted to the innermost frame of its first instruction outside the standard library):"
    echo
    echo "| source file | code lines |"
    echo "| --- | ---: |"
    awk '/^--$/ { part++; next } part == 2' "$out_dir/footprint.corral" \
      | awk '{n = $1; $1 = ""; sub(/^ /, ""); printf "| `%s` | %s |\n", $0, n}'
  fi
fi
exec 1>&3
cat "$report"
title="Instructions and system calls per request, path $mode$note"
results_write "callgrind-$mode${CLOSE:+-close}${ACCESS:+-access}${BODY:+-body$BODY}" "$title" "$report"
rm -f "$report"
