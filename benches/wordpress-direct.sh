#!/usr/bin/env bash
# Question: behind nginx, does WordPress's front page run as fast on a corral direct pool as
# on php-fpm, and do the PHP processes take no more memory (issue 23's WordPress target:
# front page >= 0.98x php-fpm; PSS with php_children <= php-fpm's)?
#
# The fixture is the one benches/php-memory.sh and tests/app_wordpress.rs build: Debian's
# WordPress 6.1 on a private MariaDB, a config file per Host under /etc/wordpress. nginx
# (1 worker) runs conf/nginx/wordpress.conf as written, one server block per row, only its
# placeholders replaced (the site's name, the socket fastcgi_pass names, wp-content's
# directory, the port). Rows, COUNT PHP processes each:
#   fpm       nginx -> php-fpm8.2, pm = static, pm.max_children = COUNT, Debian's defaults
#             otherwise (master + COUNT children)
#   direct    nginx -> a corral direct pool (accept = "direct", php-cgi, static, max =
#             COUNT): the workers accept on the pool's listener, corral is off the path
#   direct-children  a direct pool with max = 1, php_children = COUNT: one php-cgi parent
#             forking COUNT children that share its OPcache and accept on the same socket,
#             php-fpm's own model (parent + COUNT children, as php-fpm's master + children).
# Issue 23's ratios (speed and PSS) are taken on direct-children; direct's are printed beside
# them for comparison.
#
# Memory: for each N in MEM_COUNTS, each row alone (no other PHP server running, so shared
# library pages are not split with another row's processes), wrk -c 2N on the front page for
# WARM s (again, up to 5 times, until every serving process has run 100 ms of CPU) so
# that every process has compiled and served it, then Pss from
# /proc/PID/smaps_rollup summed over the PHP processes (php-fpm's master and php-cgi's parent
# included; not nginx, corral or MariaDB). Speed: the three rows at COUNT together, wrk -t1
# --latency -d SECS on the front page at each level of LEVELS, the rows interleaved per
# round (ROUNDS), after a warm-up; req/s (requests of the rounds pooled), p99 per round and
# wrk's errors (connect, read, write, non-2xx/3xx; timeouts apart: a row with either is
# invalid and no ratio uses it), and the ratios against fpm.
#
#   bash benches/wordpress-direct.sh
#   SECS=2 ROUNDS=1 MEM_COUNTS=2 OUT= bash benches/wordpress-direct.sh    # a quick look
# Env: SECS (10), ROUNDS (2), LEVELS ("1 10 50"), COUNT (2), MEM_COUNTS ("2 8"), WARM (3),
# CORRAL (release build), OUT (default benches/RESULTS.md, section `wordpress-direct`; OUT=
# prints only). Needs root (a config file under /etc/wordpress; nginx and PHP run as
# www-data, MariaDB as mysql), mariadb-server, wordpress, nginx, php-cgi, php-fpm8.2, wrk.
# Every process it starts it stops.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/wordpress.sh
RESULTS_VARS="SECS ROUNDS LEVELS COUNT MEM_COUNTS WARM CORRAL"
results_start "$@"
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-2}
LEVELS=${LEVELS:-1 10 50}
COUNT=${COUNT:-2}
MEM_COUNTS=${MEM_COUNTS:-2 8}
WARM=${WARM:-3}
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=target/release/corral
fi
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL
s=$(mktemp -d /tmp/corral-wpdirect.XXXXXX)
chmod 755 "$s"
host="wp-direct-$$.corral.test"
WP_TITLE="WP Direct Bench"
trap wp_cleanup EXIT
ulimit -n 16384 2>/dev/null || true
hz=$(getconf CLK_TCK)

# ---- MariaDB as mysql on a private socket, WordPress's config for $host ----
wp_database

kids=direct-children
kids_why="\`direct-children\` = a corral direct pool of one php-cgi parent with \`php_children\` = N (static): the parent forks the N children, which share its OPcache and accept on the pool's listener (php-fpm's model)."
ROW_NAMES="fpm direct $kids"
echo "rows: $ROW_NAMES" >&2

# ---- nginx: conf/nginx/wordpress.conf once per row, its placeholders replaced ----
declare -A port=([fpm]=18801 [direct]=18802 [$kids]=18803)
declare -A sock=([fpm]=$s/run/fpm.sock [direct]=$s/run/direct.sock [$kids]=$s/run/kids.sock)
wp_nginx $ROW_NAMES

# ---- the PHP servers ----
corral_conf() { # ROW N
  local pool
  case $1 in
    direct) pool="accept = \"direct\"
listener = \"unix:${sock[$1]}\"
mode = \"static\"
max = $2" ;;
    direct-children) pool="accept = \"direct\"
listener = \"unix:${sock[$1]}\"
mode = \"static\"
max = 1
php_children = $2" ;;
  esac
  cat << CONF
