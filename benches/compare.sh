#!/usr/bin/env bash
# Question: on this machine, in one run, what does corral cost and win against nginx and the
# PHP peers? Writes the `compare` section of benches/RESULTS.md (OUT; OUT= prints only;
# benches/lib/results.sh) and benches/results/*.json|svg|txt (charts, every run).
#
#   (a) each null backend (`corral null-backend`, fastcgi/scgi/lsapi) measured directly and
#       through corral (http listener; fastcgi/scgi listener too), plus nginx (1 worker,
#       fastcgi_keep_conn + upstream keepalive) -> the same null FastCGI backend;
#   (b) hello-world and phpinfo(), 2 PHP processes everywhere:
#       A nginx -> php-fpm (static 2)            B corral(http) -> php-cgi (static 2)
#       C nginx -> corral(fastcgi) -> php-cgi    D corral(http) -> lsphp (static 2)
#   (c) summed PSS of each (b) pool (and the front's RSS) under load and 5 s after it;
#   (d) corral's RSS before and with 1,000 idle client connections.
#
# Every load is `corral bench` (one generator thread, like `wrk -t1`), targets interleaved
# per concurrency level (A B C D, A B C D, ...), rounds pooled. Loopback and unix sockets
# in a scratch folder only; every process it starts it stops (trap). About 12 minutes on
# 2 cores with the defaults. Needs: nginx, php-fpm8.2, php-cgi, lsphp, python3, curl, root
# (nginx and the PHP workers run as www-data). A row with errors (connect, protocol, status,
# timeout, as `corral bench` counts them) is marked invalid and no ratio is computed from it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="NULL_DUR PHP_DUR WARM ROUNDS LEVELS CORRAL LSPHP LSPHP_OPCACHE LOAD_WAIT RES"
results_start "$@"
# Without CORRAL set, (re)build the release binary first so that it matches the commit reported.
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
LSPHP=${LSPHP:-/var/cache/corral/lsphp-8.2/lsphp}
LSPHP_OPCACHE=${LSPHP_OPCACHE:-$(dirname "$LSPHP")/opcache.so}
[ -f "$LSPHP_OPCACHE" ] || { echo "no $LSPHP_OPCACHE: run scripts/build-lsphp.sh" >&2; exit 1; }
# lsphp takes no -d options in LSAPI mode; its php.ini (written into the scratch dir below)
# loads and enables OPcache.
NULL_DUR=${NULL_DUR:-3s}   # per run, null backends (a)
PHP_DUR=${PHP_DUR:-4s}     # per run, PHP (b)
WARM=${WARM:-1s}           # unrecorded warm-up before every run
ROUNDS=${ROUNDS:-2}
LEVELS=${LEVELS:-1,25,100}
RES=${RES:-benches/results}
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src protocols Cargo.toml Cargo.lock 2>/dev/null || echo ' + uncommitted changes')
binary="$CORRAL, built $(date -u -r "$CORRAL" '+%Y-%m-%d %H:%M UTC')"

