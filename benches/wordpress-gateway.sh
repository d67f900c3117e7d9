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
#   gw-fcgi    nginx -> corral's fastcgi listener -> corral's php-cgi pool (static, max =
#              COUNT), the corral of conf/wordpress.toml's shape (its http contexts as
#              tests/support/wordpress.rs writes them)
#   gw-http    corral's http listener -> the same pool, same corral (no nginx)
#   gw-*-tN    the same with `threads = N` in corral's [server] (a corral of its own)
#   base-*     the same as gw-* with the corral binary BASE (a before/after in one run),
#              when BASE is set
# The rows run at COUNT together, idle but for the one measured. wrk -t1 --latency -d SECS
# on the front page at each level of LEVELS, the rows interleaved per round (ROUNDS) after a
# 2 s warm-up each; req/s (requests of the rounds pooled), p99 per round (and their median),
# the CPU the front took per request (nginx's worker plus the row's corral, from
# /proc/PID/task/*/schedstat, so gw-http is corral alone and gw-fcgi is nginx plus corral) and wrk's
# errors (a row with errors or timeouts is invalid and no ratio uses it); the ratios against
# fpm and cgi.
#
#   bash benches/wordpress-gateway.sh
#   SECS=2 ROUNDS=1 OUT= bash benches/wordpress-gateway.sh     # a quick look
#   BASE=/path/to/old/corral bash benches/wordpress-gateway.sh  # before and after, one run
# Env: SECS (10), ROUNDS (3), LEVELS ("1 10 50"), COUNT (2), CORRAL (release build), BASE,
# CORRALS (the corrals to run, default "gw gw-t1": gw = corral's defaults, gw-tN = threads = N),
# OUT (default benches/RESULTS.md, section `wordpress-gateway`; OUT= prints only).
# Needs root (a config file under /etc/wordpress; nginx, PHP and corral's workers run as
# www-data, MariaDB as mysql), mariadb-server, wordpress, nginx, php-cgi, php-fpm8.2, wrk.
# Every process it starts it stops.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/wordpress.sh
RESULTS_VARS="SECS ROUNDS LEVELS COUNT CORRAL BASE CORRALS"
results_start "$@"
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-3}
LEVELS=${LEVELS:-1 10 50}
COUNT=${COUNT:-2}
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
ulimit -n 16384 2>/dev/null || true

# The corrals: NAME -> binary and [server] lines.
CORRALS=${CORRALS:-gw gw-t1}
declare -A corral_bin corral_server
for g in $CORRALS; do  # gw: corral's defaults; gw-tN: threads = N
  corral_bin[$g]=$CORRAL
  case $g in
    gw) corral_server[$g]="" ;;
    gw-t[0-9]*) corral_server[$g]="threads = ${g#gw-t}" ;;
    *) echo "unknown corral row $g (gw or gw-tN)" >&2; exit 2 ;;
  esac
done
if [ -n "${BASE:-}" ]; then
  CORRALS+=" base"
  corral_bin[base]=$BASE
  corral_server[base]=""
fi
declare -A port sock
port[fpm]=18821; sock[fpm]=$s/run/fpm.sock
port[cgi]=18822; sock[cgi]=$s/run/cgi.sock
NGINX_ROWS="fpm cgi"
ROW_NAMES="fpm cgi"
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
max = $COUNT

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
listen = "unix:${sock[$2]}"
root = "/usr/share/wordpress"
pool = "php"
CONF
}

declare -A root_pid   # row -> the process whose tree is its PHP (and, for corral, the front)
wp_fpm "$COUNT"; root_pid[fpm]=$!
wait_sock "${sock[fpm]}"
PHP_FCGI_CHILDREN=$COUNT PHP_FCGI_MAX_REQUESTS=0 setpriv --reuid=www-data --regid=www-data \
  --init-groups php-cgi -b "${sock[cgi]}" > "$s/log/cgi.log" 2>&1 & row_pids+=($!)
root_pid[cgi]=$!
for g in $CORRALS; do
  f=base-fcgi; h=base-http
  [ "$g" = base ] || { f=${g/gw/gw-fcgi}; h=${g/gw/gw-http}; }
  corral_conf "$g" "$f" "$h" > "$s/$g.toml"
  "${corral_bin[$g]}" run -c "$s/$g.toml" >> "$s/log/corral-$g.log" 2>&1 & row_pids+=($!)
  root_pid[$f]=$!; root_pid[$h]=$!
done
for r in $ROW_NAMES; do [ -n "${row_corral[$r]:-}" ] || wait_sock "${sock[$r]}"; done
for g in $CORRALS; do wait_sock "$s/run/$g.sock"; done

