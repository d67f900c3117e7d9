#!/usr/bin/env bash
# Question: does WordPress's front page run as fast, with as short a tail, through corral's
# gateway (corral's http listener -> a php-cgi pool, and nginx -> corral's fastcgi listener
# -> the pool) as behind nginx -> php-fpm and nginx -> php-cgi (issue 19's "real
# applications" target: >= 0.98x nginx -> php-cgi at every concurrency through both paths,
# p99 no worse than php-fpm's at c=10 and c=50)? And what do corral's serving threads
# (`[server] threads`) do to it on a machine whose cores the PHP workers need?
#
# The fixture is benches/lib/wordpress.sh's (the one tests/app_wordpress.rs builds). Rows,
# COUNT PHP processes each, OPcache on (checked in every PHP process):
#   fpm        nginx -> php-fpm8.2, pm = static, pm.max_children = COUNT
#   cgi        nginx -> php-cgi -b SOCKET with PHP_FCGI_CHILDREN = COUNT (its parent forks
#              the children, which accept on the socket: the kernel's FIFO accept queue),
#              PHP_FCGI_MAX_REQUESTS = 0
#   cgi-sep    with CGI_SEP=1: nginx -> COUNT separate php-cgi -b processes (PHP_FCGI_CHILDREN
#              = 0: each serves requests itself, with an OPcache of its own, as corral's
#              workers do), an nginx upstream with least_conn over their sockets
#   gw-fcgi    nginx -> corral's fastcgi listener -> corral's php-cgi pool (static, max =
#              COUNT), the corral of conf/wordpress.toml's shape (its http contexts as
#              tests/support/wordpress.rs writes them)
#   gw-http    corral's http listener -> the same pool, same corral (no nginx)
#   gw-*-tN    the same with `threads = N` in corral's [server] (a corral of its own)
#   gw-*-pc    the same with `php_children = COUNT` (one php-cgi parent whose COUNT children
#              share its OPcache and its session, as php-cgi -b's and php-fpm's do; max = 1)
#   base-*     the same as gw-* with the corral binary BASE (a before/after in one run),
#              when BASE is set; BASE_AS=gw-pc (any kind of CORRALS) gives it that row's settings
# The rows run at COUNT together, idle but for the one measured. wrk -t1 --latency -d SECS
# on the front page at each level of LEVELS, the rows interleaved per round (ROUNDS) after a
# 2 s warm-up each; req/s (requests of the rounds pooled), p99 per round (and their median,
# and the p99 of all the rounds' requests from wrk's histograms, benches/lib/latency-hist.lua),
# the CPU the front took per request (nginx's worker plus the row's corral, from
# /proc/PID/task/*/schedstat, so gw-http is corral alone and gw-fcgi is nginx plus corral) and wrk's
# errors (a row with errors or timeouts is invalid and no ratio uses it); the ratios against
# fpm and cgi. Beside them, per row, what the PHP processes did per request (from
# /proc/PID/task/*/schedstat): their CPU, their wait for a CPU (run queue), MariaDB's CPU,
# the share of the machine's CPU time left idle during the runs (/proc/stat), how often per
# request a CPU went idle (cpuidle's usage counters: at c=1, each is a halted CPU that a
# wake-up on the request's path may have to bring back, decision 40); and how many
# scheduling groups the row's PHP processes are in (Linux's autogroups: one per session
# when sched_autogroup_enabled is 1; each group gets an equal share of a busy CPU).
#
# FLAT=1 runs the whole bench in a CPU cgroup of its own, where no autogroup applies: every
# process of every row competes as an equal thread (benches/lib/wordpress.sh, wp_flat).
#
# HANDOFF=1 (needs perf) adds, after the rounds, one run per row at c=HANDOFF_LEVEL (10)
# with the read/write syscall tracepoints of the row's PHP processes recorded: how long a PHP
# process sits idle between the end of one response and the next request
# (benches/lib/handoff.py: median and p90), and its short or failed response writes. That
# run is not counted in req/s.
#
# HOLD=1 measures nothing: once every row answers, it writes the rows (name, URL, the pid of
# the process whose tree is the row's PHP or corral) to rows.tsv in its scratch directory and
# the Host header to send to `host` beside it, prints where they are, and keeps the stacks up
# until the file `hold` beside them is removed, for measuring one stack by hand (perf, strace,
# wrk, a restart of its PHP; benches/sched-batch.sh).
#
# FRONT=1 (needs perf) adds, after the rounds, two runs per row at c=FRONT_LEVEL (10), to
# show what the front's CPU per request is made of (nginx's worker, plus the row's corral):
# its user and system CPU and its voluntary and involuntary context switches per request
# (/proc/PID/task/*/stat and status, in a run of its own, untraced), then its system calls
# per request and the commonest of them (`perf trace -s`, a second run; strace's stops
# slow the front so much that it finds more waiting at each wake-up and makes half the
# calls). Neither run is counted in req/s.
#
#   bash benches/wordpress-gateway.sh
#   SECS=2 ROUNDS=1 OUT= bash benches/wordpress-gateway.sh     # a quick look
#   BASE=/path/to/old/corral bash benches/wordpress-gateway.sh  # before and after, one run
#   KEEP=/tmp/wp-a bash benches/wordpress-gateway.sh; ... KEEP=/tmp/wp-b ...
#   python3 benches/lib/wp_report.py /tmp/wp-a /tmp/wp-b         # the runs pooled, one verdict
# Env: SECS (10), ROUNDS (3), LEVELS ("1 10 50"), COUNT (2), CORRAL (release build), BASE, BASE_AS (gw),
# CORRALS (the corrals to run, default "gw gw-t1": gw = corral's defaults, gw-tN = threads = N,
# gw-pc = php_children, gw-pc-rN and gw-rN = those two with max_requests = N), CGI_SEP, FLAT, FLAT_WEIGHT, SHUFFLE (each round's rows in another order; a value other than 1 seeds other orders),
# HANDOFF, HANDOFF_LEVEL, FRONT, FRONT_LEVEL, HOLD, KEEP (a directory to keep the run's raw figures in, for wp_report.py),
# OUT (default benches/RESULTS.md, section `wordpress-gateway`; OUT= prints only).
# Needs root (a config file under /etc/wordpress; nginx, PHP and corral's workers run as
# www-data, MariaDB as mysql), mariadb-server, wordpress, nginx, php-cgi, php-fpm8.2, wrk.
# Every process it starts it stops.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/wordpress.sh
source benches/lib/cpuidle.sh
RESULTS_VARS="SECS ROUNDS LEVELS COUNT CORRAL BASE BASE_AS CORRALS CGI_SEP FLAT FLAT_WEIGHT SHUFFLE HANDOFF HANDOFF_LEVEL FRONT FRONT_LEVEL HOLD KEEP"
results_start "$@"
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-3}
LEVELS=${LEVELS:-1 10 50}
COUNT=${COUNT:-2}
HANDOFF=${HANDOFF:-}
HANDOFF_LEVEL=${HANDOFF_LEVEL:-10}
FRONT=${FRONT:-}
FRONT_LEVEL=${FRONT_LEVEL:-10}
if [ -n "$FRONT" ] && ! command -v perf > /dev/null; then
  echo "FRONT=1 needs perf (apt-get install linux-perf)" >&2
  exit 1
