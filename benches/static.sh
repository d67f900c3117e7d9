#!/usr/bin/env bash
# Question: what does a static file cost through corral's HTTP listener (`static_files = true`,
# the per-thread open-file cache) beside nginx serving the same file? A 1,741-byte file,
# wrk -t1 -c20, nginx 1.22 (one worker, `sendfile on`) and each corral binary given (one
# serving thread), rounds interleaved; CPU per request of the server from /proc/PID/stat.
# Usage: bash benches/static.sh [CORRAL...]   (default: the release build)
# Env: ROUNDS (3), DUR (5s), OUT (default benches/RESULTS.md, whose `static` section the table
# replaces; OUT= prints only; benches/lib/results.sh). wrk's errors and timeouts are counted
# per run; a run with either is marked invalid. Needs nginx, wrk, curl and python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="ROUNDS DUR"
results_start "$@"
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-5s}
if [ "$#" -eq 0 ]; then
  cargo build --release --quiet
  set -- target/release/corral
fi
[ "$#" -ne 1 ] || RESULTS_BINARY=$1
s=$(mktemp -d /tmp/corral-static.XXXXXX)
chmod 755 "$s"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$s"
}
trap cleanup EXIT
mkdir -p "$s/www" "$s/ngx"
chmod 755 "$s/www"
head -c 2000 /dev/urandom | base64 -w 76 | head -c 1741 > "$s/www/f.txt"
chmod 644 "$s/www/f.txt"
up() { # URL: waits until it serves the file
  for _ in $(seq 200); do curl -sf "$1" 2>/dev/null | cmp -s - "$s/www/f.txt" && return 0; sleep 0.05; done
  echo "$1 never served the file" >&2; exit 1
}
np=$(free_port)
cat > "$s/ngx/nginx.conf" <<NG
worker_processes 1; daemon off; pid $s/ngx/nginx.pid; error_log $s/ngx/error.log;
events { worker_connections 1024; }
http { access_log off; sendfile on; include /etc/nginx/mime.types;
  client_body_temp_path $s/ngx/tmp; proxy_temp_path $s/ngx/tmp; fastcgi_temp_path $s/ngx/tmp;
  scgi_temp_path $s/ngx/tmp; uwsgi_temp_path $s/ngx/tmp;
  server { listen 127.0.0.1:$np; root $s/www; } }
NG
nginx -c "$s/ngx/nginx.conf" -p "$s/ngx" & pids+=($!)
nginx_master=$!
up "http://127.0.0.1:$np/f.txt"
nginx_worker=$(pgrep -P "$nginx_master" | head -n 1)
names=(nginx) urls=("http://127.0.0.1:$np/f.txt") procs=("$nginx_worker")
i=0
for bin in "$@"; do
  cp=$(free_port)
  mkdir -p "$s/run$i"
  chmod 700 "$s/run$i"
  cat > "$s/c$i.toml" <<CF
[server]
runtime_dir = "$s/run$i"
threads = 1
log_level = "warn"
[[listen]]
address = "127.0.0.1:$cp"
protocol = "http"
[pools.none]
servers = ["unix:$s/nothing.sock"]
[[contexts]]
root = "$s/www"
pool = "none"
static_files = true
CF
  "$bin" run -c "$s/c$i.toml" > "$s/c$i.log" 2>&1 & pids+=($!)
  names+=("corral $(git rev-parse --short HEAD 2>/dev/null || echo ?) ($bin)")
  urls+=("http://127.0.0.1:$cp/f.txt")
  procs+=("$!")
  up "http://127.0.0.1:$cp/f.txt"
  i=$((i + 1))
done
report=$s/report.md
exec 3>&1 1>"$report"
echo "1,741-byte file, wrk -t1 -c20 -d$DUR after a 1 s warm-up, $ROUNDS rounds interleaved; CPU of the serving process from /proc."
echo "errors: wrk's socket connect, read and write errors and non-2xx/3xx answers; timeouts: its socket timeouts; a run with either is **invalid**."
echo
echo "| round | server | req/s | CPU µs per request | errors | timeouts | valid |"
echo "| --- | --- | ---: | ---: | ---: | ---: | --- |"
for r in $(seq "$ROUNDS"); do
  for j in "${!names[@]}"; do
    read -r rps us errs touts reqs < <(wrk_cpu 20 "$DUR" "${urls[$j]}" "${procs[$j]}")
    v=ok; [ "$errs" = 0 ] && [ "$touts" = 0 ] && [ "${reqs:-0}" -gt 0 ] || v="**invalid**"
    echo "| $r | ${names[$j]} | $rps | $us | $errs | $touts | $v |"
  done
done
exec 1>&3
cat "$report"
results_write static "Static files: corral's HTTP listener beside nginx" "$report"
