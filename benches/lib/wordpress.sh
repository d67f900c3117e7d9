# Sourced by the WordPress benches (wordpress-direct.sh, wordpress-gateway.sh): the fixture
# tests/app_wordpress.rs builds too. Debian's WordPress 6.1 on a private MariaDB (as mysql,
# on a Unix socket only), its config file /etc/wordpress/config-HOST.php picked by the Host
# header, wp-content in a directory of the run's own; nginx (1 worker, as www-data) running
# conf/nginx/wordpress.conf once per row with only its placeholders replaced; php-fpm8.2
# (pm = static) as the reference PHP server.
#
# The caller sets, before calling these: s (its scratch directory, mode 755), host (the
# site's name), WP_TITLE (the blog's title, checked on every front page), and the arrays
# port[ROW] and sock[ROW] (where nginx listens for a row and the FastCGI socket it passes
# to), or, for a row nginx balances over several sockets, upstream[ROW] (the sockets,
# space-separated, picked by least_conn). pids holds what runs for the whole bench, row_pids the PHP servers of the moment;
# wp_cleanup (the EXIT trap) stops both.
#
# wp_flat moves the bench into a CPU cgroup of its own before it starts anything. Linux's
# autogroups (sched_autogroup_enabled = 1) give each session an equal share of a busy CPU,
# and the rows differ in sessions: php-fpm's and php-cgi -b's children share their parent's,
# corral's workers each have their own. Inside a cgroup no autogroup applies, so every
# process of every row competes as an equal thread, and the rows differ only in what they
# do; the cgroup as a whole still competes with the rest of the machine.

pids=()
row_pids=()
flat_cgroup=""
declare -A upstream=()  # the callers that balance no row leave it empty

