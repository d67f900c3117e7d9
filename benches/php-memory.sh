#!/usr/bin/env bash
# Question: how much memory do N PHP processes serving WordPress take, summed over the
# whole PHP process tree, for each way of running them, and does sharing the opcode cache
# cost throughput? (issue 10; the fixture is the one tests/app_wordpress.rs builds:
# Debian's WordPress 6.1 on a private MariaDB, a config file per Host under /etc/wordpress.)
#
#   sep    corral spawns N php-cgi workers, one process each (a pool without php_children)
#   fork   corral spawns one php-cgi parent forking N children (php_children = N)
#   file   corral spawns N php-cgi workers with opcache.file_cache (file_cache_only=0)
#   fonly  as file, with opcache.file_cache_only=1 (no shared memory segment at all)
#   fpm    php-fpm8.2, pm = static, pm.max_children = N (master + N children)
#
# All four sit behind the same corral HTTP listener (front_controller = /index.php); only
# the PHP processes are summed, not corral, nginx or MariaDB. For each N in $COUNTS: start,
# read each page of $PAGES with wrk -c N for $WARM s (so that every process compiles the
# pages), sum Pss from /proc/PID/smaps_rollup over the PHP processes, then wrk -t1 -cN for
# $SECS s on the front page for req/s. Needs root (a config file under /etc/wordpress),
# mariadb-server, wordpress, php-cgi, php-fpm8.2, wrk and a release build of corral.
#
#   benches/php-memory.sh [OUT]     # OUT: also write the table there
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
COUNTS=${COUNTS:-"2 8 16"}
MODES=${MODES:-"sep fork file fonly fpm"}
WARM=${WARM:-2}
SECS=${SECS:-5}
CORRAL=${CORRAL:-target/release/corral}
OUT=${1:-}
[ -x "$CORRAL" ] || cargo build --release --quiet
scratch=$(mktemp -d /tmp/corral-phpmem.XXXXXX)
chmod 755 "$scratch"
host="wp-bench-$$.corral.test"
wpconf="/etc/wordpress/config-$host.php"
pids=()
stop() { for p in "$@"; do kill "$p" 2>/dev/null || true; done; for p in "$@"; do wait "$p" 2>/dev/null || true; done; }
cleanup() { stop "${pids[@]}" ${run_pids[@]+"${run_pids[@]}"}; rm -f "$wpconf"; rm -rf "$scratch"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

# MariaDB as mysql on a private socket, as tests/app_wordpress.rs `mariadb` does.
mkdir -p "$scratch/db" "$scratch/dbrun" "$scratch/run" "$scratch/cache"
chown mysql:mysql "$scratch/db" "$scratch/dbrun"
chown nobody "$scratch/cache"; chmod 777 "$scratch/run"
mariadb-install-db --no-defaults --datadir="$scratch/db" --user=mysql \
  --auth-root-authentication-method=socket --skip-test-db >/dev/null
dbsock="$scratch/dbrun/mysqld.sock"
mariadbd --no-defaults --datadir="$scratch/db" --socket="$dbsock" \
  --pid-file="$scratch/dbrun/mysqld.pid" --log-error="$scratch/dbrun/error.log" \
  --user=mysql --skip-networking --skip-log-bin --innodb-buffer-pool-size=64M \
  --innodb-flush-log-at-trx-commit=0 </dev/null >/dev/null 2>&1 & pids+=($!)
for _ in $(seq 600); do [ -S "$dbsock" ] && break; sleep 0.05; done
mariadb --no-defaults --socket="$dbsock" -u root -e "CREATE DATABASE wpb; \
  CREATE USER 'wpb'@'localhost' IDENTIFIED BY 'wpb-pass'; GRANT ALL ON wpb.* TO 'wpb'@'localhost';"
mkdir -p "$scratch/site/wp-content/uploads"
ln -s /usr/share/wordpress/wp-content/themes "$scratch/site/wp-content/themes"
ln -s /usr/share/wordpress/wp-content/plugins "$scratch/site/wp-content/plugins"
chmod -R a+rX "$scratch/site"; chmod 777 "$scratch/site/wp-content/uploads"
cat > "$wpconf" <<PHP
<?php
define('DB_NAME', 'wpb');
define('DB_USER', 'wpb');
define('DB_PASSWORD', 'wpb-pass');
define('DB_HOST', 'localhost:$dbsock');
define('WP_CONTENT_DIR', '$scratch/site/wp-content');
define('DISABLE_WP_CRON', true);
define('WP_HTTP_BLOCK_EXTERNAL', true);
define('AUTOMATIC_UPDATER_DISABLED', true);
PHP
chmod 644 "$wpconf"

port=$(free_port)
# One corral config per mode and count; $1 mode, $2 N.
corral_conf() {
  local pool
  case $1 in
    sep) pool="command = [\"php-cgi\"]
mode = \"static\"
max = $2" ;;
    fork) pool="command = [\"php-cgi\"]
mode = \"static\"
max = 1
php_children = $2" ;;
    file) pool="command = [\"php-cgi\", \"-d\", \"opcache.file_cache=$scratch/cache\"]
mode = \"static\"
max = $2" ;;
    fonly) pool="command = [\"php-cgi\", \"-d\", \"opcache.file_cache=$scratch/cache\", \"-d\", \"opcache.file_cache_only=1\"]
mode = \"static\"
max = $2" ;;
    fpm) pool="servers = [\"unix:$scratch/run/fpm.sock\"]
concurrency = $2" ;;
  esac
  cat <<CONF
