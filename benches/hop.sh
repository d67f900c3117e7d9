#!/usr/bin/env bash
# Question: what does one hop through corral cost, in CPU per request of every process and in
# req/s, against nginx, HAProxy and php-fpm configured the way their users run them? The load
# is wrk -t1 (a tool we did not write), at each concurrency level, rows interleaved per round
# (each round's order one row further on).
#
# Rows (NAME: path):
#   nx-null      nginx -> null FastCGI, plain fastcgi_pass (a new connection per request)
#   nxk-null     nginx -> null FastCGI, fastcgi_keep_conn + upstream keepalive
#   hap-null     HAProxy (1 thread, use-fcgi-app, keep-conn) -> null FastCGI
#   co-null      corral http -> null FastCGI
#   nxco-null    nginx plain fastcgi_pass -> corral fastcgi listener -> null FastCGI
#   nxkco-null   nginx keep_conn -> corral fastcgi listener -> null FastCGI
#   nx-scgi      nginx scgi_pass -> null SCGI;  co-scgi  corral http -> null SCGI
#   nxco-scgi    nginx scgi_pass -> corral scgi listener -> null FastCGI
#   co-lsapi     corral http -> null LSAPI
#   nx-fpm       nginx plain fastcgi_pass -> php-fpm (static 2)
#   nxk-fpm      nginx keep_conn (keepalive 2) -> php-fpm (a pool of its own, static 2)
#   nxco-cgi     nginx plain fastcgi_pass -> corral fastcgi -> php-cgi (2, spawned by corral)
#   nxkco-cgi    nginx keep_conn -> corral fastcgi -> php-cgi
#   co-cgi       corral http -> php-cgi
#   co-pc, nxco-pc   corral http, and nginx plain fastcgi_pass -> corral fastcgi, -> one php-cgi
#                parent with php_children = 2 (its children share one OPcache)
#   nx-direct    nginx plain fastcgi_pass -> php-cgi (2) of a corral direct pool (accept =
#                "direct": the workers accept on the pool's listener, corral is off the path)
#   nx-fpm-info, nx-direct-info   the same two with phpinfo() (~70 KB) instead of hello world
#   co-lsphp-opc corral http -> lsphp (2, scripts/build-lsphp.sh) with its OPcache on
#                (-c php.ini: zend_extension=opcache.so, opcache.enable=1; php-fpm and php-cgi
#                have Debian's OPcache on, so every PHP row compiles hello.php once per process)
#   co-null-b, co-lsphp-opc-b, co-cgi-b, nxco-cgi-b   with CORRAL_B set: co-null,
#                co-lsphp-opc, co-cgi and nxco-cgi served by that second corral binary (a build
#                before a change), interleaved with the rest
#
# Every process's CPU (utime+stime from /proc/PID/stat, summed over its live process tree) is
# sampled around each run and divided by the requests wrk completed: "front" is nginx/HAProxy/
# corral (both for the two-hop rows; "corral" its corral's part), "backend" the null backend or the PHP processes, "wrk"
# the load tool. The null backends are `corral null-backend` (13 bytes). 2 PHP processes
# everywhere. Loopback TCP from wrk, unix sockets behind. Every process it starts it stops.
#
# wrk's socket errors and non-2xx answers are counted per row (errors: connect, read, write,
# non-2xx; timeouts apart); a row with either is marked invalid and no ratio is computed from it.
#
#   bash benches/hop.sh                       # all rows, c = 1 25 100, 5 s, 2 rounds
#   ROWS='nx-fpm|nxco-cgi' LEVELS=25 bash benches/hop.sh
#   taskset -c 0 bash benches/hop.sh          # every process on one CPU: what each row costs
#                                             # with no wake-up crossing CPUs (decision 40)
# Env: SECS (5), ROUNDS (2), LEVELS ("1 25 100"), ROWS (regex, all), CORRAL (release build),
# CORRAL_B (a second binary for the -b rows, none by default),
# SCHED (every corral's `[server] scheduler`; default corral's own),
# PIN (1: every corral with `pin_threads = true`, nginx with `worker_cpu_affinity auto`,
# HAProxy with `cpu-map 1/1 0`: each front's event loop on the first CPU, as each documents
# for a machine of its own; the backends, the workers and wrk stay free),
# WAKES (1: at c=1, each run under `perf sched record` too, and the table gets the wake-ups
# among the row's threads per request, how many crossed CPUs, and how long a crossing one took
# to run; decision 40),
# LSPHP (/var/cache/corral/lsphp-8.2/lsphp), LSPHP_OPCACHE (opcache.so beside LSPHP), OUT
# (default benches/RESULTS.md, whose `hop` section the table replaces; OUT= prints it only;
# benches/lib/results.sh). Before measuring it checks through each PHP front that OPcache is
# really on (opcache_get_status() !== false) and stops if not.
# Needs root (nginx and PHP run as www-data), nginx, haproxy, php-fpm8.2, php-cgi, wrk.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="SECS ROUNDS LEVELS ROWS CORRAL CORRAL_B SCHED PIN WAKES LSPHP LSPHP_OPCACHE"
results_start "$@"
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-2}
LEVELS=${LEVELS:-1 25 100}
ROWS=${ROWS:-.*}
sched_line=${SCHED:+scheduler = \"$SCHED\"}
if [ "${PIN:-}" = 1 ]; then
  sched_line="$sched_line
pin_threads = true"
  nginx_pin='worker_cpu_affinity auto;'
  haproxy_pin='  cpu-map 1/1 0'
else
  nginx_pin=
  haproxy_pin=
fi
LSPHP=${LSPHP:-/var/cache/corral/lsphp-8.2/lsphp}
LSPHP_OPCACHE=${LSPHP_OPCACHE:-$(dirname "$LSPHP")/opcache.so}
[ -f "$LSPHP_OPCACHE" ] || { echo "no $LSPHP_OPCACHE: run scripts/build-lsphp.sh" >&2; exit 1; }
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=target/release/corral
fi
CORRAL=$(realpath "$CORRAL")
CORRAL_B=${CORRAL_B:+$(realpath "$CORRAL_B")}
RESULTS_BINARY=$CORRAL
hz=$(getconf CLK_TCK)
s=$(mktemp -d /tmp/corral-hop.XXXXXX)
chmod 755 "$s"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$s"
}
trap cleanup EXIT
ulimit -n 16384 2>/dev/null || true
mkdir -p "$s/www" "$s/run" "$s/log" "$s/corral"  # corral's runtime dirs: not under the www-data run dir
echo '<?php echo "Hello, world\n";' > "$s/www/hello.php"
echo '<?php phpinfo();' > "$s/www/info.php"
echo '<?php var_export(function_exists("opcache_get_status") && opcache_get_status(false) !== false);' > "$s/www/opcache.php"
echo 'x' > "$s/www/null"
chown -R www-data:www-data "$s/www" "$s/run"
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

