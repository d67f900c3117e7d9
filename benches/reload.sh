#!/usr/bin/env bash
# Question: does a reload under load fail requests? nginx (plain fastcgi_pass) in front of
# php-fpm and of a corral direct pool (accept = "direct", the workers accept on corral's
# socket themselves), each reloaded every INTERVAL seconds while wrk -t1 runs; wrk's errors
# and non-2xx answers, and nginx's error-log lines, are counted per row.
#
# Rows:
#   fpm-reload       php-fpm static 2, `kill -USR2` (what `systemctl reload php8.2-fpm` sends)
#   direct-reload    corral direct pool static 2, the pool changed (max_requests moves by one)
#                    and SIGHUP (`systemctl reload corral`): a new pool on the same socket
#   direct-restart   the same pool, SIGUSR2 (`corral restart-workers`): a rolling restart
#   direct-children-reload   a second corral: a direct pool of one php-cgi parent with
#                    php_children = 2 (php-fpm's model: 2 children sharing one OPcache), the
#                    pool changed and SIGHUP; the old group is retired as docs/pools.md says
#                    (parent stopped, each child signalled between requests)
#   direct-children-restart  the same, SIGUSR2
# Debian's php-fpm defaults are kept (process_control_timeout = 0). The page is work.php,
# 10 ms of usleep, so requests are in flight when the reload comes.
#
#   bash benches/reload.sh
# Env: SECS (20), INTERVAL (2), CONC (25), CORRAL (release build), OUT (default
# benches/RESULTS.md, section `reload`; OUT= prints only). Needs root (nginx and PHP run as
# www-data), nginx, php-fpm8.2, php-cgi, wrk. Every process it starts it stops.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="SECS INTERVAL CONC CORRAL"
results_start "$@"
SECS=${SECS:-20}
INTERVAL=${INTERVAL:-2}
CONC=${CONC:-25}
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=target/release/corral
fi
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL
s=$(mktemp -d /tmp/corral-reload.XXXXXX)
chmod 755 "$s"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$s"
}
trap cleanup EXIT
mkdir -p "$s/www" "$s/run" "$s/log" "$s/corral"
echo '<?php usleep(10000); echo "Hello, world\n";' > "$s/www/work.php"
chown -R www-data:www-data "$s/www" "$s/run"
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

