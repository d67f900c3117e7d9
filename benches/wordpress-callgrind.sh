#!/usr/bin/env bash
# Question: does the PHP process do the same work for WordPress's front page whichever server
# hands it the request? wrk's req/s on WordPress moves by ±10% from run to run on this machine,
# more than the gaps issue 19 (gateway) and issue 23 (direct pool) ask about; instructions do
# not. Each row is one PHP process serving the front page behind nginx (or corral's http
# listener), that process under `valgrind --tool=callgrind`; `ab -c1` sends N1 then, in a
# second run, N2 requests after the same warm-up; (total of N2 - total of N1) / (N2 - N1) is
# the count per request (start-up, warm-up and shutdown cancel out). nginx, corral and
# MariaDB are not counted: the question is whether PHP is handed a request that costs it more.
#
# Rows (one serving PHP process each; the fixture is benches/lib/wordpress.sh's):
#   fpm      nginx -> php-fpm8.2 (pm = static, 1 child; the child is measured)
#   cgi      nginx -> php-cgi -b SOCKET, PHP_FCGI_CHILDREN = 1 (the child is measured)
#   direct   nginx -> a corral direct pool, php_children = 1 (issue 23's row; the child)
#   gw-fcgi  nginx -> corral's fastcgi listener -> corral's php-cgi pool (max = 1)
#   gw-http  corral's http listener -> the same pool
# It also prints each row's front page size and the system calls of the PHP process per
# request (strace -c -f on the serving process, a run of its own), since a different page or
# extra stat/open calls would be real work.
#
#   bash benches/wordpress-callgrind.sh
#   ROWS="fpm direct" N1=3 N2=8 OUT= bash benches/wordpress-callgrind.sh    # a quick look
# Env: ROWS (all five), N1 (5), N2 (25), WARM (5 requests), CORRAL (release build), OUT_DIR
# (where the profiles of the N2 runs are left as callgrind.out.wp-ROW, default /tmp), OUT
# (benches/lib/results.sh; section wordpress-callgrind). Needs root, valgrind, strace, ab,
# mariadb-server, wordpress, nginx, php-cgi, php-fpm8.2.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/wordpress.sh
RESULTS_VARS="ROWS N1 N2 WARM CORRAL OUT_DIR"
results_start "$@"
ROWS=${ROWS:-fpm cgi direct gw-fcgi gw-http}
N1=${N1:-5}
N2=${N2:-25}
WARM=${WARM:-5}
out_dir=${OUT_DIR:-/tmp}
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet -p corral
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL
s=$(mktemp -d /tmp/corral-wpcg.XXXXXX)
chmod 755 "$s"
host="wp-cg-$$.corral.test"
WP_TITLE="WP Callgrind Bench"
trap wp_cleanup EXIT

declare -A port sock
port[fpm]=18841; sock[fpm]=$s/run/fpm.sock
port[cgi]=18842; sock[cgi]=$s/run/cgi.sock
port[direct]=18843; sock[direct]=$s/run/direct.sock
port[gw-fcgi]=18844; sock[gw-fcgi]=$s/run/gw.sock
port[gw-http]=18845
wp_database
wp_nginx fpm cgi direct gw-fcgi
mkdir -p "$s/cg"
chmod 777 "$s/cg"   # the PHP processes run as www-data

corral_conf() { # ROW PROGRAM: the corral of ROW, its pool's command PROGRAM
  local php="command = [\"$2\"]"
  cat << CONF
[server]
runtime_dir = "$s/corral/$1.d"
user = "www-data"
group = "www-data"
log_level = "warn"
CONF
  if [ "$1" = direct ]; then
    cat << CONF
[[listen]]
address = "unix:${sock[direct]}"
protocol = "fastcgi"
mode = "0666"
[pools.php]
$php
accept = "direct"
listener = "unix:${sock[direct]}"
mode = "static"
max = 1
php_children = 1
start_timeout = "120s"
CONF
    return
  fi
  cat << CONF
[[listen]]
address = "127.0.0.1:${port[gw-http]}"
protocol = "http"
[[listen]]
address = "unix:${sock[gw-fcgi]}"
protocol = "fastcgi"
mode = "0666"
[pools.php]
$php
mode = "static"
max = 1
start_timeout = "120s"
request_timeout = "600s"
CONF
  wp_corral_contexts "unix:${sock[gw-fcgi]}"
}

