#!/usr/bin/env bash
# Question: what does a front-controller site (WordPress, Laravel, Symfony: nginx's
# `try_files $uri $uri/ /index.php?$args`) cost per request through corral's HTTP listener
# (`static_files = true`, `front_controller = "/index.php"`) beside nginx configured the way
# those sites' guides configure it, both in front of the same null FastCGI backend
# (`corral null-backend`, kept connections)? Three paths: `/` (a directory: its index runs),
# `/2024/05/a-post/` (nothing by that name: the controller runs, as for every pretty
# permalink) and `/f.txt` (a 1,741-byte static file). wrk -t1 -c20 per row, rounds
# interleaved; CPU per request of the server (nginx's worker, or corral) from /proc.
# Usage: bash benches/front-controller.sh [CORRAL...]   (default: the release build)
# Env: ROUNDS (3), DUR (5s), OUT (default benches/RESULTS.md, whose `front-controller` section
# the table replaces; OUT= prints only; benches/lib/results.sh). A run with wrk errors or
# timeouts, or whose answer is not the backend's (or the file), is marked invalid. Needs nginx,
# wrk, curl and python3.
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
s=$(mktemp -d /tmp/corral-fc.XXXXXX)
chmod 755 "$s"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$s"
}
trap cleanup EXIT
mkdir -p "$s/www/wp-admin" "$s/ngx/tmp"
chmod 755 "$s/www" "$s/www/wp-admin"
echo '<?php // the null backend answers instead' > "$s/www/index.php"
head -c 2000 /dev/urandom | base64 -w 76 | head -c 1741 > "$s/www/f.txt"
chmod 644 "$s/www/index.php" "$s/www/f.txt"

first=$1
"$first" null-backend --protocol fastcgi --threads 1 --listen "unix:$s/null.sock" > /dev/null 2>&1 & pids+=($!)
for _ in $(seq 100); do [ -S "$s/null.sock" ] && break; sleep 0.05; done
chmod 666 "$s/null.sock"
hello=$(printf 'Hello, world\n')

np=$(free_port)
cat > "$s/ngx/nginx.conf" <<NG
worker_processes 1; daemon off; pid $s/ngx/nginx.pid; error_log $s/ngx/error.log;
events { worker_connections 1024; }
http { access_log off; sendfile on; include /etc/nginx/mime.types;
  client_body_temp_path $s/ngx/tmp; proxy_temp_path $s/ngx/tmp; fastcgi_temp_path $s/ngx/tmp;
  scgi_temp_path $s/ngx/tmp; uwsgi_temp_path $s/ngx/tmp;
  upstream php { server unix:$s/null.sock; keepalive 8; }
  server { listen 127.0.0.1:$np; root $s/www; index index.php;
    location / { try_files \$uri \$uri/ /index.php?\$args; }
    location ~ \.php\$ { try_files \$uri =404; include /etc/nginx/fastcgi.conf;
      fastcgi_keep_conn on; fastcgi_pass php; } } }
NG
nginx -c "$s/ngx/nginx.conf" -p "$s/ngx" & pids+=($!)
nginx_master=$!
names=(nginx) bases=("http://127.0.0.1:$np")
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
[pools.php]
servers = ["unix:$s/null.sock"]
concurrency = 64
[[contexts]]
root = "$s/www"
pool = "php"
static_files = true
front_controller = "/index.php"
CF
  "$bin" run -c "$s/c$i.toml" > "$s/c$i.log" 2>&1 & pids+=($!)
  names+=("corral $(git rev-parse --short HEAD 2>/dev/null || echo ?) ($bin)")
  bases+=("http://127.0.0.1:$cp")
  i=$((i + 1))
done
paths=(/ /2024/05/a-post/ /f.txt)
answers() { # BASE PATH: whether BASE answers PATH as it should (the backend's hello or the file)
  if [ "$2" = /f.txt ]; then curl -sf "$1$2" | cmp -s - "$s/www/f.txt"
  else [ "$(curl -sf "$1$2")" = "$hello" ]; fi
}
for j in "${!names[@]}"; do
  for _ in $(seq 200); do answers "${bases[$j]}" / && break; sleep 0.05; done
done
server_pid() { # ROW: nginx's worker, or that corral
  if [ "$1" = 0 ]; then pgrep -P "$nginx_master" | head -n 1; else echo "${pids[$(($1 + 1))]}"; fi
}
report=$s/report.md
exec 3>&1 1>"$report"
echo "nginx 1.22 (one worker; \`try_files \$uri \$uri/ /index.php?\$args\`, \`fastcgi_keep_conn on\`, upstream keepalive 8) and corral (one serving thread; a pool of the backend with \`concurrency = 64\`, \`static_files = true\`, \`front_controller = \"/index.php\"\`) in front of the same \`corral null-backend\` FastCGI responder. wrk -t1 -c20 -d$DUR after a 1 s warm-up, $ROUNDS rounds interleaved; CPU of the serving process from /proc (the backend's not counted)."
echo "errors: wrk's socket connect, read and write errors and non-2xx/3xx answers; timeouts: its socket timeouts; a run with either, or whose answer was not the backend's (or the file), is **invalid**."
echo
echo "| round | path | server | req/s | CPU µs per request | errors | timeouts | valid |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"
for r in $(seq "$ROUNDS"); do
  for p in "${paths[@]}"; do
    for j in "${!names[@]}"; do
      url="${bases[$j]}$p"
      pid=$(server_pid "$j")
      read -r rps us errs touts reqs < <(wrk_cpu 20 "$DUR" "$url" "$pid")
      v=ok
      [ "$errs" = 0 ] && [ "$touts" = 0 ] && [ "${reqs:-0}" -gt 0 ] && answers "${bases[$j]}" "$p" || v="**invalid**"
      echo "| $r | \`$p\` | ${names[$j]} | $rps | $us | $errs | $touts | $v |"
    done
  done
done
echo
echo "Medians over the valid rounds:"
echo
python3 - "$report" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.split("|")]
    if len(c) > 9 and c[1].isdigit() and c[8] == "ok":
        runs[(c[2], c[3])].append((float(c[4]), float(c[5])))
print("| path | server | req/s | CPU µs per request | rounds |")
print("| --- | --- | ---: | ---: | ---: |")
for (path, server), v in runs.items():
    rps = statistics.median(x[0] for x in v)
    us = statistics.median(x[1] for x in v)
    print(f"| {path} | {server} | {rps:.0f} | {us:.1f} | {len(v)} |")
PY
exec 1>&3
cat "$report"
results_write front-controller "Front controller: corral's HTTP listener beside nginx's try_files" "$report"