[server]
runtime_dir = "$scratch/corral-run"  # not under the 0777 run dir, which corral refuses as a parent
user = "nobody"
log_level = "warn"
[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[pools.php]
$pool
[[contexts]]
prefix = "/wp-content"
root = "$scratch/site"
static_files = true
pool = "php"
[[contexts]]
root = "/usr/share/wordpress"
static_files = true
front_controller = "/index.php"
pool = "php"
CONF
}
fpm_conf() {
  cat <<CONF
[global]
pid = $scratch/run/fpm.pid
error_log = $scratch/run/fpm.log
daemonize = no
[wp]
user = nobody
group = nogroup
listen = $scratch/run/fpm.sock
listen.owner = nobody
listen.mode = 0666
pm = static
pm.max_children = $1
CONF
}
run_pids=()
start() { # $1 mode, $2 N; sets run_pids and php_root (the pid whose tree is PHP)
  run_pids=()
  if [ "$1" = fpm ]; then
    fpm_conf "$2" > "$scratch/fpm.conf"
    rm -f "$scratch/run/fpm.sock"
    php-fpm8.2 -F -y "$scratch/fpm.conf" & run_pids+=($!)
    php_root=$!
    wait_sock "$scratch/run/fpm.sock"
  fi
  corral_conf "$1" "$2" > "$scratch/corral.toml"
  "$CORRAL" run -c "$scratch/corral.toml" >/dev/null 2>"$scratch/corral.log" & run_pids+=($!)
  case $1 in sep|fork|file|fonly) php_root=$! ;; esac
  for _ in $(seq 400); do curl -s -o /dev/null "http://127.0.0.1:$port/wp-login.php" -H "Host: $host" && return 0; sleep 0.05; done
  echo "corral did not answer ($1 $2):" >&2; cat "$scratch/corral.log" >&2; exit 1
}
# The pids under $1 (excluding $1 itself when it is corral), for the PSS sum.
php_pids() {
  local all=() queue=("$1") p
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}; queue=("${queue[@]:1}"); all+=("$p")
    for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do queue+=("$c"); done
  done
  for p in "${all[@]}"; do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = corral ] || echo "$p"
  done
}
pss_kib() { local s=0 n=0 p k; for p in $(php_pids "$1"); do
    k=$(awk '/^Pss:/ {print $2}' /proc/"$p"/smaps_rollup 2>/dev/null || echo 0); s=$((s + ${k:-0})); n=$((n + 1)); done
  echo "$s $n"; }

# Install once, through a default pool of 2.
start sep 2
base="http://127.0.0.1:$port"
curl -sf -o /dev/null "$base/wp-admin/install.php" -H "Host: $host"
page=$(curl -sf "$base/wp-admin/install.php?step=2" -H "Host: $host" \
  --data 'weblog_title=Bench&user_name=admin&admin_password=bench-Pa55word&admin_password2=bench-Pa55word&pw_weak=1&admin_email=admin%40example.com&blog_public=0&Submit=Install')
grep -q 'WordPress has been installed' <<<"$page" || { echo "install failed" >&2; cat "$scratch/corral.log" >&2; exit 1; }
stop "${run_pids[@]}"; run_pids=()

PAGES=${PAGES:-"/ /?p=1 /?page_id=2 /?cat=1 /?s=hello /?feed=rss2 /wp-login.php /?author=1 /?m=2026"}
table="$(printf '%-6s %5s %6s %12s %10s %9s' mode N procs 'PSS MiB' 'MiB/proc' 'req/s')"
echo "$table"
for n in $COUNTS; do
  for mode in $MODES; do
    start "$mode" "$n"
    for page in $PAGES; do
      code=$(curl -s -o /dev/null -w '%{http_code}' "$base$page" -H "Host: $host")
      [ "$code" = 200 ] || { echo "$mode $n: $page answered $code" >&2; exit 1; }
      wrk -t1 -c"$n" -d"${WARM}s" -H "Host: $host" "$base$page" >/dev/null
    done
    sleep 0.5
    read -r kib procs < <(pss_kib "$php_root")
    rps=$(wrk -t1 -c"$n" -d"${SECS}s" -H "Host: $host" "$base/" | awk '/Requests\/sec/ {print $2} /Non-2xx|Socket errors/ {print "ERR:" $0 > "/dev/stderr"}')
    line=$(awk -v m="$mode" -v n="$n" -v p="$procs" -v k="$kib" -v r="$rps" \
      'BEGIN {printf "%-6s %5d %6d %12.1f %10.1f %9s", m, n, p, k/1024, k/1024/n, r}')
    echo "$line"; table="$table
$line"
    stop "${run_pids[@]}"; run_pids=()
  done
done
if [ -n "$OUT" ]; then
  {
    echo "# benches/php-memory.sh ($(date -u +%F), $(nproc) CPUs, $(php-cgi -v | head -1 | cut -d' ' -f1-2), WordPress $(dpkg-query -W -f='${Version}' wordpress))"
    echo "# command: COUNTS=\"$COUNTS\" MODES=\"$MODES\" WARM=$WARM SECS=$SECS benches/php-memory.sh $OUT"
    echo "# PSS: summed Pss of the PHP processes (procs) after wrk -c N over: $PAGES"
    echo "# modes: sep = N separate php-cgi workers; fork = php_children = N (one parent);"
    echo "#   file = sep with opcache.file_cache; fonly = file with file_cache_only=1; fpm = php-fpm8.2 pm=static"
    echo "# MiB/proc: PSS / N (fpm's master and fork's parent included in the sum)"
    echo "# req/s: wrk -t1 -c N -d ${SECS}s on / after the warm-up"
    echo "$table"
  } > "$OUT"
fi
