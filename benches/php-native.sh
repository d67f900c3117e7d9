#!/usr/bin/env bash
# Question: does corral's native PHP worker (workers/php) beat php-cgi behind corral and
# php-fpm behind nginx on the same scripts, and how much does worker mode gain on an app
# whose boot is expensive? Same number of PHP processes everywhere (2), one run, interleaved.
#
#   fpm      nginx (1 worker) -> php-fpm (pm static, 2 children)       hello, phpinfo, app
#   cgi      corral -> 2 php-cgi (spawned pool)                          hello, phpinfo
#   native   corral -> 2 corral-php-worker, classic mode                 hello, phpinfo
#   worker   corral -> 2 corral-php-worker, worker mode (app booted once) app
#
# "app" loads 300 classes from files and builds a container of them on every request under
# php-fpm (OPcache on), and once per worker in worker mode. wrk -t1 -c$CONC -d$SECS, rounds
# interleaved so that the machine's drift hits every setup alike; the median req/s of each
# and the ratios go to benches/RESULTS.md (section php-native), with the summed PSS of 8
# worker-mode workers beside php-fpm's 8 children (after warm-up, smaps_rollup); the
# workers are forked from one fork template (preload, the default), as php-fpm's children
# are from its master, and each parent is reported on a line of its own. A last table gives
# each setup's CPU time per request, split into the front end (nginx or corral), the PHP
# processes and wrk: on this shared machine it moves less than req/s does (but it moves:
# the other load shares the caches and cores).
# Needs: nginx, php-fpm8.2, php-cgi, wrk, libphp8.2-embed (scripts/setup-peers.sh) and
# release builds of corral and corral-php-worker (CORRAL, WORKER). SERVER: lines added to the
# [server] table of the corral serving the cgi, native and worker rows (e.g. "threads = 2").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="CONC SECS ROUNDS SERVER"
results_start "$@"
CONC=${CONC:-25}
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
CORRAL=${CORRAL:-target/release/corral}
WORKER=${WORKER:-$(dirname "$CORRAL")/corral-php-worker}
[ -x "$CORRAL" ] && [ -x "$WORKER" ] || cargo build --release --quiet -p corral -p corral-php-worker
# corral takes worker_path absolute (or a bare name looked up in PATH).
WORKER=$(realpath "$WORKER")
scratch=$(mktemp -d /tmp/corral-bench.XXXXXX)
chmod 755 "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "$1" >&2; tail -n 20 "$scratch"/log/* >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 400); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.05; done; fail "no answer from $1"; }

mkdir -p "$scratch/www" "$scratch/lib" "$scratch/run" "$scratch/log" "$scratch/nginx-tmp"
echo '<?php echo "Hello, world\n";' > "$scratch/www/hello.php"
echo '<?php phpinfo();' > "$scratch/www/phpinfo.php"
for i in $(seq 0 299); do
  echo "<?php final class Service$i { public function id(): int { return $i; } }" > "$scratch/lib/Service$i.php"
done
# The app: boot (300 classes, a container), then the page. Classic: every request boots.
cat > "$scratch/lib/boot.php" <<'PHP'
<?php
for ($i = 0; $i < 300; $i++) { require_once __DIR__ . "/Service$i.php"; }
final class Container {
    private array $s = [];
    public function __construct() { for ($i = 0; $i < 300; $i++) { $c = "Service$i"; $this->s[] = new $c(); } }
    public function sum(): int { $t = 0; foreach ($this->s as $o) { $t += $o->id(); } return $t; }
}
function page(Container $c): void { echo 'sum ', $c->sum(), "\n"; }
PHP
cat > "$scratch/www/app.php" <<'PHP'
<?php require __DIR__ . '/../lib/boot.php'; page(new Container());
PHP
cat > "$scratch/www/worker.php" <<'PHP'
<?php require __DIR__ . '/../lib/boot.php'; $c = new Container();
while (corral_handle_request(static function () use ($c) { page($c); })) {}
PHP
chown -R www-data:www-data "$scratch/run" "$scratch/www" "$scratch/lib"

# fpm: php-fpm + nginx
cat > "$scratch/fpm.conf" <<CONF
[global]
pid = $scratch/run/fpm.pid
error_log = $scratch/log/fpm.log
daemonize = no
[www]
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
fpm_master=$!
port_fpm=$(free_port)
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
  server { listen 127.0.0.1:$port_fpm;
    location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$scratch/run/fpm.sock; } }
}
CONF
nginx -c "$scratch/nginx.conf" & pids+=($!)
nginx_master=$!