declare -A root_pid
start_row() { # ROW TOOL...: the row's PHP server, its PHP processes run under TOOL (may be empty)
  local r=$1; shift
  local tool=("$@") program
  case $r in
    fpm)
      rm -f "${sock[fpm]}"
      wp_fpm 1 ${tool[@]+"${tool[@]}"} > "$s/log/fpm-run.log" 2>&1
      root_pid[fpm]=$!
      wait_sock "${sock[fpm]}" ;;
    cgi)
      rm -f "${sock[cgi]}"
      PHP_FCGI_CHILDREN=1 PHP_FCGI_MAX_REQUESTS=0 setpriv --reuid=www-data --regid=www-data \
        --init-groups "${tool[@]}" php-cgi -b "${sock[cgi]}" > "$s/log/cgi.log" 2>&1 & row_pids+=($!)
      root_pid[cgi]=$!
      wait_sock "${sock[cgi]}" ;;
    direct | gw-fcgi | gw-http)
      local c=gw; [ "$r" = direct ] && c=direct
      rm -f "$s/run/$c.sock"
      # A script of its own in front of php-cgi: corral puts `-d cgi.fix_pathinfo=0` right
      # after a direct pool's program name, where valgrind would read it as its own option.
      program=$(command -v php-cgi)
      if [ "${#tool[@]}" -gt 0 ]; then
        program=$s/php-cgi-under-tool
        printf '#!/bin/sh\nexec %s %s "$@"\n' "${tool[*]}" "$(command -v php-cgi)" > "$program"
        chmod 755 "$program"
      fi
      corral_conf "$c" "$program" > "$s/$c.toml"
      "$CORRAL" run -c "$s/$c.toml" >> "$s/log/corral-$c.log" 2>&1 & row_pids+=($!)
      root_pid[$r]=$!
      wait_sock "$s/run/$c.sock" ;;
  esac
}
url() { echo "http://127.0.0.1:${port[$1]}/"; }
php_root() { # ROW: the PHP processes' root(s)
  case $1 in fpm | cgi) echo "${root_pid[$1]}" ;; *) children "${root_pid[$1]}" ;; esac
}
serving() { # ROW: the one PHP process with no children (the one that serves)
  local p k leaves=()
  for k in $(php_root "$1"); do
    for p in $(tree "$k"); do [ -n "$(children "$p")" ] || leaves+=("$p"); done
  done
  [ "${#leaves[@]}" = 1 ] || { echo "$1: ${#leaves[@]} serving PHP processes (${leaves[*]}), expected 1" >&2; exit 1; }
  echo "${leaves[0]}"
}
stop_row() { # ROW: stops it and waits for every PHP process (valgrind writes its profile at exit)
  local left=() k
  for k in $(php_root "$1"); do mapfile -t -O "${#left[@]}" left < <(tree "$k"); done
  wp_stop_rows "$1" 1200 ${left[@]+"${left[@]}"}
}
ready() { # ROW: waits (under valgrind, a while) for a 200 front page
  local st
  for _ in $(seq 600); do
    st=$(wp_front "$(url "$1")")
    [ "$st" = ok ] && return 0
    sleep 0.2
  done
  echo "$1: the front page answered $st" >&2; tail -n 20 "$s"/log/*.log >&2; exit 1
}
requests() { # ROW N: N front pages at c=1, every one a 200
  ab -q -n "$2" -c 1 -H "Host: $host" "$(url "$1")" > "$s/ab.txt"
  grep -q '^Failed requests: *0$' "$s/ab.txt" && ! grep -q '^Non-2xx responses' "$s/ab.txt" \
    || { echo "$1: failed or non-2xx requests" >&2; cat "$s/ab.txt" >&2; exit 1; }
}

# measure ROW N -> the callgrind total (Ir) of the row's serving PHP process after WARM + N requests
measure() {
  local r=$1 n=$2 pid f
  rm -f "$s"/cg/*
  start_row "$r" valgrind --tool=callgrind "--callgrind-out-file=$s/cg/cg.%p.out"
  ready "$r"
  requests "$r" "$WARM"
  requests "$r" "$n"
  pid=$(serving "$r")
  # The serving process first, alone: its server's own stop may kill it (SIGKILL after a
  # grace) before valgrind has written the profile.
  kill -TERM "$pid"
  for _ in $(seq 1200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
  stop_row "$r"
  f=$s/cg/cg.$pid.out
  grep -q '^summary:' "$f" 2>/dev/null || { echo "$r: no profile for $pid" >&2; ls "$s/cg" >&2; exit 1; }
  cp "$f" "$out_dir/callgrind.out.wp-$r"
  awk '/^summary:/ {print $2}' "$f"
}

# syscalls ROW -> "PAGE-BYTES SYSCALLS-PER-REQUEST" (strace -c -f on the serving process, 50 requests)
syscalls() {
  local r=$1 pid tr bytes
  start_row "$r"
  ready "$r"
  requests "$r" 20
  bytes=$(curl -s -H "Host: $host" "$(url "$r")" | wc -c)
  pid=$(serving "$r")
  strace -c -f -p "$pid" -o "$s/strace.txt" & tr=$!
  sleep 1
  requests "$r" 50
  kill -INT "$tr"; wait "$tr" || true
  stop_row "$r"
  echo "$bytes $(awk '$NF == "total" {print $(NF-1) / 50}' "$s/strace.txt")"
}

# ---- install through php-fpm (no valgrind) ----
start_row fpm
wp_install "$(url fpm)"
stop_row fpm

res=$s/results.tsv
: > "$res"
for r in $ROWS; do
  a=$(measure "$r" "$N1")
  b=$(measure "$r" "$N2")
  read -r bytes sc < <(syscalls "$r")
  per=$(awk -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" 'BEGIN { printf "%.0f", (b - a) / (n2 - n1) }')
  printf '%s\t%s\t%s\t%s\n' "$r" "$per" "$bytes" "$sc" >> "$res"
  printf '%s: %s instructions per request, page %s bytes, %s syscalls per request\n' "$r" "$per" "$bytes" "$sc" >&2
done

report=$s/report.md
python3 - "$res" "$N1" "$N2" "$WARM" > "$report" << 'PY'
import sys
res, n1, n2, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = [l.rstrip("\n").split("\t") for l in open(res) if l.strip()]
ref = {r[0]: float(r[1]) for r in rows}
print(f"WordPress 6.1's front page, ab -c1; one PHP process per row under valgrind --tool=callgrind;")
print(f"each count is (the run of {n2} requests - the run of {n1}) / {n2 - n1}, both after {warm} warm-up requests")
print("(OPcache filled). System calls: strace -c -f on the serving process over 50 requests (not under valgrind).")
print()
print("| row | PHP instructions per request | / fpm | / cgi | page bytes | PHP syscalls per request |")
print("|---|---:|---:|---:|---:|---:|")
for r, per, b, sc in rows:
    per = float(per)
    vs = lambda k: f"{per / ref[k]:.3f}" if k in ref and k != r else "—"
    print(f"| {r} | {per / 1e6:.2f}M | {vs('fpm')} | {vs('cgi')} | {b} | {float(sc):.1f} |")
PY
cat "$report"
results_write wordpress-callgrind "WordPress: the PHP process's instructions per front page, by server" "$report"