# ---- backends ----
for p in fastcgi scgi lsapi; do
  "$CORRAL" null-backend --protocol "$p" --listen "unix:$s/run/null-$p.sock" & pids+=($!)
  eval "null_$p=$!"
done
# lsphp takes no -d options in LSAPI mode: its OPcache comes from a php.ini of its own.
printf 'zend_extension=%s\nopcache.enable=1\n' "$LSPHP_OPCACHE" > "$s/lsphp.ini"
cat > "$s/fpm.conf" <<CONF
[global]
pid = $s/run/fpm.pid
error_log = $s/log/fpm.log
daemonize = no
[plain]
user = www-data
group = www-data
listen = $s/run/fpm.sock
listen.owner = www-data
listen.group = www-data
pm = static
pm.max_children = 2
; The keep-alive row has a pool of its own: a child holding one of nginx's idle kept
; connections is blocked on it, and would starve the plain row run after it.
[keep]
user = www-data
group = www-data
listen = $s/run/fpm-k.sock
listen.owner = www-data
listen.group = www-data
pm = static
pm.max_children = 2
CONF
php-fpm8.2 -F -y "$s/fpm.conf" & fpm=$!; pids+=($fpm)
wait_sock "$s/run/fpm-k.sock"
for p in fastcgi scgi lsapi; do wait_sock "$s/run/null-$p.sock"; chmod 666 "$s/run/null-$p.sock"; done