# corral with three pools on three listeners: php-cgi, native classic, native worker mode.
port_cgi=$(free_port); port_native=$(free_port); port_worker=$(free_port)
cat > "$scratch/corral.toml" <<CONF
[server]
${SERVER:-}
log_level = "warn"
runtime_dir = "$scratch/corral-run"
user = "www-data"
group = "www-data"
[[listen]]
address = "127.0.0.1:$port_cgi"
protocol = "http"
[[listen]]
address = "127.0.0.1:$port_native"
protocol = "http"
[[listen]]
address = "127.0.0.1:$port_worker"
protocol = "http"
[pools.cgi]
command = ["php-cgi"]
mode = "static"
max = 2
[pools.native]
worker = "native"
worker_path = "$WORKER"
mode = "static"
max = 2
[pools.worker]
worker = "native"
worker_path = "$WORKER"
worker_script = "$scratch/www/worker.php"
mode = "static"
max = 2
[[contexts]]
listen = "127.0.0.1:$port_cgi"
pool = "cgi"
root = "$scratch/www"
[[contexts]]
listen = "127.0.0.1:$port_native"
pool = "native"
root = "$scratch/www"
[[contexts]]
listen = "127.0.0.1:$port_worker"
pool = "worker"
root = "$scratch/www"
CONF
"$CORRAL" run -c "$scratch/corral.toml" >"$scratch/log/corral.log" 2>&1 & pids+=($!)
corral_pid=$!

declare -A url
url[fpm-hello]="http://127.0.0.1:$port_fpm/hello.php"
url[cgi-hello]="http://127.0.0.1:$port_cgi/hello.php"
url[native-hello]="http://127.0.0.1:$port_native/hello.php"
url[fpm-phpinfo]="http://127.0.0.1:$port_fpm/phpinfo.php"
url[cgi-phpinfo]="http://127.0.0.1:$port_cgi/phpinfo.php"
url[native-phpinfo]="http://127.0.0.1:$port_native/phpinfo.php"
url[fpm-app]="http://127.0.0.1:$port_fpm/app.php"
url[worker-app]="http://127.0.0.1:$port_worker/app.php"
cases=(fpm-hello cgi-hello native-hello fpm-phpinfo cgi-phpinfo native-phpinfo fpm-app worker-app)
for c in "${cases[@]}"; do wait_http "${url[$c]}"; done
[ "$(curl -sS "${url[fpm-app]}")" = "sum 44850" ] || { echo "bad app answer (fpm)" >&2; exit 1; }
[ "$(curl -sS "${url[worker-app]}")" = "sum 44850" ] || { echo "bad app answer (worker)" >&2; exit 1; }
for c in "${cases[@]}"; do wrk -t1 -c"$CONC" -d2s "${url[$c]}" >/dev/null; done   # warm-up

# CPU time per request of each part of a setup: the front end wrk talks to (nginx, or corral:
# one corral serves every corral setup, and only one setup has traffic at a time), the PHP
# processes behind it, and wrk itself; utime + stime from /proc/PID/stat (wrk's from bash's
# time) over each run, divided by the requests wrk counted. On this shared machine the CPU a
# request costs moves less than req/s does (other work takes turns on the same cores).
hz=$(getconf CLK_TCK)
tree() { local p; for p in "$@"; do echo "$p"; tree $(pgrep -P "$p" || true); done; }
front_pids() { case $1 in fpm-*) tree "$nginx_master" ;; *) echo "$corral_pid" ;; esac; }
php_pids() { # SETUP -> its PHP processes (a fork template included: it idles)
  local p cmd
  case $1 in fpm-*) tree "$fpm_master"; return ;; esac
  for p in $(tree "$corral_pid"); do
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
    case $1:$cmd in
      cgi-*:*php-cgi*) echo "$p" ;;
      worker-*:*corral-php-worker*--worker*) echo "$p" ;;
      native-*:*corral-php-worker*) [[ $cmd == *--worker* ]] || echo "$p" ;;
    esac
  done
}
ticks() { # PIDS -> their utime + stime, in clock ticks (a process gone counts 0)
  local p line f t=0
  for p in "$@"; do
    read -r line 2>/dev/null <"/proc/$p/stat" || continue
    read -ra f <<<"${line##*) }"   # the fields after the command name, from state on
    t=$((t + f[11] + f[12]))
  done
  echo "$t"
}
us_per_request() { awk -v t="$1" -v n="$2" -v hz="$hz" 'BEGIN {printf "%.1f", t / hz / n * 1e6}'; }
declare -A cpu_front cpu_php cpu_wrk cpu_all