[server]
runtime_dir = "$s/corral/$1.d"
user = "www-data"
group = "www-data"
log_level = "warn"
[[listen]]
address = "unix:${sock[$1]}"
protocol = "fastcgi"
mode = "0666"
[pools.php]
command = ["php-cgi"]
$pool
CONF
}
declare -A root_pid
start_row() { # ROW N: starts its PHP server; root_pid[ROW] is the process whose tree is PHP's
  rm -f "${sock[$1]}"
  if [ "$1" = fpm ]; then
    wp_fpm "$2"
  else
    corral_conf "$1" "$2" > "$s/$1.toml"
    "$CORRAL" run -c "$s/$1.toml" >> "$s/log/corral-$1.log" 2>&1 & row_pids+=($!)
  fi
  root_pid[$1]=$!
  wait_sock "${sock[$1]}"
}
stop_rows() { # and waits for their PHP processes too, so none is left sharing pages with the next row
  local r left=() who="${!root_pid[*]}"
  for r in "${!root_pid[@]}"; do mapfile -t -O "${#left[@]}" left < <(php_pids "$r"); done
  root_pid=()
  wp_stop_rows "${who:-no row}" 200 ${left[@]+"${left[@]}"}
}
url() { echo "http://127.0.0.1:${port[$1]}/"; }
front() { wp_front "$(url "$1")"; }

php_pids() { # ROW: the PHP processes (php-fpm's whole tree; corral's children's trees)
  local k
  if [ "$1" = fpm ]; then tree "${root_pid[fpm]}"; else
    for k in $(children "${root_pid[$1]}"); do tree "$k"; done
  fi
}
pss() { # ROW -> "KIB PROCS"; every PHP process must have OPcache mapped
  local t=0 n=0 p k
  for p in $(php_pids "$1"); do
    grep -q opcache.so "/proc/$p/maps" || { echo "$1: process $p has no OPcache loaded" >&2; exit 1; }
    k=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup")
    t=$((t + k)); n=$((n + 1))
  done
  echo "$t $n"
}
leaves() { # ROW: the PHP processes that serve (no children: not php-fpm's master or php-cgi's parent)
  local p
  for p in $(php_pids "$1"); do [ -n "$(children "$p")" ] || echo "$p"; done
}
warm() { # ROW N: wrk -c 2N on the front page until every serving process has run 100 ms
  local try p cold
  for try in 1 2 3 4 5; do
    wrk -t1 -c$((2 * $2)) -d"${WARM}s" --timeout 10s -H "Host: $host" "$(url "$1")" > /dev/null
    cold=""
    for p in $(leaves "$1"); do
      [ "$(awk '{print $14 + $15}' "/proc/$p/stat")" -ge $((hz / 10)) ] || cold+=" $p"
    done
    [ -z "$cold" ] && return 0
    echo "$1 N=$2: not yet warm after $try warm-ups:$cold" >&2
  done
  exit 1
}

# ---- install once, through the fpm row ----
start_row fpm "$COUNT"
wp_install "$(url fpm)"
stop_rows