# ---- corrals: one for the null backends, one per PHP pool ----
cat > "$s/null.toml" <<CONF
[server]
runtime_dir = "$s/corral/null.d"
log_level = "warn"
$sched_line
[[listen]]
address = "127.0.0.1:18601"
protocol = "http"
[[listen]]
address = "127.0.0.1:18602"
protocol = "http"
[[listen]]
address = "127.0.0.1:18603"
protocol = "http"
[[listen]]
address = "unix:$s/run/corral-fcgi.sock"
protocol = "fastcgi"
mode = "0666"
[[listen]]
address = "unix:$s/run/corral-scgi.sock"
protocol = "scgi"
mode = "0666"
[pools.fcgi]
servers = ["unix:$s/run/null-fastcgi.sock"]
concurrency = 128
[pools.scgi]
protocol = "scgi"
servers = ["unix:$s/run/null-scgi.sock"]
concurrency = 128
[pools.lsapi]
protocol = "lsapi"
servers = ["unix:$s/run/null-lsapi.sock"]
concurrency = 128
[[contexts]]
listen = "127.0.0.1:18602"
pool = "scgi"
[[contexts]]
listen = "127.0.0.1:18603"
pool = "lsapi"
[[contexts]]
pool = "fcgi"
CONF
php_corral() { # NAME PORT COMMAND(the TOML array's items) PROTOCOL [POOL SIZING LINES]
  local sizing=${5:-'mode = "static"
min = 2
max = 2'}
  cat > "$s/$1.toml" <<CONF
[server]
runtime_dir = "$s/corral/$1.d"
user = "www-data"
group = "www-data"
log_level = "warn"
$sched_line
[[listen]]
address = "127.0.0.1:$2"
protocol = "http"
[[listen]]
address = "unix:$s/run/corral-$1.sock"
protocol = "fastcgi"
mode = "0666"
[pools.php]
command = [$3]
protocol = "$4"
$sizing
[[contexts]]
pool = "php"
root = "$s/www"
CONF
}
php_corral cgi 18611 '"php-cgi"' fastcgi
php_corral pc 18614 '"php-cgi"' fastcgi 'mode = "static"
max = 1
php_children = 2'
php_corral lsphp 18612 "\"$LSPHP\", \"-c\", \"$s/lsphp.ini\"" lsapi
if [ -n "$CORRAL_B" ]; then
  php_corral lsphp_b 18613 "\"$LSPHP\", \"-c\", \"$s/lsphp.ini\"" lsapi
  php_corral cgi_b 18615 '"php-cgi"' fastcgi
  cat > "$s/null_b.toml" <<CONF
[server]
runtime_dir = "$s/corral/null_b.d"
log_level = "warn"
$sched_line
[[listen]]
address = "127.0.0.1:18604"
protocol = "http"
[pools.fcgi]
servers = ["unix:$s/run/null-fastcgi.sock"]
concurrency = 128
[[contexts]]
pool = "fcgi"
CONF
fi
cat > "$s/direct.toml" <<CONF
[server]
runtime_dir = "$s/corral/direct.d"
user = "www-data"
group = "www-data"
log_level = "warn"
$sched_line
[[listen]]
address = "unix:$s/run/corral-direct.sock"
protocol = "fastcgi"
mode = "0666"
[pools.php]
command = ["php-cgi"]
accept = "direct"
listener = "unix:$s/run/corral-direct.sock"
mode = "static"
max = 2
CONF
declare -A corral_pid
for c in null cgi pc lsphp direct; do
  "$CORRAL" run -c "$s/$c.toml" > "$s/log/corral-$c.log" 2>&1 & corral_pid[$c]=$!; pids+=($!)
done
if [ -n "$CORRAL_B" ]; then
  for c in null_b lsphp_b cgi_b; do
    "$CORRAL_B" run -c "$s/$c.toml" > "$s/log/corral-$c.log" 2>&1 & corral_pid[$c]=$!; pids+=($!)
  done
fi

# ---- nginx (1 worker) and HAProxy (1 thread) ----
cat > "$s/nginx.conf" <<CONF
user www-data;
worker_processes 1;
$nginx_pin
daemon off;
pid $s/run/nginx.pid;
error_log $s/log/nginx.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $s/nginx-tmp; fastcgi_temp_path $s/nginx-tmp;
  proxy_temp_path $s/nginx-tmp; scgi_temp_path $s/nginx-tmp; uwsgi_temp_path $s/nginx-tmp;
  root $s/www;
  upstream null_k { server unix:$s/run/null-fastcgi.sock; keepalive 16; }
  # No more kept connections than php-fpm has children: each child serves one connection
  # at a time, so a kept connection beyond them waits for a child that never frees.
  upstream fpm_k { server unix:$s/run/fpm-k.sock; keepalive 2; }
  upstream co_null_k { server unix:$s/run/corral-fcgi.sock; keepalive 16; }
  upstream co_cgi_k { server unix:$s/run/corral-cgi.sock; keepalive 16; }
  server { listen 127.0.0.1:18501; location / { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/null-fastcgi.sock; } }
  server { listen 127.0.0.1:18502; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass null_k; } }
  server { listen 127.0.0.1:18503; location / { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/corral-fcgi.sock; } }
  server { listen 127.0.0.1:18504; location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass co_null_k; } }
  server { listen 127.0.0.1:18505; location / { include /etc/nginx/scgi_params; scgi_pass unix:$s/run/null-scgi.sock; } }
  server { listen 127.0.0.1:18506; location / { include /etc/nginx/scgi_params; scgi_pass unix:$s/run/corral-scgi.sock; } }
  server { listen 127.0.0.1:18511; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/fpm.sock; } }
  server { listen 127.0.0.1:18512; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass fpm_k; } }
  server { listen 127.0.0.1:18513; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/corral-cgi.sock; } }
  server { listen 127.0.0.1:18514; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass co_cgi_k; } }
  server { listen 127.0.0.1:18515; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/corral-direct.sock; } }
  server { listen 127.0.0.1:18516; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/corral-pc.sock; } }
  server { listen 127.0.0.1:18517; location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$s/run/corral-cgi_b.sock; } }
}
CONF
nginx -c "$s/nginx.conf" & nginx=$!; pids+=($nginx)
cat > "$s/haproxy.cfg" <<CONF
global
  nbthread 1