declare -A all
body=$(mktemp)
{
  echo "wrk -t1 -c$CONC -d${SECS}s per run, $ROUNDS rounds interleaved; 2 PHP processes in every setup."
  echo
  echo '```'
} >"$body"
for r in $(seq "$ROUNDS"); do
  for c in "${cases[@]}"; do
    mapfile -t front < <(front_pids "$c"); mapfile -t php < <(php_pids "$c")
    f0=$(ticks "${front[@]}"); p0=$(ticks "${php[@]}")
    { TIMEFORMAT='%U %S'; time wrk -t1 -c"$CONC" -d"${SECS}s" "${url[$c]}" >"$scratch/wrk.out"; } 2>"$scratch/wrk.time"
    f1=$(ticks "${front[@]}"); p1=$(ticks "${php[@]}")
    out=$(cat "$scratch/wrk.out")
    n=$(awk '/ requests in / {print $1}' <<<"$out")
    cpu_front[$c]+="$(us_per_request $((f1 - f0)) "$n") "
    cpu_php[$c]+="$(us_per_request $((p1 - p0)) "$n") "
    w=$(awk -v n="$n" '{printf "%.1f", ($1 + $2) / n * 1e6}' "$scratch/wrk.time")
    cpu_wrk[$c]+="$w "
    cpu_all[$c]+="$(awk -v f=$((f1 - f0)) -v p=$((p1 - p0)) -v w="$w" -v n="$n" -v hz="$hz" \
      'BEGIN {printf "%.1f", (f + p) / hz / n * 1e6 + w}') "
    read -r errors timeouts < <(wrk_errors <<<"$out")
    [ "$errors" = 0 ] && [ "$timeouts" = 0 ] || { echo "$c: $errors errors, $timeouts timeouts" >&2; echo "$out" >&2; exit 1; }
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    all[$c]+="$rps "
    printf 'round %s  %-15s %10s req/s\n' "$r" "$c" "$rps" | tee -a "$body"
  done
