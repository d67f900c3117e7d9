#!/usr/bin/env bash
# Question: how many instructions does corral execute per request on a path, repeatably (no
# timing noise)? corral runs under `valgrind --tool=callgrind` in front of corral's null
# FastCGI backend; `ab` sends N1 then, in a second run, N2 requests; the difference of the
# two totals over N2 - N1 is corral's user-space instructions per request (start-up and
# shutdown cancel out). Kernel time is not counted: pair it with `strace -c -f -p PID`.
#   paths: plain  nginx plain fastcgi_pass -> corral fastcgi listener (a connection per request)
#          keep   nginx fastcgi_keep_conn -> corral fastcgi listener
#          http   ab -k -> corral http listener
# Usage: bash benches/callgrind.sh [PATH] [N1] [N2]   (defaults: plain 1000 3000; ACCESS=1
# turns the access log on; SCHED sets `[server] scheduler`; CORRAL names the binary, default the release build; the last
# run's profile is left in $OUT_DIR (default /tmp) as callgrind.out.corral for
# callgrind_annotate). Needs valgrind, nginx and ab.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-plain}
n1=${2:-1000}
n2=${3:-3000}
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=target/release/corral
fi
CORRAL=$(realpath "$CORRAL")
out_dir=${OUT_DIR:-/tmp}

total() { # N -> Ir of one callgrind run serving N requests
  local n=$1 s pids=() url log_line=""
  s=$(mktemp -d /tmp/corral-cg.XXXXXX)
  chmod 755 "$s"
  [ -n "${ACCESS:-}" ] && log_line="access_log = \"$s/access.log\""
  [ -n "${SCHED:-}" ] && log_line="$log_line
scheduler = \"$SCHED\""
  "$CORRAL" null-backend --protocol fastcgi --listen "unix:$s/null.sock" > /dev/null & pids+=($!)
  for _ in $(seq 100); do [ -S "$s/null.sock" ] && break; sleep 0.05; done
  chmod 666 "$s/null.sock"
  cat > "$s/corral.toml" <<EOF
[server]
runtime_dir = "$s/run"
log_level = "warn"
$log_line
[[listen]]
address = "unix:$s/fcgi.sock"
protocol = "fastcgi"
mode = "0666"
[[listen]]
address = "127.0.0.1:18901"
protocol = "http"
[pools.null]
servers = ["unix:$s/null.sock"]
concurrency = 64
[[contexts]]
pool = "null"
EOF
  valgrind --tool=callgrind --callgrind-out-file="$s/cg.out" "$CORRAL" run -c "$s/corral.toml" > "$s/corral.log" 2>&1 &
  local corral=$!
  cat > "$s/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $s/nginx.pid;
error_log $s/nginx.log;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $s; fastcgi_temp_path $s; proxy_temp_path $s; scgi_temp_path $s; uwsgi_temp_path $s;
  upstream kept { server unix:$s/fcgi.sock; keepalive 8; }
  server { listen 127.0.0.1:18902; location / { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/fcgi.sock; } }
  server { listen 127.0.0.1:18903; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass kept; } }
}
EOF
  nginx -c "$s/nginx.conf" > /dev/null & pids+=($!)
  case $mode in
    plain) url=http://127.0.0.1:18902/x ;;
    keep) url=http://127.0.0.1:18903/x ;;
    http) url=http://127.0.0.1:18901/x ;;
    *) echo "unknown path $mode (plain, keep or http)" >&2; exit 2 ;;
  esac
  for _ in $(seq 300); do curl -sf -o /dev/null "$url" && break; sleep 0.1; done
  ab -q -k -n 200 -c 4 "$url" > /dev/null   # warm-up
  ab -q -k -n "$n" -c 4 "$url" > "$s/ab.txt"
  grep -q '^Failed requests: *0$' "$s/ab.txt" || { cat "$s/ab.txt" >&2; exit 1; }
  kill -TERM "$corral"; wait "$corral" || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  awk '/^summary:/ {print $2}' "$s/cg.out"
  cp "$s/cg.out" "$out_dir/callgrind.out.corral"
  rm -rf "$s"
}
a=$(total "$n1")
b=$(total "$n2")
awk -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" -v m="$mode" -v note="${ACCESS:+ (access log on)}" \
  'BEGIN { printf "%s%s: %.1fk instructions per request in corral (Ir %d at %d requests, %d at %d)\n", m, note, (b - a) / (n2 - n1) / 1000, a, n1, b, n2 }'