$haproxy_pin
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
fcgi-app null
  docroot $s/www
frontend f
  bind 127.0.0.1:18521
  default_backend b
backend b
  use-fcgi-app null
  server s1 unix@$s/run/null-fastcgi.sock proto fcgi
CONF
haproxy -f "$s/haproxy.cfg" -db > "$s/log/haproxy.log" 2>&1 & hap=$!; pids+=($hap)

# NAME URL FRONT_PIDS BACKEND_PIDS (pids as "a b", trees summed)
rows=(
  "nx-null|http://127.0.0.1:18501/null|nginx|null_fastcgi"
  "nxk-null|http://127.0.0.1:18502/null|nginx|null_fastcgi"
  "hap-null|http://127.0.0.1:18521/null|hap|null_fastcgi"
  "co-null|http://127.0.0.1:18601/null|co_null|null_fastcgi"
  "nxco-null|http://127.0.0.1:18503/null|nginx co_null|null_fastcgi"
  "nxkco-null|http://127.0.0.1:18504/null|nginx co_null|null_fastcgi"
  "nx-scgi|http://127.0.0.1:18505/null|nginx|null_scgi"
  "co-scgi|http://127.0.0.1:18602/null|co_null|null_scgi"
  "nxco-scgi|http://127.0.0.1:18506/null|nginx co_null|null_fastcgi"
  "co-lsapi|http://127.0.0.1:18603/null|co_null|null_lsapi"
  "nx-fpm|http://127.0.0.1:18511/hello.php|nginx|fpm"
  "nxk-fpm|http://127.0.0.1:18512/hello.php|nginx|fpm"
  "nxco-cgi|http://127.0.0.1:18513/hello.php|nginx co_cgi|co_cgi_kids"
  "nxkco-cgi|http://127.0.0.1:18514/hello.php|nginx co_cgi|co_cgi_kids"
  "co-cgi|http://127.0.0.1:18611/hello.php|co_cgi|co_cgi_kids"
  "co-pc|http://127.0.0.1:18614/hello.php|co_pc|co_pc_kids"
  "nxco-pc|http://127.0.0.1:18516/hello.php|nginx co_pc|co_pc_kids"
  "nx-direct|http://127.0.0.1:18515/hello.php|nginx co_direct|co_direct_kids"
  "nx-fpm-info|http://127.0.0.1:18511/info.php|nginx|fpm"
  "nx-direct-info|http://127.0.0.1:18515/info.php|nginx co_direct|co_direct_kids"
  "co-lsphp-opc|http://127.0.0.1:18612/hello.php|co_lsphp|co_lsphp_kids"
)
if [ -n "$CORRAL_B" ]; then
  rows+=(
    "co-null-b|http://127.0.0.1:18604/null|co_null_b|null_fastcgi"
    "co-lsphp-opc-b|http://127.0.0.1:18613/hello.php|co_lsphp_b|co_lsphp_b_kids"
    "co-cgi-b|http://127.0.0.1:18615/hello.php|co_cgi_b|co_cgi_b_kids"
    "nxco-cgi-b|http://127.0.0.1:18517/hello.php|nginx co_cgi_b|co_cgi_b_kids"
  )