done
median() { printf '%s\n' $1 | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
declare -A med
for c in "${cases[@]}"; do med[$c]=$(median "${all[$c]}"); done
ratio() { awk -v a="${med[$1]}" -v b="${med[$2]}" 'BEGIN {printf "%.2f", a/b}'; }
{
  echo '```'
  echo
  echo "| page | nginx → php-fpm | corral → php-cgi | corral → native | native / php-cgi | native / php-fpm |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for p in hello phpinfo; do
    echo "| $p | ${med[fpm-$p]} | ${med[cgi-$p]} | ${med[native-$p]} | $(ratio native-$p cgi-$p)× | $(ratio native-$p fpm-$p)× |"
  done
  echo
  echo "| app (300 classes, a container) | nginx → php-fpm (boots per request) | corral → native worker mode (boots once) | worker / php-fpm |"
  echo "| --- | ---: | ---: | ---: |"
  echo "| app | ${med[fpm-app]} | ${med[worker-app]} | $(ratio worker-app fpm-app)× |"
  echo
  echo "CPU time per request, µs (medians over the rounds; each column its own median): the front end"
  echo "(nginx's processes, or corral's), the PHP processes, wrk; utime + stime from /proc/PID/stat."
  echo
  echo "| setup | front end | PHP processes | wrk | all three |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  for c in "${cases[@]}"; do
    echo "| $c | $(median "${cpu_front[$c]}") | $(median "${cpu_php[$c]}") | $(median "${cpu_wrk[$c]}") | $(median "${cpu_all[$c]}") |"
  done
} >>"$body"

# Memory: 8 worker-mode workers (the app booted in each) beside php-fpm's 8 children running
# the app classically, each warmed by the same load, then the summed PSS (smaps_rollup) of
# the 8 processes: the workers (corral itself not counted), php-fpm's children (its master
# apart, as its own line).
mkdir -p "$scratch/mem-run"
cp "$scratch/www/worker.php" "$scratch/www/worker8.php"
sed -e "s#$scratch/run/fpm#$scratch/run/fpm8#g" -e "s#$scratch/log/fpm.log#$scratch/log/fpm8.log#" \
    -e "s#pm.max_children = 2#pm.max_children = 8#" "$scratch/fpm.conf" >"$scratch/fpm8.conf"
php-fpm8.2 -F -y "$scratch/fpm8.conf" & pids+=($!)
port_mem=$(free_port)
cat > "$scratch/corral-mem.toml" <<CONF
[server]
log_level = "warn"
runtime_dir = "$scratch/mem-run"
user = "www-data"
group = "www-data"
[[listen]]
address = "127.0.0.1:$port_mem"
protocol = "http"
[pools.worker8]
worker = "native"
worker_path = "$WORKER"
worker_script = "$scratch/www/worker8.php"
mode = "static"
max = 8
[[contexts]]
pool = "worker8"
root = "$scratch/www"
CONF
"$CORRAL" run -c "$scratch/corral-mem.toml" >"$scratch/log/corral-mem.log" 2>&1 & pids+=($!)
wait_http "http://127.0.0.1:$port_mem/app.php"
[ "$(curl -sS "http://127.0.0.1:$port_mem/app.php")" = "sum 44850" ] || fail "bad app answer (8 workers)"
for _ in $(seq 400); do [ -S "$scratch/run/fpm8.sock" ] && break; sleep 0.05; done
wrk -t1 -c16 -d3s "http://127.0.0.1:$port_mem/app.php" >/dev/null
warm=$("$CORRAL" bench --protocol fastcgi --target "unix:$scratch/run/fpm8.sock" --concurrency 16 \
    --duration 3s --warmup 0s --path /app.php --script-filename "$scratch/www/app.php")
# The target's row: requests (3rd field) and errors (10th).
awk '$1 ~ /^unix:/ { exit !($3 > 0 && $10 == 0) }' <<<"$warm" || fail "php-fpm warm-up failed: $warm"
pss_mib() { local s=0 p k; for p in "$@"; do
    k=$(awk '/^Pss:/ {print $2}' /proc/"$p"/smaps_rollup 2>/dev/null || echo 0); s=$((s + ${k:-0})); done
    awk -v k="$s" 'BEGIN {printf "%.1f", k / 1024}'; }
# The pool preloads (the default for worker = "native"): one fork template, corral's child,
# and the 8 workers it forked, its children.
template8=$(pgrep -P "$(pgrep -f -- "run -c $scratch/corral-mem.toml" | head -n 1)" -f -- "--worker $scratch/www/worker8.php" | head -n 1 || true)
mapfile -t workers8 < <(pgrep -P "${template8:-0}")
fpm8_master=$(pgrep -f "php-fpm: master process \\($scratch/fpm8.conf\\)" || true)
mapfile -t fpm8_children < <(pgrep -P "${fpm8_master:-0}")
[ "${#workers8[@]}" = 8 ] && [ "${#fpm8_children[@]}" = 8 ] ||
    fail "memory: ${#workers8[@]} workers and ${#fpm8_children[@]} php-fpm children, not 8 and 8"
{
  echo
  echo "Memory after 3 s of wrk -c16 on the app each: summed PSS (smaps_rollup) of 8 processes."
  echo
  echo "| 8 processes running the app | summed PSS MiB | per process MiB |"
  echo "| --- | ---: | ---: |"
  w=$(pss_mib "${workers8[@]}"); f=$(pss_mib "${fpm8_children[@]}")
  echo "| corral-php-worker, worker mode (app booted once each), forked from one template | $w | $(awk -v a="$w" 'BEGIN {printf "%.1f", a / 8}') |"
  echo "| php-fpm children, pm static (app booted per request) | $f | $(awk -v a="$f" 'BEGIN {printf "%.1f", a / 8}') |"
  echo "| corral-php-worker fork template (not in the sum above) | $(pss_mib "$template8") | |"
  echo "| php-fpm master (not in the sum above) | $(pss_mib "$fpm8_master") | |"
} >>"$body"
cat "$body"
RESULTS_BINARY=$CORRAL results_write php-native "Native PHP worker: classic and worker mode against php-cgi and php-fpm (req/s, medians)" "$body"
rm -f "$body"