wp_stop() { # PID...: signals each, then waits for each
  local p
  for p in "$@"; do kill "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

# WHO TRIES PID...: stops the rows' servers (row_pids), then waits, TRIES times 50 ms at most,
# until every PID (their PHP processes, listed before the stop) is gone, so none is left
# sharing pages with the next row or still writing its profile; else names WHO and fails.
wp_stop_rows() {
  local who=$1 tries=$2 p
  shift 2
  wp_stop ${row_pids[@]+"${row_pids[@]}"}
  row_pids=()
  for _ in $(seq "$tries"); do
    for p in "$@"; do [ -d "/proc/$p" ] && { sleep 0.05; continue 2; }; done
    return 0
  done
  echo "$who: PHP processes still running after their server stopped: $*" >&2
  exit 1
}

wp_cleanup() {
  wp_stop ${row_pids[@]+"${row_pids[@]}"} ${pids[@]+"${pids[@]}"}
  rm -f "/etc/wordpress/config-$host.php"
  rm -rf "$s"
  if [ -n "$flat_cgroup" ]; then
    echo $$ > "$(dirname "$flat_cgroup")/cgroup.procs" 2> /dev/null || true
    rmdir "$flat_cgroup" 2> /dev/null || true
  fi
}

# Moves this shell (and so everything it starts from now on) into a new CPU cgroup.
wp_flat() {
  local base
  for base in /sys/fs/cgroup/cpu /sys/fs/cgroup; do
    [ -f "$base/cgroup.procs" ] && { [ -f "$base/cpu.shares" ] || [ -f "$base/cpu.weight" ]; } && break
    base=""
  done
  [ -n "$base" ] || { echo "FLAT=1: no CPU cgroup controller found under /sys/fs/cgroup" >&2; exit 1; }
  flat_cgroup=$base/corral-bench-$$
  mkdir "$flat_cgroup"
  # FLAT_WEIGHT: the group's share of a busy CPU against each other group (a session's
  # autogroup, say), as cgroup v1's cpu.shares (1024 = an equal share; 262144, the most,
  # leaves whatever else runs on the machine next to nothing while the bench wants the CPU).
  if [ -n "${FLAT_WEIGHT:-}" ]; then
    if [ -f "$flat_cgroup/cpu.shares" ]; then
      echo "$FLAT_WEIGHT" > "$flat_cgroup/cpu.shares"
    else # cgroup v2's cpu.weight: 100 = an equal share, 10000 the most
      echo $(( FLAT_WEIGHT * 100 / 1024 > 10000 ? 10000 : FLAT_WEIGHT * 100 / 1024 )) > "$flat_cgroup/cpu.weight"
    fi
  fi
  echo $$ > "$flat_cgroup/cgroup.procs"
}

wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

# MariaDB and the site's config file; wp-content under $s/site.
wp_database() {
  local wpconf="/etc/wordpress/config-$host.php"
  mkdir -p "$s/db" "$s/dbrun" "$s/run" "$s/log" "$s/corral" "$s/nginx" "$s/site/wp-content/uploads"
  chown mysql:mysql "$s/db" "$s/dbrun"
  chown www-data:www-data "$s/run"
  mariadb-install-db --no-defaults --datadir="$s/db" --user=mysql \
    --auth-root-authentication-method=socket --skip-test-db > /dev/null
  dbsock=$s/dbrun/mysqld.sock
  mariadbd --no-defaults --datadir="$s/db" --socket="$dbsock" \
    --pid-file="$s/dbrun/mysqld.pid" --log-error="$s/dbrun/error.log" \
    --user=mysql --skip-networking --skip-log-bin --innodb-buffer-pool-size=64M \
    --innodb-flush-log-at-trx-commit=0 < /dev/null > /dev/null 2>&1 & pids+=($!)
  wait_sock "$dbsock"
  mariadb --no-defaults --socket="$dbsock" -u root -e "CREATE DATABASE wpd; \
    CREATE USER 'wpd'@'localhost' IDENTIFIED BY 'wpd-pass'; GRANT ALL ON wpd.* TO 'wpd'@'localhost';"
  ln -s /usr/share/wordpress/wp-content/themes "$s/site/wp-content/themes"
  ln -s /usr/share/wordpress/wp-content/plugins "$s/site/wp-content/plugins"
  chmod -R a+rX "$s/site"
  chown www-data:www-data "$s/site/wp-content/uploads"
  cat > "$wpconf" << PHP
<?php
define('DB_NAME', 'wpd');
define('DB_USER', 'wpd');
define('DB_PASSWORD', 'wpd-pass');
define('DB_HOST', 'localhost:$dbsock');
define('WP_CONTENT_DIR', '$s/site/wp-content');
define('DISABLE_WP_CRON', true);
define('WP_HTTP_BLOCK_EXTERNAL', true);
define('AUTOMATIC_UPDATER_DISABLED', true);
PHP
  chmod 644 "$wpconf"
}

# nginx with one server block per ROW given (conf/nginx/wordpress.conf, its placeholders
# replaced by the row's port and socket, or by an upstream of the row's sockets).
wp_nginx() { # ROW...
  local r pass u
  ln -s /etc/nginx/fastcgi_params "$s/nginx/fastcgi_params"
  {
    echo "user www-data;"
    echo "worker_processes 1;"
    echo "daemon off;"
    echo "pid $s/run/nginx.pid;"
    echo "error_log $s/log/nginx.log;"
    echo "events { worker_connections 4096; }"
    echo "http {"
    echo "  include /etc/nginx/mime.types;"
    echo "  access_log off;"
    echo "  client_body_temp_path $s/nginx-tmp; fastcgi_temp_path $s/nginx-tmp;"
    echo "  proxy_temp_path $s/nginx-tmp; scgi_temp_path $s/nginx-tmp; uwsgi_temp_path $s/nginx-tmp;"
    for r in "$@"; do
      pass=unix:${sock[$r]:-}
      if [ -n "${upstream[$r]:-}" ]; then
        pass=wp_${r//-/_}
        echo "  upstream $pass {"
        echo "    least_conn;"
        for u in ${upstream[$r]}; do echo "    server unix:$u;"; done
        echo "  }"
      fi
      sed -e "s|blog\.example\.com|$host|" -e "s|unix:/run/corral/php\.sock|$pass|" \
        -e "s|/var/lib/wordpress|$s/site|" -e "s|listen 80;|listen 127.0.0.1:${port[$r]};|" \
        conf/nginx/wordpress.conf
    done
    echo "}"
  } > "$s/nginx/nginx.conf"
  nginx -c "$s/nginx/nginx.conf" & pids+=($!)
}

# php-fpm8.2 on sock[fpm], pm = static with N children, Debian's defaults otherwise; its pid
# (the master) is $!.
wp_fpm() { # N [TOOL...]: TOOL (e.g. valgrind and its options) runs php-fpm8.2 when given
  local n=$1; shift
  cat > "$s/fpm.conf" << CONF
[global]
pid = $s/run/fpm.pid
error_log = $s/log/fpm.log
daemonize = no
[www]
user = www-data
group = www-data
listen = ${sock[fpm]}
listen.owner = www-data
listen.group = www-data
pm = static
pm.max_children = $n
CONF
  "$@" php-fpm8.2 -F -y "$s/fpm.conf" & row_pids+=($!)
}

# The [[contexts]] of a corral serving the site the way conf/wordpress.toml does (the shape
# tests/support/wordpress.rs writes): wp-content and WordPress's own files on corral's http
# listener, with the front controller, and the FastCGI listener FCGI (an address) to the pool.
wp_corral_contexts() { # FCGI
  cat << CONF
[[contexts]]
prefix = "/wp-content"
root = "$s/site"
static_files = true
pool = "php"

[[contexts]]
root = "/usr/share/wordpress"
static_files = true
front_controller = "/index.php"
pool = "php"

[[contexts]]
listen = "$1"
root = "/usr/share/wordpress"
pool = "php"
CONF
}

# Installs WordPress through URL (a row already serving it), titled WP_TITLE.
wp_install() { # URL
  local code page
  for _ in $(seq 200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Host: $host" "$1wp-admin/install.php" || true)
    [ "$code" = 200 ] && break
    sleep 0.05
  done
  page=$(curl -s -H "Host: $host" "$1wp-admin/install.php?step=2" \
    --data "weblog_title=${WP_TITLE// /+}&user_name=admin&admin_password=bench-Pa55word&admin_password2=bench-Pa55word&pw_weak=1&admin_email=admin%40example.com&blog_public=0&Submit=Install" || true)
  grep -q 'WordPress has been installed' <<< "$page" || { echo "install failed" >&2; tail -n 20 "$s"/log/*.log >&2; exit 1; }
}

wp_front() { # URL: "ok" when the front page is 200 with the blog's title, else the status
  local body code
  body=$(curl -s -H "Host: $host" -w '\n%{http_code}' "$1" || true)
  code=${body##*$'\n'}
  if [ "$code" = 200 ] && grep -q "$WP_TITLE" <<< "$body"; then echo ok; else echo "${code:-none}"; fi
}

children() { # live children of $1
  local f line rest state ppid
  for f in /proc/[0-9]*/stat; do
    { read -r line < "$f"; } 2> /dev/null || continue
    rest=${line##*) }
    read -r state ppid _ <<< "$rest"
    [ "$ppid" = "$1" ] && [ "$state" != Z ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
  return 0
}
tree() { local k; echo "$1"; for k in $(children "$1"); do tree "$k"; done; }