fi
selected=()
for r in "${rows[@]}"; do [[ ${r%%|*} =~ ^($ROWS)$ ]] && selected+=("$r"); done
[ "${#selected[@]}" -gt 0 ] || { echo "no row matches ROWS=$ROWS" >&2; exit 1; }

children() { # live children of $1
  local f line rest state ppid
  for f in /proc/[0-9]*/stat; do
    { read -r line < "$f"; } 2>/dev/null || continue
    rest=${line##*) }; read -r state ppid _ <<< "$rest"
    [ "$ppid" = "$1" ] && [ "$state" != Z ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
  return 0
}
tree() { local k; echo "$1"; for k in $(children "$1"); do tree "$k"; done; }
pids_of() { # a symbolic name -> pids (whole trees)
  case $1 in
    nginx) tree "$nginx" ;;
    hap) tree "$hap" ;;
    null_*) eval "echo \$$1" ;;
    fpm) tree "$fpm" ;;
    co_null) echo "${corral_pid[null]}" ;;
    co_cgi) echo "${corral_pid[cgi]}" ;;
    co_lsphp) echo "${corral_pid[lsphp]}" ;;
    co_direct) echo "${corral_pid[direct]}" ;;
    co_direct_kids) for k in $(children "${corral_pid[direct]}"); do tree "$k"; done ;;
    co_cgi_kids) for k in $(children "${corral_pid[cgi]}"); do tree "$k"; done ;;
    co_pc) echo "${corral_pid[pc]}" ;;
    co_pc_kids) for k in $(children "${corral_pid[pc]}"); do tree "$k"; done ;;
    co_lsphp_kids) for k in $(children "${corral_pid[lsphp]}"); do tree "$k"; done ;;
    co_null_b) echo "${corral_pid[null_b]}" ;;
    co_lsphp_b) echo "${corral_pid[lsphp_b]}" ;;
    co_lsphp_b_kids) for k in $(children "${corral_pid[lsphp_b]}"); do tree "$k"; done ;;
    co_cgi_b) echo "${corral_pid[cgi_b]}" ;;
    co_cgi_b_kids) for k in $(children "${corral_pid[cgi_b]}"); do tree "$k"; done ;;
  esac
}
ticks() { # summed utime+stime of pids
  local t=0 p v
  for p in "$@"; do
    v=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    t=$((t + v))
  done
  echo "$t"
}
self_ticks() { awk '{print $16 + $17}' /proc/$$/stat; } # reaped children of this shell (wrk)
thread_ids() { # the threads of pids
  local p
  for p in "$@"; do ls /proc/"$p"/task 2>/dev/null; done
}
moves() { # times the scheduler moved a thread of pids to another CPU (se.nr_migrations, summed)
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/sched 2>/dev/null; done | awk '$1 == "se.nr_migrations" {t += $3} END {print t + 0}'
}