# ---- memory: each row alone, at each count ----
mem=$s/mem.tsv
: > "$mem"
for n in $MEM_COUNTS; do
  for r in $ROW_NAMES; do
    start_row "$r" "$n"
    st=$(front "$r")
    [ "$st" = ok ] || { echo "$r: the front page answered $st" >&2; tail -n 20 "$s"/log/*.log >&2; exit 1; }
    warm "$r" "$n"
    sleep 0.5
    read -r kib procs < <(pss "$r")
    printf '%s\t%s\t%s\t%s\n' "$r" "$n" "$kib" "$procs" >> "$mem"
    printf '%s N=%s: %s processes, PSS %s KiB\n' "$r" "$n" "$procs" "$kib" >&2
    stop_rows
  done
done

# ---- speed: the rows together at COUNT, interleaved ----
for r in $ROW_NAMES; do start_row "$r" "$COUNT"; done
for r in $ROW_NAMES; do
  st=$(front "$r")
  [ "$st" = ok ] || { echo "$r: the front page answered $st" >&2; tail -n 20 "$s"/log/*.log >&2; exit 1; }
done
res=$s/results.tsv
: > "$res"
for c in $LEVELS; do
  for r in $ROW_NAMES; do
    wrk -t1 -c"$c" -d2s --timeout 10s -H "Host: $host" "$(url "$r")" > /dev/null 2>&1 # warm-up, unrecorded
  done
  for round in $(seq "$ROUNDS"); do
    for r in $ROW_NAMES; do
      out=$(wrk -t1 -c"$c" -d"${SECS}s" --timeout 10s --latency -H "Host: $host" "$(url "$r")" 2>&1)
      reqs=$(awk '/requests in/ {print $1}' <<< "$out")
      p99=$(awk '$1 == "99%" {print $2}' <<< "$out")
      read -r errs touts < <(wrk_errors <<< "$out")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$r" "$round" "${reqs:-0}" "${p99:--}" "$errs" "$touts" >> "$res"
      printf '%s c=%s round %s: %s requests, p99 %s, %s errors, %s timeouts\n' "$r" "$c" "$round" "$reqs" "$p99" "$errs" "$touts" >&2
    done
  done
done
stop_rows

report() {
  echo "nginx (1 worker, conf/nginx/wordpress.conf with only its placeholders replaced) in front of each row;"
  echo "Debian's WordPress $(dpkg-query -W -f='${Version}' wordpress) on MariaDB, $(php-cgi -v | head -n 1 | cut -d' ' -f1-2), the front page."
  echo "Rows: \`fpm\` = php-fpm8.2, pm = static (master + N children); \`direct\` = a corral direct pool of N php-cgi"
  echo "(accept = \"direct\", static); $kids_why"
  echo
  echo "PSS: each row alone, summed Pss (smaps_rollup) of its PHP processes after wrk -c 2N for ${WARM} s on the front page"
  echo "(repeated until every serving process had run 100 ms of CPU);"
  echo "php-fpm's master and php-cgi's parent are counted, nginx, corral and MariaDB are not."
  echo "Speed: the rows at N = $COUNT, wrk -t1 --latency -d${SECS}s, $ROUNDS round(s) interleaved per level after a 2 s"
  echo "warm-up, requests of the rounds pooled; p99 one per round. errors: wrk's connect, read and write errors and"
  echo "non-2xx/3xx answers; timeouts (10 s) apart. A row with either is **invalid** and no ratio uses it."
  echo
  python3 - "$mem" "$res" "$SECS" "$kids" << 'PY'
import sys
mem, res, secs, kids = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
m = {}
for line in open(mem):
    r, n, kib, procs = line.split()
    m[(r, int(n))] = (int(kib), int(procs))
print("| row | N | PHP processes | PSS MiB | MiB per PHP worker | / fpm |")
print("|---|---:|---:|---:|---:|---:|")
for (r, n), (kib, procs) in m.items():
    base = m.get(("fpm", n))
    ratio = f"{kib / base[0]:.2f}" if base and r != "fpm" else "—"
    print(f"| {r} | {n} | {procs} | {kib / 1024:.1f} | {kib / 1024 / n:.1f} | {ratio} |")
print()
rows = {}
for line in open(res):
    c, r, _round, reqs, p99, errs, touts = line.rstrip("\n").split("\t")
    x = rows.setdefault((int(c), r), dict(n=0, runs=0, p99=[], e=0, t=0))
    x["n"] += int(reqs); x["runs"] += 1; x["p99"].append(p99); x["e"] += int(errs); x["t"] += int(touts)
def valid(k):
    x = rows.get(k)
    return x is not None and x["n"] > 0 and x["e"] == 0 and x["t"] == 0
def rps(k):
    x = rows[k]
    return x["n"] / (x["runs"] * secs)
print("| row | c | req/s | / fpm | p99 | errors | timeouts | valid |")
print("|---|---:|---:|---:|---|---:|---:|---|")
for (c, r), x in rows.items():
    ratio = "—"
    if r != "fpm" and valid((c, r)) and valid((c, "fpm")):
        ratio = f"{rps((c, r)) / rps((c, 'fpm')):.2f}"
    print(f"| {r} | {c} | {rps((c, r)):.1f} | {ratio} | {' '.join(x['p99'])} | {x['e']} | {x['t']} | "
          f"{'ok' if valid((c, r)) else '**invalid**'} |")
print()
print("Issue 23's WordPress targets, from this run:")
print()
for c in sorted({c for c, _ in rows}):
    for r in (kids, "direct"):
        a, b = (c, r), (c, "fpm")
        if a not in rows or b not in rows:
            continue
        if valid(a) and valid(b):
            q = rps(a) / rps(b)
            goal = f" (target ≥ 0.98: {'met' if q >= 0.98 else 'missed'})" if r == kids else " (no target: for comparison)"
            print(f"- c={c}: front page, {r} / fpm = **{q:.2f}**{goal}")
        else:
            print(f"- c={c}: front page, {r} / fpm = — (a row is invalid)")
for n in sorted({n for _, n in m}):
    for r in (kids, "direct"):
        if (r, n) in m and ("fpm", n) in m:
            q = m[(r, n)][0] / m[("fpm", n)][0]
            goal = " (target ≤ 1.00: " + ("met" if q <= 1.0 else "missed") + ")" if r == kids else " (no target: for comparison)"
            print(f"- N={n}: PSS, {r} / fpm = **{q:.2f}**{goal}")
PY
}
report > "$s/report.md"
cat "$s/report.md"
results_write wordpress-direct "WordPress behind nginx: php-fpm against a corral direct pool and php_children" "$s/report.md"