cat > "$s/fpm.conf" <<CONF
[global]
pid = $s/run/fpm.pid
error_log = $s/log/fpm.log
daemonize = no
[www]
user = www-data
group = www-data
listen = $s/run/fpm.sock
listen.owner = www-data
listen.group = www-data
pm = static
pm.max_children = 2
CONF
php-fpm8.2 -F -y "$s/fpm.conf" & fpm=$!; pids+=($fpm)
direct_conf() { # MAX_REQUESTS
  cat > "$s/direct.toml" <<CONF
[server]
runtime_dir = "$s/corral/direct.d"
user = "www-data"
group = "www-data"
log_level = "info"
[[listen]]
address = "unix:$s/run/direct.sock"
protocol = "fastcgi"
mode = "0666"
[pools.php]
command = ["php-cgi"]
accept = "direct"
listener = "unix:$s/run/direct.sock"
mode = "static"
max = 2
max_requests = $1
CONF
}
direct_conf 100000
"$CORRAL" run -c "$s/direct.toml" > "$s/log/corral.log" 2>&1 & corral=$!; pids+=($corral)
children_conf() { # MAX_REQUESTS
  cat > "$s/children.toml" <<CONF
[server]
runtime_dir = "$s/corral/children.d"
user = "www-data"
group = "www-data"
log_level = "info"
[[listen]]
address = "unix:$s/run/children.sock"
protocol = "fastcgi"
mode = "0666"
[pools.php]
command = ["php-cgi"]
accept = "direct"
listener = "unix:$s/run/children.sock"
mode = "static"
max = 1
php_children = 2
max_requests = $1
CONF
}
children_conf 100000
"$CORRAL" run -c "$s/children.toml" > "$s/log/corral-children.log" 2>&1 & children=$!; pids+=($children)
cat > "$s/nginx.conf" <<CONF
user www-data;
worker_processes 1;
daemon off;
pid $s/run/nginx.pid;
error_log $s/log/nginx.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $s/nginx-tmp; fastcgi_temp_path $s/nginx-tmp;
  proxy_temp_path $s/nginx-tmp; scgi_temp_path $s/nginx-tmp; uwsgi_temp_path $s/nginx-tmp;
  root $s/www;
  server { listen 127.0.0.1:18711; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/fpm.sock; } }
  server { listen 127.0.0.1:18712; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/direct.sock; } }
  server { listen 127.0.0.1:18713; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/children.sock; } }
}
CONF
wait_sock "$s/run/fpm.sock"
wait_sock "$s/run/direct.sock"
wait_sock "$s/run/children.sock"
nginx -c "$s/nginx.conf" & nginx=$!; pids+=($nginx)
for port in 18711 18712 18713; do
  ok=""
  for _ in $(seq 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/work.php" || true)" = 200 ] && { ok=1; break; }
    sleep 0.05
  done
  [ -n "$ok" ] || { echo "port $port does not answer 200" >&2; tail -n 20 "$s"/log/*.log >&2; exit 1; }
done

reload() { # ROW N: one reload of the row's server
  case $1 in
    fpm-reload) kill -USR2 "$fpm" ;;
    direct-reload) direct_conf $((100000 + $2 % 2)); kill -HUP "$corral" ;;
    direct-restart) kill -USR2 "$corral" ;;
    direct-children-reload) children_conf $((100000 + $2 % 2)); kill -HUP "$children" ;;
    direct-children-restart) kill -USR2 "$children" ;;
  esac
}
res=$s/results.tsv
: > "$res"
for row in fpm-reload direct-reload direct-restart direct-children-reload direct-children-restart; do
  case $row in fpm-*) port=18711 ;; direct-children-*) port=18713 ;; *) port=18712 ;; esac
  before=$(grep -c . "$s/log/nginx.log" 2>/dev/null || true)
  wrk -t1 -c"$CONC" -d"${SECS}s" "http://127.0.0.1:$port/work.php" > "$s/wrk.out" 2>&1 & w=$!
  n=0
  sleep "$INTERVAL"
  while kill -0 "$w" 2>/dev/null; do
    n=$((n + 1)); reload "$row" "$n"
    sleep "$INTERVAL"
  done
  wait "$w" || true
  out=$(cat "$s/wrk.out")
  reqs=$(awk '/requests in/ {print $1}' <<< "$out")
  read -r errs touts < <(wrk_errors <<< "$out")
  after=$(grep -c . "$s/log/nginx.log" 2>/dev/null || true)
  nginx_errs=$(( ${after:-0} - ${before:-0} ))
  example=$(tail -n +"$(( ${before:-0} + 1 ))" "$s/log/nginx.log" | grep -m1 -o '\[error\].*' | sed 's/, client.*//' || true)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "$n" "${reqs:-0}" "$errs" "$touts" "$nginx_errs" "$example" >> "$res"
  printf '%s: %s reloads, %s requests, %s errors, %s timeouts, %s nginx error lines\n' "$row" "$n" "$reqs" "$errs" "$touts" "$nginx_errs" >&2
  sleep 1  # let the last reload settle before the next row
done
applied=$(grep -c "reload applied" "$s/log/corral.log" || true)
applied_children=$(grep -c "reload applied" "$s/log/corral-children.log" || true)
{
  echo "wrk -t1 -c$CONC -d${SECS}s on a 10 ms page through nginx's plain fastcgi_pass, a reload every ${INTERVAL} s."
  echo "errors: wrk's socket errors and non-2xx answers; nginx lines: its error-log lines during the row."
  echo
  echo "| row | reloads | requests | errors | timeouts | nginx error lines | first nginx error |"
  echo "|---|---:|---:|---:|---:|---:|---|"
  while IFS=$'\t' read -r row n reqs errs touts nerrs example; do
    echo "| $row | $n | $reqs | $errs | $touts | $nerrs | ${example:-—} |"
  done < "$res"
  echo
  echo "corral logged $applied applied reloads (each a new pool on the same socket); the php_children corral $applied_children."
} > "$s/report.md"
cat "$s/report.md"
results_write reload "A reload every ${INTERVAL} s under load: php-fpm against a corral direct pool" "$s/report.md"