# Wait for every front to answer.
for r in "${rows[@]}"; do
  IFS='|' read -r name url _ <<< "$r"
  ok=""
  for _ in $(seq 200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$url" 2>/dev/null || true)
    [ "$code" = 200 ] && { ok=1; break; }
    sleep 0.05
  done
  [ -n "$ok" ] || { echo "$name: $url does not answer 200 (last: $code)" >&2; for f in "$s"/log/*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done; exit 1; }
done
# Every PHP row runs with OPcache on, or the comparison says nothing.
for url in http://127.0.0.1:18511 http://127.0.0.1:18512 http://127.0.0.1:18513 http://127.0.0.1:18515 http://127.0.0.1:18516 http://127.0.0.1:18611 http://127.0.0.1:18612 http://127.0.0.1:18614 ${CORRAL_B:+http://127.0.0.1:18613 http://127.0.0.1:18615 http://127.0.0.1:18517}; do
  on=$(curl -s "$url/opcache.php" || true)
  [ "$on" = true ] || { echo "OPcache is not on behind $url (opcache.php said: ${on:-nothing})" >&2; exit 1; }
done

res=$s/results.tsv
: > "$res"
for c in $LEVELS; do
  for r in "${selected[@]}"; do
    IFS='|' read -r name url _ <<< "$r"
    wrk -t1 -c"$c" -d1s "$url" > /dev/null 2>&1  # warm-up, unrecorded
  done
  for round in $(seq "$ROUNDS"); do
    # Each round starts one row further on, so that no row always runs right after the same
    # other: with a fixed order the second of two identical corrals (CORRAL_B = CORRAL) ran
    # 15% faster at c=25 than the first, which ran right after nx-fpm.
    n=${#selected[@]}
    for i in $(seq 0 $((n - 1))); do
      r=${selected[$(((i + round - 1) % n))]}
      IFS='|' read -r name url fronts backends <<< "$r"
      fp=(); bp=(); cp=()
      for f in $fronts; do mapfile -t -O "${#fp[@]}" fp < <(pids_of "$f"); done
      for f in $fronts; do [[ $f == co_* ]] && mapfile -t -O "${#cp[@]}" cp < <(pids_of "$f"); done
      for b in $backends; do mapfile -t -O "${#bp[@]}" bp < <(pids_of "$b"); done
      f0=$(ticks "${fp[@]}"); b0=$(ticks "${bp[@]}"); w0=$(self_ticks); m0=$(moves "${fp[@]}"); c0=$(ticks "${cp[@]}")
      sp=""
      if [ "${WAKES:-}" = 1 ] && [ "$c" = 1 ]; then
        perf sched record -q -o "$s/sched.data" -- sleep "$SECS" > /dev/null 2>&1 & sp=$!
      fi
      out=$(wrk -t1 -c"$c" -d"${SECS}s" --latency "$url" 2>&1)
      f1=$(ticks "${fp[@]}"); b1=$(ticks "${bp[@]}"); w1=$(self_ticks); m1=$(moves "${fp[@]}"); c1=$(ticks "${cp[@]}")
      wakes="- - - -"
      if [ -n "$sp" ]; then
        wait "$sp" || true
        wakes=$(perf script -i "$s/sched.data" 2>/dev/null \
          | python3 benches/lib/wakes.py wrk $(thread_ids "${fp[@]}" "${bp[@]}"))
      fi
      reqs=$(awk '/requests in/ {print $1}' <<< "$out")
      p50=$(awk '$1 == "50%" {print $2}' <<< "$out")
      p99=$(awk '$1 == "99%" {print $2}' <<< "$out")
      read -r errs touts < <(wrk_errors <<< "$out")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$name" "$round" "${reqs:-0}" \
        $((f1 - f0)) $((b1 - b0)) $((w1 - w0)) "$p50" "$p99" "$errs" "$touts" $((m1 - m0)) $((c1 - c0)) "$wakes" >> "$res"
      printf '%s c=%s round %s: %s requests, p50 %s p99 %s, %s errors, %s timeouts\n' "$name" "$c" "$round" "$reqs" "$p50" "$p99" "$errs" "$touts" >&2
    done
  done
done

# The table and issue 10's ratios, from the runs in $res, in Markdown.
report() {
  echo "wrk -t1 -d${SECS}s, $ROUNDS rounds interleaved per level after a 1 s warm-up (each round's order one row further on), requests of the rounds pooled."
  echo "CPU in µs per request (utime+stime from /proc over the runs / requests). p50 and p99 are wrk's, one per round."
  echo "corral µs: corral's part of front µs (all of it in the rows corral fronts alone; - where corral is not on the path)."
  echo "front moves: how often per request the scheduler moved a thread of the front (nginx, HAProxy, corral) to the other CPU"
  echo "(se.nr_migrations of /proc/PID/task/*/sched); at c=1 a row whose front moves about twice per request ran on a layout"
  echo "where every wake-up crosses CPUs (decision 38). all µs: front + backend + wrk; at c=1 nothing overlaps, so req/s"
  echo "stays within about 10% of 1e6 / all µs, and a ratio of two c=1 rows is nearly the inverse ratio of their all µs."
  echo "errors: wrk's socket connect, read and write errors and non-2xx/3xx answers; timeouts: its socket timeouts."
  echo "A row with either is **invalid**: its figures are printed, no ratio uses them."
  if [ "${WAKES:-}" = 1 ]; then
    echo "WAKES=1 (c=1 only, under \`perf sched record\`): the wake-ups among the row's threads (front, backends, wrk) per"
    echo "request, the share whose wakee ran on another CPU than its waker, and the median time from wake-up to running of"
    echo "those crossing CPUs and of the rest (benches/lib/wakes.py; decision 40)."
  fi
  echo
  python3 - "$res" "$SECS" "$hz" <<'PY'
import sys
res, secs, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rows = {}  # (c, name) -> sums over the rounds
for line in open(res):
    c, name, _round, reqs, f, b, w, p50, p99, errs, touts, moves, co, wk = line.rstrip("\n").split("\t")
    r = rows.setdefault((int(c), name), dict(n=0, runs=0, f=0, b=0, w=0, m=0, co=0, p50=[], p99=[], e=0, t=0, wk=[]))
    rate, share, cross, local = wk.split()
    if rate != "-" and int(reqs) > 0:
        r["wk"].append((float(rate) / (int(reqs) / secs), float(share), cross, local))
    r["n"] += int(reqs); r["runs"] += 1; r["f"] += int(f); r["b"] += int(b); r["w"] += int(w); r["m"] += int(moves)
    r["co"] += int(co)
    r["p50"].append(p50 or "-"); r["p99"].append(p99 or "-"); r["e"] += int(errs); r["t"] += int(touts)
def valid(k):
    r = rows.get(k)
    return r is not None and r["n"] > 0 and r["e"] == 0 and r["t"] == 0
def us(r, x):
    return r[x] / hz * 1e6 / r["n"] if r["n"] else float("nan")
wakes = any(r["wk"] for r in rows.values())
def wake_cells(r):
    """wakes/req, the share crossing CPUs, and the median µs from wake-up to running, crossing and not."""
    if not r["wk"]:
        return " - | - | - | - |"
    n = len(r["wk"])
    def med(xs):  # the median of the rounds' medians ("-": no round had such a wake-up)
        xs = sorted(float(x) for x in xs if x != "-")
        return f"{xs[len(xs) // 2]:.0f}" if xs else "-"
    return (f" {sum(x[0] for x in r['wk']) / n:.2f} | {100 * sum(x[1] for x in r['wk']) / n:.0f}% |"
            f" {med([x[2] for x in r['wk']])} | {med([x[3] for x in r['wk']])} |")
extra_head = " wakes/req | crossing | cross wake µs | local wake µs |" if wakes else ""
print("| row | c | req/s | p50 | p99 | front µs | corral µs | front moves | backend µs | wrk µs | all µs |" + extra_head + " errors | timeouts | valid |")
print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|---:|" if wakes else "") + "---:|---:|---|")
for (c, name), r in rows.items():
    moves = r["m"] / r["n"] if r["n"] else float("nan")
    on_path = name.split("-")[0] in ("co", "nxco", "nxkco") or name.startswith("nx-direct")
    co_us = f"{us(r, 'co'):.1f}" if on_path else "-"
    print(f"| {name} | {c} | {r['n'] / (r['runs'] * secs):.0f} | {' '.join(r['p50'])} | {' '.join(r['p99'])} | "
          f"{us(r, 'f'):.1f} | {co_us} | {moves:.2f} | {us(r, 'b'):.1f} | {us(r, 'w'):.1f} | "
          f"{us(r, 'f') + us(r, 'b') + us(r, 'w'):.1f} |{wake_cells(r) if wakes else ''} {r['e']} | {r['t']} | "
          f"{'ok' if valid((c, name)) else '**invalid**'} |")
print()
print("The targets (issue 19: the hop and corral's own rows; issue 23: the direct pool), as ratios of this run (req/s unless it says CPU); — where a row is invalid:")
print()
def rps(k):
    r = rows[k]
    return r["n"] / (r["runs"] * secs)
def cpu(k):
    return us(rows[k], "f")
def why(k):
    if k not in rows:
        return None
    if valid(k):
        return ""
    r = rows[k]
    return f"{k[1]} invalid: {r['e']} errors, {r['t']} timeouts"
def ratio(c, a, b, goal):
    ka, kb = (c, a), (c, b)
    if ka not in rows or kb not in rows:
        return
    bad = "; ".join(w for w in (why(ka), why(kb)) if w)
    if bad:
        print(f"- c={c}: {a} / {b} = — ({bad})")
        return
    r = rps(ka) / rps(kb)
    print(f"- c={c}: {a} / {b} = **{r:.2f}** (target ≥ {goal:.2f}: {'met' if r >= goal else 'missed'})")
for c in sorted({c for c, _ in rows}):
    ratio(c, "nxco-cgi", "nx-fpm", 0.8)
    ratio(c, "nx-direct", "nx-fpm", 0.98)
    ratio(c, "nx-direct-info", "nx-fpm-info", 0.98)
    ratio(c, "co-cgi", "nx-fpm", 1.1)
    ratio(c, "co-lsphp-opc", "nx-fpm", 1.3)
    ratio(c, "co-null", "nxk-null", 1.0)
    ratio(c, "co-null", "hap-null", 1.0)
    ratio(c, "co-null-b", "nxk-null", 1.0)
    ratio(c, "co-null-b", "hap-null", 1.0)
    ratio(c, "co-lsphp-opc-b", "nx-fpm", 1.3)
    ratio(c, "co-cgi-b", "nx-fpm", 1.1)
    ratio(c, "nxco-cgi-b", "nx-fpm", 0.8)
    peers = [(cpu((c, x)), x) for x in ("nx-null", "nxk-null", "hap-null") if valid((c, x))]
    if (c, "co-null") in rows and peers:
        best = min(peers)
        if valid((c, "co-null")):
            r = cpu((c, "co-null")) / best[0]
            print(f"- c={c}: CPU µs/request of corral (co-null) / the cheapest valid row of nginx and HAProxy "
                  f"({best[1]}) = **{r:.2f}** (target ≤ 1.0: {'met' if r <= 1.0 else 'missed'}; stretch 0.8)")
        else:
            print(f"- c={c}: CPU µs/request of corral (co-null) / the cheapest of nginx and HAProxy = — ({why((c, 'co-null'))})")
PY
}
report > "$s/report.md"
cat "$s/report.md"
results_write hop "One hop through corral, under wrk -t1, CPU per request of every process" "$s/report.md"