fi
if [ -n "$HANDOFF" ] && ! command -v perf > /dev/null; then
  echo "HANDOFF=1 needs perf (apt-get install linux-perf)" >&2
  exit 1
fi
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL
[ -z "${BASE:-}" ] || BASE=$(realpath "$BASE")
s=$(mktemp -d /tmp/corral-wpgw.XXXXXX)
chmod 755 "$s"
host="wp-gw-$$.corral.test"
WP_TITLE="WP Gateway Bench"
trap wp_cleanup EXIT
[ -z "${FLAT:-}" ] || wp_flat
ulimit -n 16384 2>/dev/null || true

# The corrals: NAME -> binary and [server] lines.
CORRALS=${CORRALS:-gw gw-t1}
declare -A corral_bin corral_server corral_pool
corral_settings() { # KEY KIND: KEY's [server] lines and pool lines, as the row kind KIND
  # gw: corral's defaults; gw-tN: threads = N; gw-pc: php_children
  local k=$1 g=$2
  corral_pool[$k]="max = $COUNT"
  case $g in
    gw) corral_server[$k]="" ;;
    gw-t[0-9]*) corral_server[$k]="threads = ${g#gw-t}" ;;
    gw-pc) corral_server[$k]=""; corral_pool[$k]=$'max = 1\nphp_children = '"$COUNT" ;;
    # -rN: max_requests = N, to see what recycling costs (a group is replaced whole, its
    # OPcache with it, after N per child; a separate worker after N of its own).
    gw-pc-r[0-9]*) corral_server[$k]=""
      corral_pool[$k]=$'max = 1\nphp_children = '"$COUNT"$'\nmax_requests = '"${g#gw-pc-r}" ;;
    gw-r[0-9]*) corral_server[$k]=""; corral_pool[$k]="max = $COUNT"$'\nmax_requests = '"${g#gw-r}" ;;
    *) echo "unknown corral row $g (gw, gw-tN, gw-pc, gw-pc-rN or gw-rN)" >&2; exit 2 ;;
  esac
}
for g in $CORRALS; do
  corral_bin[$g]=$CORRAL
  corral_settings "$g" "$g"
