#!/usr/bin/env bash
# Question: is corral's http listener in front of php-cgi as fast as nginx in front of
# php-fpm, with the same number of PHP processes? Measured side by side in one run.
#
#   A  nginx (1 worker) -> php-fpm (pm static, 2 children, unix socket)
#   B  corral (http listener) -> 2 php-cgi (one unix socket each, external servers)
#
# wrk -t1 -c$CONC -d$SECS against a hello-world script, runs interleaved A B A B ... so that
# the machine's drift hits both alike; prints each run and the ratio of the medians.
# Loopback only; every process it starts it stops (trap). Needs: nginx, php-fpm8.2,
# php-cgi, wrk (scripts/setup-peers.sh) and a release build of corral.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CONC=${CONC:-25}
SECS=${SECS:-8}
ROUNDS=${ROUNDS:-3}
CORRAL=${CORRAL:-target/release/corral}
[ -x "$CORRAL" ] || cargo build --release --quiet
scratch=$(mktemp -d /tmp/corral-bench.XXXXXX)
chmod 755 "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

mkdir -p "$scratch/www" "$scratch/run" "$scratch/log"
echo '<?php echo "Hello, world\n";' > "$scratch/www/hello.php"
chown -R www-data:www-data "$scratch/run" "$scratch/www"

# A: php-fpm + nginx
cat > "$scratch/fpm.conf" <<CONF
[global]
pid = $scratch/run/fpm.pid
error_log = $scratch/log/fpm.log
daemonize = no
[hello]
user = www-data
group = www-data
listen = $scratch/run/fpm.sock
listen.owner = www-data
listen.group = www-data
listen.mode = 0660
pm = static
pm.max_children = 2
CONF
php-fpm8.2 -F -y "$scratch/fpm.conf" & pids+=($!)
port_a=$(free_port)
cat > "$scratch/nginx.conf" <<CONF
user www-data;
worker_processes 1;
daemon off;
pid $scratch/run/nginx.pid;
error_log $scratch/log/nginx.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $scratch/nginx-tmp; fastcgi_temp_path $scratch/nginx-tmp;
  proxy_temp_path $scratch/nginx-tmp; scgi_temp_path $scratch/nginx-tmp; uwsgi_temp_path $scratch/nginx-tmp;
  root $scratch/www;
  server { listen 127.0.0.1:$port_a;
    location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$scratch/run/fpm.sock; } }
}
CONF
nginx -c "$scratch/nginx.conf" & pids+=($!)

# B: two php-cgi + corral
for i in 1 2; do
  env -i PATH=/usr/bin:/bin PHP_FCGI_CHILDREN=0 PHP_FCGI_MAX_REQUESTS=0 \
    setpriv --reuid=www-data --regid=www-data --clear-groups \
    php-cgi -b "$scratch/run/cgi$i.sock" & pids+=($!)
done
port_b=$(free_port)
cat > "$scratch/corral.toml" <<CONF
[server]
log_level = "warn"
[[listen]]
address = "127.0.0.1:$port_b"
protocol = "http"
[pools.php]
servers = ["unix:$scratch/run/cgi1.sock", "unix:$scratch/run/cgi2.sock"]
[[contexts]]
pool = "php"
root = "$scratch/www"
CONF
wait_for "$scratch/run/cgi1.sock"; wait_for "$scratch/run/cgi2.sock"; wait_for "$scratch/run/fpm.sock"
"$CORRAL" run -c "$scratch/corral.toml" >/dev/null & pids+=($!)
sleep 0.5

url_a="http://127.0.0.1:$port_a/hello.php"
url_b="http://127.0.0.1:$port_b/hello.php"
for u in "$url_a" "$url_b"; do
  body=$(curl -sS "$u")
  [ "$body" = "Hello, world" ] || { echo "bad answer from $u: $body" >&2; exit 1; }
  wrk -t1 -c"$CONC" -d2s "$u" >/dev/null   # warm-up, not recorded
done

run() { wrk -t1 -c"$CONC" -d"${SECS}s" --latency "$1" | awk '
  /Requests\/sec/ {rps=$2} / 50%/ {p50=$2} / 99%/ {p99=$2} /Non-2xx|Socket errors/ {err=err" "$0}
  END {printf "%s %s %s%s\n", rps, p50, p99, err}'; }
echo "c=$CONC, ${SECS}s per run, $ROUNDS rounds; columns: req/s p50 p99"
a_all=(); b_all=()
for r in $(seq "$ROUNDS"); do
  a=$(run "$url_a"); b=$(run "$url_b")
  echo "round $r  A nginx+php-fpm: $a"
  echo "round $r  B corral+php-cgi: $b"
  a_all+=("${a%% *}"); b_all+=("${b%% *}")
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ma=$(median "${a_all[@]}"); mb=$(median "${b_all[@]}")
echo "median req/s: A $ma, B $mb, B/A = $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.3f", b/a}')"