url() { echo "http://127.0.0.1:${port[$1]}/"; }
wp_install "$(url fpm)"
for r in $ROW_NAMES; do
  st=$(wp_front "$(url "$r")")
  [ "$st" = ok ] || { echo "$r: the front page answered $st" >&2; tail -n 20 "$s"/log/*.log >&2; exit 1; }
done

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
    *) for k in $(children "${root_pid[$1]}"); do tree "$k"; done ;;
  esac
}

res=$s/results.tsv
: > "$res"
for c in $LEVELS; do
  for r in $ROW_NAMES; do
    wrk -t1 -c"$c" -d2s --timeout 10s -H "Host: $host" "$(url "$r")" > /dev/null 2>&1 # warm-up, unrecorded
  done
  for round in $(seq "$ROUNDS"); do
    for r in $ROW_NAMES; do
      t0=$(front_ns "$r")
      out=$(wrk -t1 -c"$c" -d"${SECS}s" --timeout 10s --latency -H "Host: $host" "$(url "$r")" 2>&1)
      t1=$(front_ns "$r")
      reqs=$(awk '/requests in/ {print $1}' <<< "$out")
      p99=$(awk '$1 == "99%" {print $2}' <<< "$out")
      read -r errs touts < <(wrk_errors <<< "$out")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$r" "$round" "${reqs:-0}" "${p99:--}" "$errs" "$touts" "$((t1 - t0))" "$(cut -d' ' -f1 /proc/loadavg)" >> "$res"
      printf '%s c=%s round %s: %s requests, p99 %s, %s errors, %s timeouts, load %s\n' "$r" "$c" "$round" "$reqs" "$p99" "$errs" "$touts" "$(cut -d' ' -f1 /proc/loadavg)" >&2
    done
  done
done
for r in $ROW_NAMES; do
  for p in $(php_pids "$r"); do
    grep -q opcache.so "/proc/$p/maps" || { echo "$r: PHP process $p has no OPcache loaded" >&2; exit 1; }
  done
done

report() {
  echo "Debian's WordPress $(dpkg-query -W -f='${Version}' wordpress) on MariaDB, $(php-cgi -v | head -n 1 | cut -d' ' -f1-2) with OPcache, the front page;"
  echo "nginx 1 worker (conf/nginx/wordpress.conf, placeholders replaced). $COUNT PHP processes per row:"
  echo "\`fpm\` = nginx → php-fpm8.2 (pm = static); \`cgi\` = nginx → php-cgi -b with PHP_FCGI_CHILDREN=$COUNT;"
  echo "\`gw-fcgi\` = nginx → corral's fastcgi listener → corral's php-cgi pool (static, max = $COUNT); \`gw-http\` = corral's"
  echo "http listener → the same pool; \`-tN\`: \`threads = N\` in corral's [server]; \`base-*\`: the same as \`gw-*\` with the binary BASE."
  echo "wrk -t1 --latency -d${SECS}s, $ROUNDS round(s) interleaved per level after a 2 s warm-up per row; req/s pools the rounds;"
  echo "p99 one per round (ms), and their median; front µs/req = CPU of nginx's worker (nginx rows) plus the row's corral"
  echo "(/proc/PID/task/*/schedstat) over the requests. Load = the 1-minute load average after each run (the range). This machine's"
  echo "2 cores were shared with other builds: compare rows within this run, not with other runs."
  echo
  python3 - "$res" "$SECS" << 'PY'
import statistics, sys
res, secs = sys.argv[1], float(sys.argv[2])
def ms(v):
    for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if v.endswith(unit):
            try:
                return float(v[: -len(unit)]) * f
            except ValueError:
                return None
    return None
rows = {}
for line in open(res):
    c, r, _round, reqs, p99, errs, touts, ns, load = line.rstrip("\n").split("\t")
    x = rows.setdefault((int(c), r), dict(n=0, runs=0, p99=[], e=0, t=0, ns=0, load=[]))
    x["n"] += int(reqs); x["runs"] += 1; x["p99"].append(ms(p99)); x["e"] += int(errs)
    x["t"] += int(touts); x["ns"] += int(ns); x["load"].append(float(load))
def valid(k):
    x = rows.get(k)
    return x is not None and x["n"] > 0 and x["e"] == 0 and x["t"] == 0 and None not in x["p99"]
def rps(k):
    return rows[k]["n"] / (rows[k]["runs"] * secs)
def p99(k):
    return statistics.median(rows[k]["p99"])
def ratio(a, b, f):
    return f"{f(a) / f(b):.2f}" if a != b and valid(a) and valid(b) else "—"
print("| row | c | req/s | / fpm | / cgi | p99 ms per round | p99 median | p99 / fpm | front µs/req | errors | timeouts | load | valid |")
print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|")
for (c, r), x in rows.items():
    us = x["ns"] / 1e3 / x["n"] if x["n"] else 0
    p = " ".join("—" if v is None else f"{v:.0f}" for v in x["p99"])
    med = f"{p99((c, r)):.0f}" if None not in x["p99"] else "—"
    print(f"| {r} | {c} | {rps((c, r)):.1f} | {ratio((c, r), (c, 'fpm'), rps)} | {ratio((c, r), (c, 'cgi'), rps)} | "
          f"{p} | {med} | {ratio((c, r), (c, 'fpm'), p99)} | {us:.0f} | {x['e']} | {x['t']} | "
          f"{min(x['load']):.1f}–{max(x['load']):.1f} | {'ok' if valid((c, r)) else '**invalid**'} |")
print()
print("Issue 19's real-application targets, from this run (req/s ≥ 0.98× cgi and fpm; p99 ≤ fpm's at c ≥ 10):")
print()
gw = sorted({r for _, r in rows if r not in ("fpm", "cgi")})
for c in sorted({c for c, _ in rows}):
    for r in gw:
        a = (c, r)
        if not (valid(a) and valid((c, "cgi")) and valid((c, "fpm"))):
            print(f"- c={c} {r}: — (a row is invalid)")
            continue
        q_cgi, q_fpm = rps(a) / rps((c, "cgi")), rps(a) / rps((c, "fpm"))
        q_p99 = p99(a) / p99((c, "fpm"))
        met = q_cgi >= 0.98 and q_fpm >= 0.98 and (c < 10 or q_p99 <= 1.0)
        tail = f", p99 / fpm {q_p99:.2f}" if c >= 10 else ""
        print(f"- c={c} {r}: / cgi **{q_cgi:.2f}**, / fpm **{q_fpm:.2f}**{tail}: {'met' if met else 'missed'}")
PY
}
report > "$s/report.md"
cat "$s/report.md"
results_write wordpress-gateway "WordPress through corral's gateway against nginx → php-fpm and nginx → php-cgi" "$s/report.md"