done
if [ -n "${BASE:-}" ]; then
  CORRALS+=" base"
  corral_bin[base]=$BASE
  corral_settings base "${BASE_AS:-gw}"
fi
declare -A port sock upstream
port[fpm]=18821; sock[fpm]=$s/run/fpm.sock
port[cgi]=18822; sock[cgi]=$s/run/cgi.sock
NGINX_ROWS="fpm cgi"
ROW_NAMES="fpm cgi"
if [ -n "${CGI_SEP:-}" ]; then
  port[cgi-sep]=18820
  upstream[cgi-sep]=$(for i in $(seq "$COUNT"); do printf '%s ' "$s/run/sep$i.sock"; done)
  NGINX_ROWS+=" cgi-sep"
  ROW_NAMES+=" cgi-sep"
fi
declare -A row_corral  # gateway row -> its corral
p=18823
for g in $CORRALS; do
  f=${g/gw/gw-fcgi}; h=${g/gw/gw-http}
  [ "$g" = base ] && { f=base-fcgi; h=base-http; }
  port[$f]=$p; sock[$f]=$s/run/$g.sock; p=$((p + 1))
  port[$h]=$p; p=$((p + 1))
  row_corral[$f]=$g; row_corral[$h]=$g
  NGINX_ROWS+=" $f"
  ROW_NAMES+=" $f $h"
done
echo "rows: $ROW_NAMES" >&2

wp_database
db_pid=${pids[-1]}
wp_nginx $NGINX_ROWS
nginx_pid=${pids[-1]}

corral_conf() { # CORRAL-NAME FCGI-ROW HTTP-ROW
  cat << CONF
[server]
runtime_dir = "$s/corral/$1.d"
user = "www-data"
group = "www-data"
log_level = "warn"
${corral_server[$1]}

[[listen]]
address = "127.0.0.1:${port[$3]}"
protocol = "http"

[[listen]]
address = "unix:${sock[$2]}"
protocol = "fastcgi"
mode = "0666"

[pools.php]
command = ["php-cgi"]
mode = "static"
${corral_pool[$1]}

CONF
  wp_corral_contexts "unix:${sock[$2]}"
}

declare -A root_pid   # row -> the process whose tree is its PHP (and, for corral, the front)
wp_fpm "$COUNT"; root_pid[fpm]=$!
wait_sock "${sock[fpm]}"
PHP_FCGI_CHILDREN=$COUNT PHP_FCGI_MAX_REQUESTS=0 setpriv --reuid=www-data --regid=www-data \
  --init-groups php-cgi -b "${sock[cgi]}" > "$s/log/cgi.log" 2>&1 & row_pids+=($!)
root_pid[cgi]=$!
sep_pids=""
for u in ${upstream[cgi-sep]:-}; do
  PHP_FCGI_CHILDREN=0 PHP_FCGI_MAX_REQUESTS=0 setpriv --reuid=www-data --regid=www-data \
    --init-groups php-cgi -b "$u" >> "$s/log/cgi-sep.log" 2>&1 & row_pids+=($!)
  sep_pids+=" $!"