scratch=$(mktemp -d /tmp/corral-compare.XXXXXX)
chmod 755 "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
ulimit -n 16384 2>/dev/null || true
mkdir -p "$scratch/www" "$scratch/run" "$scratch/log" "$scratch/data" "$RES"
printf 'zend_extension=%s\nopcache.enable=1\n' "$LSPHP_OPCACHE" > "$scratch/lsphp.ini"
chmod 755 "$scratch/www" "$scratch/run"
echo '<?php echo "Hello World";' > "$scratch/www/hello.php"
echo '<?php phpinfo();' > "$scratch/www/info.php"
chmod 644 "$scratch/www/"*.php
data=$scratch/data   # what the report is built from

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }
wait_http() { # $1 url, $2 expected body start
  local body=""
  for _ in $(seq 200); do
    body=$(curl -s "$1" 2>/dev/null || true)
    [ "${body:0:${#2}}" = "$2" ] && return 0
    sleep 0.05
  done
  echo "bad answer from $1: ${body:0:200}" >&2; exit 1
}
load1() { cut -d' ' -f1 /proc/loadavg; }
name_pid() { printf '%s\t%s\n' "$1" "$2" >> "$data/pids.tsv"; }
label() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$data/labels.tsv"; } # bench, address, label
# Runs `corral bench` with its JSON and SVG in $RES; logs the command (scratch path hidden).
bench() { # $1 = name, rest = bench arguments
  local name=$1; shift
  echo "corral bench $* --json $RES/$name.json --svg $RES/$name.svg" | sed "s#$scratch#\$SCRATCH#g" >> "$data/commands.txt"
  echo "== $name" >&2
  "$CORRAL" bench "$@" --json "$RES/$name.json" --svg "$RES/$name.svg" > "$RES/$name.txt"
  grep '^ratio' "$RES/$name.txt" >&2 || true
}
descendants() { # all live descendants of $1
  local parent=$1 s line rest state ppid p k kids=()
  for s in /proc/[0-9]*/stat; do
    { read -r line < "$s"; } 2>/dev/null || continue
    rest=${line##*) }
    read -r state ppid _ <<< "$rest"
    if [ "$ppid" = "$parent" ] && [ "$state" != Z ]; then p=${s#/proc/}; kids+=("${p%/stat}"); fi
  done
  for k in "${kids[@]}"; do echo "$k"; descendants "$k"; done
  return 0
}
pss_mib() { # summed PSS (MiB) of the given pids
  local total=0 v
  for p in "$@"; do
    v=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)
    total=$((total + ${v:-0}))
  done
  awk -v t="$total" 'BEGIN {printf "%.1f", t/1024}'
}
first_child() { local d; d=$(descendants "$1"); echo "${d%%$'\n'*}"; }
rss_mib() { awk '/^VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }

# Wait (up to 3 minutes) for other jobs on the machine to settle.
load_start=$(cat /proc/loadavg)
for _ in $(seq "${LOAD_WAIT:-36}"); do awk -v l="$(load1)" 'BEGIN {exit !(l < 1.0)}' && break; sleep 5; done
load_begin=$(cat /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
t0=$SECONDS

# ---- null backends (one per protocol) ----
for p in fastcgi scgi lsapi http; do
  "$CORRAL" null-backend --protocol "$p" --listen "unix:$scratch/run/null-$p.sock" & pids+=($!)
  name_pid "null-backend $p" "$!"; eval "null_$p=$!"
done
for p in fastcgi scgi lsapi http; do wait_sock "$scratch/run/null-$p.sock"; chmod 666 "$scratch/run/null-$p.sock"; done

# ---- corral in front of each null backend: http listener (+ its own fastcgi/scgi listener) ----
start_corral() { # $1 = name, $2 = config text; sets $cpid
  printf '%s\n' "$2" > "$scratch/$1.toml"
  "$CORRAL" run -c "$scratch/$1.toml" > "$scratch/log/$1.out" 2>&1 & cpid=$!; pids+=($cpid)
  name_pid "corral ($1)" "$cpid"
}
for p in fastcgi scgi lsapi; do
  port=$(free_port); eval "port_null_$p=$port"
  extra=""
  if [ "$p" != lsapi ]; then extra="[[listen]]
address = \"unix:$scratch/run/corral-$p.sock\"
protocol = \"$p\"
mode = \"0666\""; fi
  start_corral "null-$p" "[server]
runtime_dir = \"$scratch/run/null-$p.d\"
log_level = \"warn\"
[[listen]]
address = \"127.0.0.1:$port\"
protocol = \"http\"
$extra
[pools.null]
protocol = \"$p\"
servers = [\"unix:$scratch/run/null-$p.sock\"]
concurrency = 128
[[contexts]]
pool = \"null\"
root = \"$scratch/www\""
  eval "corral_null_$p=$cpid"
done

# ---- PHP pools ----
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
php-fpm8.2 -F -y "$scratch/fpm.conf" & fpm=$!; pids+=($fpm); name_pid "php-fpm master" "$fpm"

port_b=$(free_port); port_d=$(free_port); port_c_direct=$(free_port)
php_server="runtime_dir = \"RUNDIR\"
user = \"www-data\"
group = \"www-data\"
log_level = \"warn\""
start_corral "php-cgi-http" "[server]
${php_server/RUNDIR/$scratch/run/b.d}
[[listen]]
address = \"127.0.0.1:$port_b\"
protocol = \"http\"
[pools.php]
command = [\"php-cgi\"]
mode = \"static\"
min = 2
max = 2
[[contexts]]
pool = \"php\"
root = \"$scratch/www\""
corral_b=$cpid
start_corral "php-cgi-fcgi" "[server]
${php_server/RUNDIR/$scratch/run/c.d}
[[listen]]
address = \"unix:$scratch/run/corral-php.sock\"
protocol = \"fastcgi\"
mode = \"0666\"
[[listen]]
address = \"127.0.0.1:$port_c_direct\"
protocol = \"http\"
[pools.php]
command = [\"php-cgi\"]
mode = \"static\"
min = 2
max = 2
[[contexts]]
pool = \"php\"
root = \"$scratch/www\""
corral_c=$cpid
start_corral "lsphp-http" "[server]
${php_server/RUNDIR/$scratch/run/d.d}
[[listen]]
address = \"127.0.0.1:$port_d\"
protocol = \"http\"
[pools.php]
protocol = \"lsapi\"
command = [\"$LSPHP\", \"-c\", \"$scratch/lsphp.ini\"]
mode = \"static\"
min = 2
max = 2
[[contexts]]
pool = \"php\"
root = \"$scratch/www\""
corral_d=$cpid

# ---- nginx: -> null FastCGI (keepalive), -> php-fpm (BASELINE A), -> corral's fastcgi listener ----
wait_sock "$scratch/run/fpm.sock"; wait_sock "$scratch/run/corral-php.sock"
port_nx_null=$(free_port); port_a=$(free_port); port_c=$(free_port)
cat > "$scratch/nginx.conf" <<CONF
user www-data;
worker_processes 1;
daemon off;
pid $scratch/run/nginx.pid;
error_log $scratch/log/nginx.log;
events { worker_connections 4096; }
http {
  include /etc/nginx/mime.types;
  default_type application/octet-stream;
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 65;
  client_body_temp_path $scratch/nginx-tmp; fastcgi_temp_path $scratch/nginx-tmp;
  proxy_temp_path $scratch/nginx-tmp; scgi_temp_path $scratch/nginx-tmp; uwsgi_temp_path $scratch/nginx-tmp;
  root $scratch/www;
  upstream nullka { server unix:$scratch/run/null-fastcgi.sock; keepalive 16; }
  server { listen 127.0.0.1:$port_nx_null;
    location / { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass nullka; } }
  server { listen 127.0.0.1:$port_a;
    location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_pass unix:$scratch/run/fpm.sock; } }
  upstream corralka { server unix:$scratch/run/corral-php.sock; keepalive 16; }
  server { listen 127.0.0.1:$port_c;
    location ~ \.php\$ { include /etc/nginx/fastcgi.conf; fastcgi_keep_conn on; fastcgi_pass corralka; } }
}
CONF
nginx -e "$scratch/log/nginx.log" -c "$scratch/nginx.conf" & nginx=$!; pids+=($nginx)
name_pid "nginx master" "$nginx"

for p in fastcgi scgi lsapi; do eval "wait_http http://127.0.0.1:\$port_null_$p/hello.php 'Hello, world'"; done
wait_http "http://127.0.0.1:$port_nx_null/hello.php" 'Hello, world'
for port in $port_a $port_b $port_c $port_d; do
  wait_http "http://127.0.0.1:$port/hello.php" 'Hello World'
  wait_http "http://127.0.0.1:$port/info.php" '<!DOCTYPE html'
done
nginx_worker=$(first_child "$nginx"); name_pid "nginx worker" "$nginx_worker"

# ---- (a) null backends ----
common=(--concurrency "$LEVELS" --rounds "$ROUNDS" --warmup "$WARM")
label null-fastcgi "unix:$scratch/run/null-fastcgi.sock" "null FastCGI, direct"
label null-fastcgi "unix:$scratch/run/corral-fastcgi.sock" "corral fastcgi listener → null"
# corral's fastcgi/scgi listeners check SCRIPT_FILENAME against the context's root (403 otherwise)
bench null-fastcgi --protocol fastcgi --target "unix:$scratch/run/null-fastcgi.sock" \
  --compare "unix:$scratch/run/corral-fastcgi.sock" "${common[@]}" --duration "$NULL_DUR" \
  --script-filename "$scratch/www/hello.php" \
  --pid "$null_fastcgi" --pid "$corral_null_fastcgi"
label null-fastcgi-http "127.0.0.1:$port_nx_null" "nginx → null FastCGI"
label null-fastcgi-http "127.0.0.1:$port_null_fastcgi" "corral http → null FastCGI"
bench null-fastcgi-http --protocol http --target "127.0.0.1:$port_nx_null" \
  --compare "127.0.0.1:$port_null_fastcgi" "${common[@]}" --duration "$NULL_DUR" \
  --pid "$nginx_worker" --pid "$corral_null_fastcgi" --pid "$null_fastcgi"
label null-scgi "unix:$scratch/run/null-scgi.sock" "null SCGI, direct"
label null-scgi "unix:$scratch/run/corral-scgi.sock" "corral scgi listener → null"
bench null-scgi --protocol scgi --target "unix:$scratch/run/null-scgi.sock" \
  --compare "unix:$scratch/run/corral-scgi.sock" "${common[@]}" --duration "$NULL_DUR" \
  --script-filename "$scratch/www/hello.php" \
  --pid "$null_scgi" --pid "$corral_null_scgi"
label null-http "unix:$scratch/run/null-http.sock" "null HTTP, direct"
label null-http "127.0.0.1:$port_null_scgi" "corral http → null SCGI"
label null-http "127.0.0.1:$port_null_lsapi" "corral http → null LSAPI"
bench null-http --protocol http --target "unix:$scratch/run/null-http.sock" \
  --compare "127.0.0.1:$port_null_scgi" "127.0.0.1:$port_null_lsapi" "${common[@]}" --duration "$NULL_DUR" \
  --pid "$null_http" --pid "$corral_null_scgi" --pid "$corral_null_lsapi" --pid "$null_scgi" --pid "$null_lsapi"
label null-lsapi "unix:$scratch/run/null-lsapi.sock" "null LSAPI, direct"
bench null-lsapi --protocol lsapi --target "unix:$scratch/run/null-lsapi.sock" \
  "${common[@]}" --duration "$NULL_DUR" --pid "$null_lsapi"

# ---- (b) PHP, A B C D interleaved ----
for script in hello info; do
  label "php-$script" "127.0.0.1:$port_a" "A nginx → php-fpm"
  label "php-$script" "127.0.0.1:$port_b" "B corral http → php-cgi"
  label "php-$script" "127.0.0.1:$port_c" "C nginx → corral fastcgi → php-cgi"
  label "php-$script" "127.0.0.1:$port_d" "D corral http → lsphp"
  bench "php-$script" --protocol http --path "/$script.php" --target "127.0.0.1:$port_a" \
    --compare "127.0.0.1:$port_b" "127.0.0.1:$port_c" "127.0.0.1:$port_d" \
    "${common[@]}" --duration "$PHP_DUR" \
    --pid "$nginx_worker" --pid "$corral_b" --pid "$corral_c" --pid "$corral_d"
done

# ---- (c) memory of each pool: under load (c=25, 3 s in) and 5 s after it stops ----
printf 'config\tscript\tpool procs\tpool PSS MiB, idle\tpool PSS, load\tpool PSS, 5 s after\tfront RSS MiB, load\tfront RSS, 5 s after\n' > "$data/memory.tsv"
mem_row() { # $1 label, $2 port, $3 pool root pid, $4 1 if the root itself is in the pool, $5 front pid
  local script w n idle load after rl ra
  for script in hello info; do
    w=$(descendants "$3"); [ "$4" = 1 ] && w="$3 $w"
    n=$(echo $w | wc -w); idle=$(pss_mib $w)
    "$CORRAL" bench --protocol http --target "127.0.0.1:$2" --path "/$script.php" \
      --concurrency 25 --duration 5s --warmup 0s > /dev/null & local lp=$!; pids+=($lp)
    sleep 3
    w=$(descendants "$3"); [ "$4" = 1 ] && w="$3 $w"
    load=$(pss_mib $w); rl=$(rss_mib "$5")
    wait "$lp"; sleep 5
    w=$(descendants "$3"); [ "$4" = 1 ] && w="$3 $w"
    after=$(pss_mib $w); ra=$(rss_mib "$5")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$script" "$n" "$idle" "$load" "$after" "$rl" "$ra" >> "$data/memory.tsv"
  done
}
echo "== memory" >&2
mem_row "A nginx → php-fpm (nginx worker RSS)" "$port_a" "$fpm" 1 "$nginx_worker"
mem_row "B corral http → php-cgi (corral RSS)" "$port_b" "$corral_b" 0 "$corral_b"
mem_row "C nginx → corral fastcgi → php-cgi (corral RSS)" "$port_c" "$corral_c" 0 "$corral_c"
mem_row "D corral http → lsphp (corral RSS)" "$port_d" "$corral_d" 0 "$corral_d"

# ---- (d) corral's RSS with 1,000 idle front connections (a fresh instance, null FastCGI pool) ----
echo "== idle connections" >&2
port_idle=$(free_port)
# All 1,000 come from 127.0.0.1: without lifting the per-client cap (128 by default) corral
# would hold 128 of them and the table would measure the cap.
start_corral idle "[server]
runtime_dir = \"$scratch/run/idle.d\"
log_level = \"warn\"
[[listen]]
address = \"127.0.0.1:$port_idle\"
protocol = \"http\"
max_connections_per_client = 0
[pools.null]
servers = [\"unix:$scratch/run/null-fastcgi.sock\"]
concurrency = 128
[[contexts]]
pool = \"null\"
root = \"$scratch/www\""
corral_idle=$cpid
wait_http "http://127.0.0.1:$port_idle/hello.php" 'Hello, world'
sleep 1
rss_before=$(rss_mib "$corral_idle"); fds_before=$(ls "/proc/$corral_idle/fd" | wc -l)
cat > "$scratch/idle.py" <<'PY'
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
port, n, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
open(ready, "w").write(str(len(conns)))
while True:
    time.sleep(1)
PY
python3 "$scratch/idle.py" "$port_idle" 1000 "$scratch/idle.ready" & idle_py=$!; pids+=($idle_py)
for _ in $(seq 200); do [ -s "$scratch/idle.ready" ] && break; sleep 0.05; done
sleep 2
rss_idle=$(rss_mib "$corral_idle"); fds_idle=$(ls "/proc/$corral_idle/fd" | wc -l)
sleep 5
rss_idle7=$(rss_mib "$corral_idle"); fds_idle7=$(ls "/proc/$corral_idle/fd" | wc -l)
kill "$idle_py"; wait "$idle_py" 2>/dev/null || true
sleep 2
rss_closed=$(rss_mib "$corral_idle"); fds_closed=$(ls "/proc/$corral_idle/fd" | wc -l)
printf 'when\tcorral RSS MiB\tcorral open fds\n1 request served, no client connected\t%s\t%s\n1,000 idle connections open, 2 s\t%s\t%s\n1,000 idle connections open, 7 s\t%s\t%s\n2 s after they closed\t%s\t%s\n' \
  "$rss_before" "$fds_before" "$rss_idle" "$fds_idle" "$rss_idle7" "$fds_idle7" "$rss_closed" "$fds_closed" > "$data/idle.tsv"

elapsed=$((SECONDS - t0))
load_end=$(cat /proc/loadavg)

# The report: RESULTS.md from the JSON of every bench and the TSVs above.
write_report() { cat <<'PY'
import json, os, sys
data, res, scratch = sys.argv[1:4]
def rel(p): return p.replace(scratch, "$SCRATCH")
facts = dict(l.rstrip("\n").split("=", 1) for l in open(f"{data}/facts.txt"))
labels = {}
for l in open(f"{data}/labels.tsv"):
    b, addr, lab = l.rstrip("\n").split("\t")
    labels[(b, addr)] = lab
# The JSON and the runs name scratch addresses as $SCRATCH/...
rel_labels = {(b, rel(a)): lab for (b, a), lab in labels.items()}
names = {}
for l in open(f"{data}/pids.tsv"):
    n, pid = l.rstrip("\n").split("\t")
    names[int(pid)] = n
def load(b):
    j = json.load(open(f"{res}/{b}.json"))
    out = {}
    for t in j["targets"]:
        lab = rel_labels.get((b, rel(t["target"])), rel(t["target"]))
        out[lab] = {lv["concurrency"]: lv for lv in t["levels"]}
    return j, out
def errs(lv): return sum(lv["errors"].values())
def ok(lv): return lv is not None and errs(lv) == 0 and lv["completed"] > 0
def div(a, b, fmt="{:.2f}"):  # a / b in req/s, or — when either row is invalid
    return fmt.format(a["req_per_s"] / b["req_per_s"]) if ok(a) and ok(b) and b["req_per_s"] else "—"
def spread():  # round-to-round spread of req/s, from every run `corral bench` listed
    import re
    out = []
    for b in benches:
        runs = {}
        for l in open(f"{res}/{b}.txt"):
            m = re.match(r"(\S+) #(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s", l)
            if m:
                runs.setdefault((b, m.group(1), int(m.group(3))), []).append(int(m.group(5)))
        for k, v in runs.items():
            if len(v) > 1 and sum(v):
                out.append(((max(v) - min(v)) / (sum(v) / len(v)), k))
    return sorted(out)
benches = ("null-fastcgi", "null-fastcgi-http", "null-scgi", "null-http", "null-lsapi", "php-hello", "php-info")
def pct(p): return "–" if p.get("cpu_percent") is None else f"{p['cpu_percent']:.0f}"
def k(x): return f"{x/1000:.1f}k" if x >= 1000 else f"{x:.0f}"
P = print

P(f"Run in {int(facts['elapsed'])//60} min {int(facts['elapsed'])%60} s.")
P()
P("### Machine and method")
P()
P(f"- {facts['uname']}, {facts['nproc']} CPUs ({facts['cpu']}), {facts['mem']} at the end.")
P(f"- corral commit `{facts['commit']}` at the start of the run; binary `{rel(facts['binary'])}` (release build); {facts['nginx']}; {facts['php']} (php-fpm8.2 / php-cgi, "
  f"Debian php.ini, opcache on); {facts['lsphp']} (a php.ini of two lines, `-c`: its own opcache.so as zend_extension and opcache.enable=1; one cache per lsphp process).")
P(f"- Load average (1/5/15 min, running/total, last pid): when the script started `{facts['load_start']}`, "
  f"when measuring began (after waiting up to 3 min for the 1-minute load to drop below 1) `{facts['load_begin']}`, "
  f"at the end `{facts['load_end']}`. The load average counts the benchmark's own processes while it runs.")
P(f"- Settings: `{facts['settings']}`. Every load is `corral bench` with one generator thread (a single-threaded "
  "runtime, like `wrk -t1`), kept-alive client connections, on the same 2 CPUs as the servers. Loopback TCP to "
  "HTTP fronts, unix sockets everywhere else.")
P("- Targets of one table run **interleaved**: at each concurrency level A B C D, then A B C D again "
  f"({facts['settings'].split('ROUNDS=')[1].split()[0]} rounds), each run after an unrecorded warm-up. "
  "**Numbers are the rounds pooled** (requests of all rounds over their summed time; latency percentiles from the "
  "merged histogram), as `corral bench --compare` reports them — neither the best nor the median round. Every single "
  "run is listed in `results/NAME.txt`.")
sp = spread()
if sp:
    top, (tb, tt, tc) = sp[-1]
    P(f"- Round-to-round spread of req/s in this run ((max − min) / mean of one target's rounds at one level, "
      f"{len(sp)} of them): median {sp[len(sp) // 2][0] * 100:.0f} %, largest {top * 100:.0f} % "
      f"({rel_labels.get((tb, tt), tt)}, {tb}, c={tc}). Ratios smaller than that say little.")
P("- Latencies in µs. `ratio` = req/s of the row / req/s of the table's first row at that c. CPU = % of one core "
  "of each sampled process during the run (from /proc/PID/stat; processes below 0.5 % left out); `gen` = the load generator itself (near 100 % "
  "means the generator, not the target, was the limit).")
P("- 2 PHP processes everywhere: php-fpm `pm = static`, `pm.max_children = 2` (plus its master); corral pools "
  "`mode = \"static\"`, `min = max = 2` (corral spawns `php-cgi` or lsphp itself, workers as www-data).")
P("- The null backends are `corral null-backend` (tokio, one thread per core), answering 13 bytes "
  "(`Hello, world\\n`).")
P("- A row with errors (connect, protocol, status or timeout, as `corral bench` counts them) is **invalid**: its "
  "figures are printed, and every ratio from it is —.")
P()

def short(n):
    return (n.replace("corral (null-fastcgi)", "corral").replace("corral (null-scgi)", "corral")
             .replace("corral (null-lsapi)", "corral").replace("null-backend ", "null ")
             .replace("corral (php-cgi-http)", "corral B").replace("corral (php-cgi-fcgi)", "corral C")
             .replace("corral (lsphp-http)", "corral D"))
def full_table(b, title):
    j, t = load(b)
    P(f"#### {title}")
    P()
    P(f"`corral bench --protocol {j['protocol']}`, path `{j['path']}`. Chart: [{b}.svg](results/{b}.svg), data: [{b}.json](results/{b}.json).")
    P()
    P("| target | c | req/s | ratio | p50 | p99 | p99.9 | errors | valid | CPU % of a core |")
    P("|---|---|---|---|---|---|---|---|---|---|")
    first = next(iter(t.values()))
    for lab, lvs in t.items():
        for c, lv in sorted(lvs.items()):
            r = div(lv, first.get(c))
            cpu = " · ".join(f"{short(names.get(p['pid'], str(p['pid'])))} {pct(p)}" for p in lv.get("processes", [])
                             if p.get("cpu_percent") is None or p["cpu_percent"] >= 0.5)
            cpu += f" · gen {pct(lv['generator'])}"
            l = lv["latency_us"]
            v = "ok" if ok(lv) else "**invalid**"
            P(f"| {lab} | {c} | {lv['req_per_s']:.0f} | {r} | {l['p50']} | {l['p99']} | {l['p99_9']} | {errs(lv)} | {v} | {cpu} |")
    P()
    return t

# ---- headline tables ----
_, fd = load("null-fastcgi")
_, fh = load("null-fastcgi-http")
levels = sorted(next(iter(fd.values())).keys())
P("### Headlines")
P()
P("#### Null FastCGI backend: directly, through nginx, through corral")
P()
P("req/s (p50 µs / p99 µs), rounds pooled, *invalid* after an invalid one. The first two rows are spoken to in "
  "FastCGI, the last two in HTTP.")
def cell(lv):
    return f"{lv['req_per_s']:.0f} ({lv['latency_us']['p50']} / {lv['latency_us']['p99']})" + ("" if ok(lv) else " *invalid*")
P()
P("| path | " + " | ".join(f"c={c}" for c in levels) + " |")
P("|---|" + "---|" * len(levels))
for t in (fd, fh):
    for lab, lvs in t.items():
        P(f"| {lab} | " + " | ".join(cell(lvs[c]) for c in levels) + " |")
nx, ch = list(fh.values())
P("| **corral http / nginx**, req/s | " + " | ".join(div(ch[c], nx[c], "**{:.2f}**") for c in levels) + " |")
P()
direct, viafl = list(fd.values())
_, nh = load("null-http")
hd = next(iter(nh.values()))
if 1 in levels and all(ok(x[1]) for x in (direct, viafl, ch, nx, hd)):
    d50 = direct[1]["latency_us"]["p50"]
    P(f"Added p50 latency at c=1 over the backend directly ({d50} µs): corral's fastcgi listener "
      f"+{viafl[1]['latency_us']['p50'] - d50} µs; corral's http listener +{ch[1]['latency_us']['p50'] - d50} µs; "
      f"nginx +{nx[1]['latency_us']['p50'] - d50} µs (the http rows include the generator's HTTP work and a TCP "
      "hop instead of a unix socket, so they overstate the gateway's own share).")
    h50 = hd[1]["latency_us"]["p50"]
    P()
    P(f"Against the null HTTP backend spoken to directly in HTTP over a unix socket ({h50} µs p50 at c=1), corral's "
      f"http listener → null FastCGI adds {ch[1]['latency_us']['p50'] - h50} µs and nginx → null FastCGI adds "
      f"{nx[1]['latency_us']['p50'] - h50} µs.")
    P()
P("#### PHP, 2 processes: nginx → php-fpm against corral")
P()
P("req/s (p50 µs / p99 µs) and, in brackets, req/s relative to A (— if either is invalid), rounds pooled.")
P()
php = {}
for s in ("hello", "info"):
    _, php[s] = load(f"php-{s}")
    P(f"**{'hello world' if s == 'hello' else 'phpinfo()'}**")
    P()
    P("| config | " + " | ".join(f"c={c}" for c in levels) + " |")
    P("|---|" + "---|" * len(levels))
    a = next(iter(php[s].values()))
    for lab, lvs in php[s].items():
        P(f"| {lab} | " + " | ".join(
            f"{cell(lvs[c])} [{div(lvs[c], a[c])}]"
            for c in levels) + " |")
    P()

P("#### Memory of each PHP pool (c)")
P()
P("Summed PSS (MiB) of the pool's processes (`/proc/PID/smaps_rollup`: php-fpm's master + 2 children; corral's "
  "2 workers), idle before the load, 3 s into `corral bench -c 25` (5 s run) and 5 s after it ended; and the front's "
  "VmRSS (MiB) at the same two moments. These pools had already served the (b) runs.")
P()
rows = [l.rstrip("\n").split("\t") for l in open(f"{data}/memory.tsv")]
P("| " + " | ".join(rows[0]) + " |")
P("|---" * len(rows[0]) + "|")
for r in rows[1:]:
    P("| " + " | ".join(r) + " |")
P()
P("#### corral with 1,000 idle client connections (d)")
P()
P("A fresh corral (http listener, a null FastCGI pool), one request served, then a python3 script opens 1,000 TCP "
  "connections to the http listener and sends nothing.")
P()
rows = [l.rstrip("\n").split("\t") for l in open(f"{data}/idle.tsv")]
P("| " + " | ".join(rows[0]) + " |")
P("|---" * len(rows[0]) + "|")
for r in rows[1:]:
    P("| " + " | ".join(r) + " |")
P()

P("### All runs")
P()
full_table("null-fastcgi", "(a) null FastCGI: directly vs corral's fastcgi listener")
full_table("null-fastcgi-http", "(a) null FastCGI over HTTP: nginx vs corral's http listener")
full_table("null-scgi", "(a) null SCGI: directly vs corral's scgi listener")
full_table("null-http", "(a) corral's http listener → null SCGI and null LSAPI, next to a null HTTP backend spoken to directly")
full_table("null-lsapi", "(a) null LSAPI directly")
full_table("php-hello", "(b) hello world, A B C D")
full_table("php-info", "(b) phpinfo(), A B C D")

P("### Exact commands")
P()
P("`$SCRATCH` is the script's scratch folder. Backends and fronts:")
P()
P("```sh")
P("corral null-backend --protocol {fastcgi,scgi,lsapi,http} --listen unix:$SCRATCH/run/null-$P.sock")
P("corral run -c $SCRATCH/<name>.toml     # null-fastcgi, null-scgi, null-lsapi, php-cgi-http, php-cgi-fcgi, lsphp-http, idle")
P("php-fpm8.2 -F -y $SCRATCH/fpm.conf     # pm = static, pm.max_children = 2, unix socket")
P("nginx -e $SCRATCH/log/nginx.log -c $SCRATCH/nginx.conf")
P("```")
P()
P("Loads, in the order run:")
P()
P("```sh")
import re
for l in open(f"{data}/commands.txt"):
    P(re.sub(r"--pid (\d+)", lambda m: "--pid <" + names.get(int(m.group(1)), m.group(1)) + ">", l.rstrip("\n")))
P("corral bench --protocol http --target <front> --path /{hello,info}.php --concurrency 25 --duration 5s --warmup 0s   # (c), one pool at a time")
P("```")
P()
P("Targets (ports are picked free at each run):")
P()
for l in open(f"{data}/labels.tsv"):
    b, addr, lab = l.rstrip("\n").split("\t")
    P(f"- `{b}`: `{rel(addr)}` = {lab}")
P()
for f in ("null-fastcgi.toml", "php-cgi-fcgi.toml", "lsphp-http.toml"):
    P(f"`{f}`:")
    P()
    P("```toml")
    P(open(f"{data}/{f}").read().rstrip())
    P("```")
    P()
P("nginx (php-fpm keeps its connection-per-request config A, because php-fpm's children "
  "serve one connection at a time and kept connections would pin them; the null backend and corral, which are "
  "event-driven, get `fastcgi_keep_conn on` + upstream keepalive):")
P()
P("```nginx")
P(open(f"{data}/nginx.conf").read().rstrip())
P("```")
P()
P("`null-scgi.toml` and `null-lsapi.toml` are `null-fastcgi.toml` with the protocol changed (and no second "
  "listener for LSAPI); `php-cgi-http.toml` is `php-cgi-fcgi.toml` with only the http listener; `idle.toml` is "
  "`null-fastcgi.toml` with only the http listener and `max_connections_per_client = 0` (the 1,000 connections all "
  "come from 127.0.0.1).")
P()
P("### Charts")
P()
for b in benches:
    P(f"- [{b}](results/{b}.svg)")
PY
}

# ---- the report ----
{
  echo "started=$started"
  echo "elapsed=$elapsed"
  echo "load_start=$load_start"
  echo "load_begin=$load_begin"
  echo "load_end=$load_end"
  echo "commit=$commit"
  echo "binary=$binary"
  echo "uname=$(uname -srm)"
  echo "nproc=$(nproc)"
  echo "cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "mem=$(free -m | awk '/^Mem:/ {print $2 " MiB total, " $7 " MiB available"}')"
  echo "nginx=$(nginx -v 2>&1 | sed 's/.*: //')"
  echo "php=$(php-cgi -v | head -1 | cut -d' ' -f1-2)"
  echo "lsphp=$("$LSPHP" -v | head -1 | cut -d' ' -f1-3)"
  echo "settings=NULL_DUR=$NULL_DUR PHP_DUR=$PHP_DUR WARM=$WARM ROUNDS=$ROUNDS LEVELS=$LEVELS"
} > "$data/facts.txt"
cp "$scratch/nginx.conf" "$data/nginx.conf"; sed -i "s#$scratch#\$SCRATCH#g" "$data/nginx.conf"
for f in null-fastcgi php-cgi-fcgi lsphp-http; do sed "s#$scratch#\$SCRATCH#g" "$scratch/$f.toml" > "$data/$f.toml"; done
write_report > "$scratch/report.py"
for f in "$RES"/*.json "$RES"/*.svg "$RES"/*.txt; do sed -i "s#$scratch#\$SCRATCH#g" "$f"; done
python3 "$scratch/report.py" "$data" "$RES" "$scratch" > "$scratch/report.md"
cat "$scratch/report.md"
results_write compare "corral compared with nginx, php-fpm and lsphp, side by side, in one run" "$scratch/report.md"