done
for g in $CORRALS; do
  f=base-fcgi; h=base-http
  [ "$g" = base ] || { f=${g/gw/gw-fcgi}; h=${g/gw/gw-http}; }
  corral_conf "$g" "$f" "$h" > "$s/$g.toml"
  "${corral_bin[$g]}" run -c "$s/$g.toml" >> "$s/log/corral-$g.log" 2>&1 & row_pids+=($!)
  root_pid[$f]=$!; root_pid[$h]=$!
done
for r in fpm cgi; do wait_sock "${sock[$r]}"; done
for u in ${upstream[cgi-sep]:-}; do wait_sock "$u"; done
for g in $CORRALS; do wait_sock "$s/run/$g.sock"; done

url() { echo "http://127.0.0.1:${port[$1]}/"; }
wp_install "$(url fpm)"
for r in $ROW_NAMES; do
  st=$(wp_front "$(url "$r")")
  [ "$st" = ok ] || { echo "$r: the front page answered $st" >&2; tail -n 20 "$s"/log/*.log >&2; exit 1; }
done
if [ -n "${HOLD:-}" ]; then # the stacks stay up, unmeasured, until $s/hold is removed
  { for r in $ROW_NAMES; do printf '%s\t%s\t%s\n' "$r" "$(url "$r")" "${root_pid[$r]}"; done
    printf 'nginx\t-\t%s\nmariadb\t-\t%s\n' "$nginx_pid" "$db_pid"; } > "$s/rows.tsv"
  printf '%s\n' "$host" > "$s/host" # benches/sched-batch.sh reads it
  touch "$s/hold"
  echo "HOLD: rows (name, URL, root pid) in $s/rows.tsv, Host: $host; rm $s/hold to stop" >&2
  while [ -e "$s/hold" ]; do sleep 1; done
  exit 0
fi

cpu_ns() { # PID: nanoseconds on CPU, all its threads (schedstat: finer than stat's ticks)
  cat /proc/"$1"/task/*/schedstat 2> /dev/null | awk '{t += $1} END {printf "%d", t}'
}
front_pids() { # ROW: the processes whose CPU is the front's (nginx's worker, the row's corral)
  local r=$1
  if [ -n "${row_corral[$r]:-}" ]; then echo "${root_pid[$r]}"; fi
  case $r in *http*) ;; *) children "$nginx_pid" ;; esac
}
front_ns() { local t=0 p; for p in $(front_pids "$1"); do t=$((t + $(cpu_ns "$p"))); done; echo "$t"; }
php_pids() { # ROW: its PHP processes (for corral rows, corral's children's trees)
  local k
  case $1 in
    fpm|cgi) tree "${root_pid[$1]}" ;;
    cgi-sep) for k in $sep_pids; do tree "$k"; done ;;
    *) for k in $(children "${root_pid[$1]}"); do tree "$k"; done ;;
  esac
}
sched_ns() { # FIELD PID...: schedstat's field summed over the threads (1 = on a CPU, 2 = runnable, waiting for one), ns
  local f=$1 p
  shift
  for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2> /dev/null || true; done | awk -v f="$f" '{t += $f} END {printf "%d", t}'
}
proc_stats() { # PID...: a line per live process: pid, ns on a CPU, ns runnable, involuntary switches, migrations
  local p
  for p in "$@"; do
    { cat /proc/"$p"/task/*/schedstat /proc/"$p"/task/*/sched 2> /dev/null || true; } |
      awk -v p="$p" 'NF == 3 && $1 ~ /^[0-9]+$/ {on += $1; w += $2; n++}
        $1 == "nr_involuntary_switches" {i += $3} $1 == "se.nr_migrations" {m += $3}
        END {if (n) printf "%s %d %d %d %d\n", p, on, w, i, m}'
  done
}
stats_delta() { # BEFORE AFTER (proc_stats output): the sums' growth over the processes live at the
  # end; one started meanwhile counts from 0, one gone meanwhile (a recycled worker) is missed
  awk 'NR == FNR {for (k = 2; k <= 5; k++) b[$1, k] = $k; next}
    {for (k = 2; k <= 5; k++) d[k] += $k - b[$1, k]}
    END {printf "%d %d %d %d\n", d[2], d[3], d[4], d[5]}' "$1" "$2"
}
cpu_ticks() { awk '/^cpu / {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; } # idle+iowait, all

res=$s/results.tsv
: > "$res"
: > "$s/wake.tsv"
echo "$SECS" > "$s/secs"
echo "$HANDOFF_LEVEL" > "$s/handoff_level"
mkdir -p "$s/hist"
for c in $LEVELS; do
  for r in $ROW_NAMES; do
    wrk -t1 -c"$c" -d2s --timeout 10s -H "Host: $host" "$(url "$r")" > /dev/null 2>&1 # warm-up, unrecorded
  done
  for round in $(seq "$ROUNDS"); do
    # Each round in another order (SHUFFLE=1, seeded by level and round, so a run can be
    # repeated): a row is then not always measured right after the same neighbour. Any
    # other SHUFFLE value seeds other orders too, for runs to be pooled (wp_report.py).
    order=$ROW_NAMES
    seed=$c$round
    [ "${SHUFFLE:-1}" = 1 ] || seed=$SHUFFLE$seed
    # shellcheck disable=SC2086 # ROW_NAMES: a list
    [ -z "${SHUFFLE:-}" ] || order=$(printf '%s\n' $ROW_NAMES |
      awk -v seed="$seed" 'BEGIN {srand(seed)} {print rand() "\t" $0}' | sort -n | cut -f2 | tr '\n' ' ')
    # What waking the idle CPU costs at this moment: at c=1 a request pays it at every
    # wake-up that crosses CPUs, and it changes between rounds (decision 40).
    printf '%s\t%s\t%s\n' "$c" "$round" "$(python3 benches/lib/wake_idle.py | cut -d' ' -f1)" >> "$s/wake.tsv"
    for r in $order; do
      # shellcheck disable=SC2046 # a list of pids
      proc_stats $(php_pids "$r") > "$s/php-before"
      d0=$(sched_ns 1 "$db_pid")
      read -r i0 a0 < <(cpu_ticks)
      h0=$(idle_entries)
      t0=$(front_ns "$r")
      out=$(WRK_HIST=$s/hist/c$c-$r-$round.txt wrk -t1 -c"$c" -d"${SECS}s" --timeout 10s --latency \
        -s benches/lib/latency-hist.lua -H "Host: $host" "$(url "$r")" 2>&1)
      t1=$(front_ns "$r")
      h1=$(idle_entries)
      read -r i1 a1 < <(cpu_ticks)
      d1=$(sched_ns 1 "$db_pid")
      # shellcheck disable=SC2046
      proc_stats $(php_pids "$r") > "$s/php-after"
      read -r dp dw dv dm < <(stats_delta "$s/php-before" "$s/php-after")
      reqs=$(awk '/requests in/ {print $1}' <<< "$out")
      p99=$(awk '$1 == "99%" {print $2}' <<< "$out")
      read -r errs touts < <(wrk_errors <<< "$out")
      halts=-
      [ "$h0" = - ] || halts=$((h1 - h0))
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$r" "$round" "${reqs:-0}" "${p99:--}" "$errs" "$touts" "$((t1 - t0))" "$(cut -d' ' -f1 /proc/loadavg)" \
        "$dp" "$dw" "$((d1 - d0))" "$((i1 - i0))" "$((a1 - a0))" "$dv" "$dm" "$halts" >> "$res"
      printf '%s c=%s round %s: %s requests, p99 %s, %s errors, %s timeouts, load %s\n' "$r" "$c" "$round" "$reqs" "$p99" "$errs" "$touts" "$(cut -d' ' -f1 /proc/loadavg)" >&2
    done
  done
done
declare -A groups  # row -> "PHP processes / scheduling groups"
for r in $ROW_NAMES; do
  for p in $(php_pids "$r"); do
    grep -q opcache.so "/proc/$p/maps" || { echo "$r: PHP process $p has no OPcache loaded" >&2; exit 1; }
  done
  # shellcheck disable=SC2046
  groups[$r]="$(php_pids "$r" | wc -l) / $(cat $(php_pids "$r" | sed 's|.*|/proc/&/autogroup|') 2> /dev/null | cut -d' ' -f1 | sort -u | wc -l)"
done

# The hand-off: one more run per row, with the PHP processes' read/write system calls
# recorded (not counted above: recording costs the traced processes some time).
handoff=$s/handoff.tsv
: > "$handoff"
if [ -n "$HANDOFF" ]; then
  for r in $ROW_NAMES; do
    perf record -q -o "$s/perf-$r.data" -p "$(php_pids "$r" | paste -sd,)" \
      -e syscalls:sys_enter_read,syscalls:sys_exit_read,syscalls:sys_enter_write,syscalls:sys_exit_write \
      -- sleep "$SECS" > /dev/null 2>&1 &
    rec=$!
    wrk -t1 -c"$HANDOFF_LEVEL" -d"$((SECS + 1))s" --timeout 10s -H "Host: $host" "$(url "$r")" > /dev/null 2>&1
    wait "$rec" || true
    printf '%s\t%s\n' "$r" "$(perf script -i "$s/perf-$r.data" 2> /dev/null | python3 benches/lib/handoff.py)" >> "$handoff"
    rm -f "$s/perf-$r.data"
  done
fi

# The front per request: two more runs per row, one counted from /proc, one under perf trace.
front_counts() { # PID...: user and system ticks, voluntary and involuntary switches, all threads
  local p
  for p in "$@"; do
    # utime and stime, the 14th and 15th fields: the 12th and 13th after the name's ')'
    sed 's/.*) //' /proc/"$p"/task/*/stat 2> /dev/null | awk '{print "t", $12, $13}' || true
    cat /proc/"$p"/task/*/status 2> /dev/null || true
  done | awk '$1 == "t" {u += $2; k += $3} $1 == "voluntary_ctxt_switches:" {v += $2}
    $1 == "nonvoluntary_ctxt_switches:" {i += $2} END {printf "%d %d %d %d\n", u, k, v, i}'
}
front=$s/front.tsv
: > "$front"
echo "$FRONT_LEVEL $(getconf CLK_TCK)" > "$s/front_level"
if [ -n "$FRONT" ]; then
  for r in $ROW_NAMES; do
    # shellcheck disable=SC2046 # a list of pids
    read -r u0 k0 v0 i0 < <(front_counts $(front_pids "$r"))
    out=$(wrk -t1 -c"$FRONT_LEVEL" -d"${SECS}s" --timeout 10s -H "Host: $host" "$(url "$r")" 2>&1)
    # shellcheck disable=SC2046
    read -r u1 k1 v1 i1 < <(front_counts $(front_pids "$r"))
    n=$(awk '/requests in/ {print $1}' <<< "$out")
    perf trace -s -p "$(front_pids "$r" | paste -sd,)" -o "$s/trace-$r.txt" -- sleep "$((SECS + 1))" > /dev/null 2>&1 &
    tr=$!
    sleep 0.5
    out=$(wrk -t1 -c"$FRONT_LEVEL" -d"${SECS}s" --timeout 10s -H "Host: $host" "$(url "$r")" 2>&1)
    wait "$tr" || true
    m=$(awk '/requests in/ {print $1}' <<< "$out")
    # perf trace -s: a table per thread, a line per call (its name, then how many); summed
    # over the threads, per request of the traced run, the five commonest beside the total.
    awk '$1 ~ /^[a-z_0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 8 {c[$1] += $2} END {for (k in c) print c[k], k}' \
      "$s/trace-$r.txt" | sort -rn > "$s/trace-$r.sum"
    calls=$(awk -v m="${m:-0}" '{t += $1} END {if (m > 0) printf "%.1f", t / m}' "$s/trace-$r.sum")
    top=$(head -n 5 "$s/trace-$r.sum" | awk -v m="${m:-0}" 'm > 0 {printf "%s%s %.2f", (NR > 1 ? ", " : ""), $2, $1 / m}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "${n:-0}" "$((u1 - u0))" "$((k1 - k0))" "$((v1 - v0))" "$((i1 - i0))" "${calls:-—}" "${top:-—}" >> "$front"
  done
fi
{ for r in $ROW_NAMES; do printf '%s\t%s\n' "$r" "${groups[$r]}"; done; } > "$s/groups.tsv"

report() {
  echo "Debian's WordPress $(dpkg-query -W -f='${Version}' wordpress) on MariaDB, $(php-cgi -v | head -n 1 | cut -d' ' -f1-2) with OPcache, the front page;"
  echo "nginx 1 worker (conf/nginx/wordpress.conf, placeholders replaced). $COUNT PHP processes per row:"
  echo "\`fpm\` = nginx → php-fpm8.2 (pm = static); \`cgi\` = nginx → php-cgi -b with PHP_FCGI_CHILDREN=$COUNT;"
  [ -z "${CGI_SEP:-}" ] || echo "\`cgi-sep\` = nginx (upstream, least_conn) → $COUNT separate php-cgi -b processes, PHP_FCGI_CHILDREN=0 (an OPcache each);"
  echo "\`gw-fcgi\` = nginx → corral's fastcgi listener → corral's php-cgi pool (static, max = $COUNT); \`gw-http\` = corral's"
  echo "http listener → the same pool; \`-tN\`: \`threads = N\` in corral's [server]; \`-pc\`: \`php_children = $COUNT\`, \`max = 1\` (one"
  echo "php-cgi parent whose children share its OPcache and session); \`-rN\`: \`max_requests = N\` (a group is replaced whole after N per"
  echo "child, a separate worker after N; the PHP columns miss the processes gone before the end); \`base-*\`: the same as \`gw-*\` with the binary BASE."
  echo "wrk -t1 --latency -d${SECS}s, $ROUNDS round(s) interleaved per level after a 2 s warm-up per row${SHUFFLE:+ (each round in another order)}; req/s pools the rounds;"
  echo "p99 one per round (ms), and their median; p99 all = the 99th percentile of all the rounds' requests (wrk's histograms),"
  echo "which the verdict uses; front µs/req = CPU of nginx's worker (nginx rows) plus the row's corral"
  echo "(/proc/PID/task/*/schedstat) over the requests. Load = the 1-minute load average after each run (the range). This machine's"
  echo "2 cores were shared with other builds: compare rows within this run, not with other runs."
  # At c=1 the corral rows' CPUs go idle three times as often as nginx's (decision 40), so
  # how an idle CPU waits changes their ratios: say which driver, and how long it polls.
  local idle poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns
  idle="cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2> /dev/null || echo none)"
  if [ -r "$poll" ]; then idle="$idle, guest_halt_poll_ns=$(cat "$poll")"; fi
  echo "$idle."
  if [ -n "${FLAT:-}" ]; then
    echo "FLAT=1: every process of the bench ran in one CPU cgroup of its own, where no autogroup applies."
    [ -z "${FLAT_WEIGHT:-}" ] || echo "FLAT_WEIGHT=$FLAT_WEIGHT: that cgroup's cpu.shares (1024 = one session's share), so what else ran on the machine got next to nothing while the bench ran."
  else
    echo "Autogroups $( [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2> /dev/null)" = 1 ] && echo on || echo off): a busy CPU is shared equally between sessions (see the sessions column)."
  fi
  echo "Wake-up probe before each round: the median round trip between a process on CPU 0 and one on CPU 1, each"
  echo "after 1 ms asleep (benches/lib/wake_idle.py, two wake-ups of an idle CPU), in µs, round by round:"
  for c in $LEVELS; do printf 'c=%s: %s\n' "$c" "$(awk -v c="$c" '$1 == c {print $3}' "$s/wake.tsv" | paste -sd' ')"; done |
    paste -sd';' | sed 's/;/; /g; s/$/./'
  echo
  python3 benches/lib/wp_report.py "$s"
}
report > "$s/report.md"
if [ -n "${KEEP:-}" ]; then # what benches/lib/wp_report.py needs to pool this run with others
  mkdir -p "$KEEP"
  cp -r "$s/results.tsv" "$s/secs" "$s/groups.tsv" "$s/handoff.tsv" "$s/handoff_level" "$s/front.tsv" "$s/front_level" "$s/wake.tsv" "$s/hist" "$s/report.md" "$KEEP/"
fi
cat "$s/report.md"
results_write wordpress-gateway "WordPress through corral's gateway against nginx → php-fpm and nginx → php-cgi" "$s/report.md"
