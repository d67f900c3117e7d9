#!/usr/bin/env bash
# Question: do corral's embedded Rack and WSGI launchers serve a hello-world app as fast as
# the servers people would otherwise deploy (issue 21's targets at c=25: Rack >= 1.0x
# Passenger standalone and >= 0.8x Puma; WSGI with the pure-Python launcher >= 0.7x
# nginx -> uWSGI; >= 0.5x Granian is the native worker's target, recorded here too), and
# what does each cost in CPU per request?
# Prints a Markdown table (req/s, p50, p99, CPU us per request summed over every process of
# the target, and that sum split between the server's processes and the app's: corral or
# nginx or the master of gunicorn, Puma and Granian against the workers, preloader and
# uWSGI; Passenger's core and watchdog against its RubyApp and AppPreloader; Puma and
# Granian parse HTTP in their workers, so their workers' share includes it), and the summed
# PSS of those processes after the runs, to stdout, and writes it as the `launchers` section
# of OUT (default benches/RESULTS.md; OUT= prints only; benches/lib/results.sh). wrk's
# socket errors, non-2xx answers and timeouts are counted per target; a target with any is
# marked invalid and no ratio is computed from it.
#
#   rack   P  passenger start --engine builtin, 2 app processes (smart spawning)
#          M  Puma (Debian's), -w 2 -t 1:1, direct HTTP
#          C  corral(http) -> Rack launcher, 2 workers (preload = true), its defaults (on
#             Ruby 3.1 and 3.2 without YJIT, as Passenger and Puma run Ruby)
#          J  the same with CORRAL_RACK_YJIT=on (YJIT with its 1 MiB area)
#   wsgi   U  nginx (1 worker) -> uWSGI (uwsgi protocol, 2 processes, --master)
#          G  gunicorn, 2 sync workers
#          R  Granian (PyPI, $GRANIAN), --workers 2 --blocking-threads 1, direct HTTP
#          C  corral(http) -> WSGI launcher, 2 workers (preload = true)
#          N  corral(http) -> native WSGI worker (workers/wsgi, $WSGI_WORKER), 2 workers (preload)
# Every Python row runs Debian's /usr/bin/python3 (uWSGI's plugin embeds it; corral's pool
# names it; scripts/setup-peers.sh puts Granian in a venv of it), every Ruby row Debian's
# ruby.
#
# Every load is wrk -t1 -c25 for $DUR after an unrecorded $WARM, targets interleaved per
# round. APPS=rack (or APPS=wsgi) starts and measures only that app's rows and writes them
# as the section `launchers-rack` (`launchers-wsgi`), leaving the full table alone; the
# default, APPS="rack wsgi", writes `launchers`. Loopback and unix sockets in a scratch folder; every process it starts it stops.
# Needs: passenger, puma, uwsgi + uwsgi-plugin-python3, gunicorn, granian, nginx, wrk,
# ruby, python3, root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="APPS DUR WARM ROUNDS CONNS CORRAL GRANIAN WSGI_WORKER"
results_start "$@"
# Defaulted after results_start, so the recorded command shows APPS only when it was set.
APPS=${APPS:-rack wsgi}
has() { [[ " $APPS " == *" $1 "* ]]; }
has rack || has wsgi || { echo "APPS=$APPS names neither rack nor wsgi" >&2; exit 2; }
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
CORRAL=$(realpath "$CORRAL")
# The native WSGI worker: beside corral, where corral looks for it first.
if has wsgi; then
  if [ -z "${WSGI_WORKER:-}" ]; then
    WSGI_WORKER=$(dirname "$CORRAL")/corral-wsgi-worker
    [ -x "$WSGI_WORKER" ] || cargo build --release --quiet -p corral-wsgi-worker
  fi
  WSGI_WORKER=$(realpath "$WSGI_WORKER")
fi
RESULTS_BINARY=$CORRAL
DUR=${DUR:-10s}
WARM=${WARM:-2s}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-25}
GRANIAN=${GRANIAN:-/var/cache/corral/granian/bin/granian}

scratch=$(mktemp -d /tmp/corral-launchers.XXXXXX)
chmod 755 "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
mkdir -p "$scratch/app" "$scratch/run" "$scratch/log"
cat > "$scratch/app/config.ru" <<'EOF'
run ->(env) { [200, { "content-type" => "text/plain" }, ["Hello World"]] }
EOF
cat > "$scratch/app/hello.py" <<'EOF'
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"Hello World"]
EOF
chmod -R a+rX "$scratch/app"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
  for _ in $(seq 600); do
    [ "$(curl -s -m 2 "$1" 2>/dev/null || true)" = "Hello World" ] && return 0
    sleep 0.1
  done
  echo "no hello from $1; the logs:" >&2
  tail -n 20 "$scratch"/log/* >&2
  exit 1
}
descendants() { # $1 and all its live descendants
  echo "$1"
  local s line rest state ppid p
  for s in /proc/[0-9]*/stat; do
    { read -r line < "$s"; } 2>/dev/null || continue
    rest=${line##*) }
    read -r state ppid _ <<< "$rest"
    if [ "$ppid" = "$1" ] && [ "$state" != Z ]; then p=${s#/proc/}; descendants "${p%/stat}"; fi
  done
}
ticks() { # summed utime+stime (clock ticks) of the given pids
  local total=0 line rest f
  for p in "$@"; do
    { read -r line < "/proc/$p/stat"; } 2>/dev/null || continue
    rest=${line##*) }
    read -r -a f <<< "$rest"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)
pss_kib() { # summed Pss (KiB) of the given pids
  local total=0 v p
  for p in "$@"; do
    v=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || true)
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

# ---- the targets ----
start_corral() { # $1 name, $2 pool text; sets port
  port=$(free_port)
  cat > "$scratch/$1.toml" <<EOF
[server]
runtime_dir = "$scratch/run/$1"
log_level = "warn"
[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[pools.app]
$2
cwd = "$scratch/app"
mode = "static"
min = 2
max = 2
[[contexts]]
pool = "app"
EOF
  "$CORRAL" run -c "$scratch/$1.toml" > "$scratch/log/$1.out" 2>&1 & pids+=($!)
  eval "root_$1=$!; port_$1=$port"
  wait_http "http://127.0.0.1:$port/"
}

targets=()   # app|name|key|root pids of the processes whose CPU is counted
if has rack; then
  # Passenger standalone, builtin engine (no nginx of its own to build).
  port=$(free_port)
  (cd "$scratch/app" && exec passenger start --engine builtin --address 127.0.0.1 -p "$port" \
    --max-pool-size 2 --min-instances 2 -e production --disable-security-update-check \
    --log-file "$scratch/log/passenger.log" --pid-file "$scratch/run/passenger.pid" \
    > "$scratch/log/passenger.out" 2>&1) & pids+=($!)
  root_passenger=$!; port_passenger=$port
  wait_http "http://127.0.0.1:$port/"
  start_corral corral_rack 'app = "rack:config.ru"'
  # YJIT, which the launcher leaves off on Ruby 3.1 and 3.2 unless asked (docs/decisions.md, 34).
  start_corral corral_rack_jit 'app = "rack:config.ru"
  env = { CORRAL_RACK_YJIT = "on" }'
  # Puma: two workers of one thread each, as the issue states it.
  port=$(free_port)
  (cd "$scratch/app" && exec puma -w 2 -t 1:1 -b "tcp://127.0.0.1:$port" -e production \
    config.ru > "$scratch/log/puma.out" 2>&1) & pids+=($!)
  root_puma=$!; port_puma=$port
  wait_http "http://127.0.0.1:$port/"
  targets+=(
    "rack|Passenger 6.0 standalone (builtin engine), 2 processes|passenger|$root_passenger"
    "rack|Puma 5.6, -w 2 -t 1:1, direct|puma|$root_puma"
    "rack|corral → Rack launcher, 2 workers, preload|corral_rack|$root_corral_rack"
    "rack|corral → Rack launcher, 2 workers, preload, CORRAL_RACK_YJIT=on|corral_rack_jit|$root_corral_rack_jit"
  )
fi

if has wsgi; then
  # nginx -> uWSGI over a unix socket (bound after uWSGI drops to nobody).
  mkdir -m 1777 "$scratch/uwsgi"
  uwsgi --plugin python3 --master --die-on-term --processes 2 --socket "$scratch/uwsgi/uwsgi.sock" --chmod-socket=666 \
    --chdir "$scratch/app" --wsgi-file hello.py --disable-logging --uid nobody --gid nogroup \
    > "$scratch/log/uwsgi.out" 2>&1 & pids+=($!)
  root_uwsgi=$!
  port=$(free_port)
  cat > "$scratch/nginx.conf" <<EOF
worker_processes 1;
pid $scratch/run/nginx.pid;
error_log $scratch/log/nginx.err warn;
events { worker_connections 1024; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$port;
    location / { include /etc/nginx/uwsgi_params; uwsgi_pass unix:$scratch/uwsgi/uwsgi.sock; }
  }
}
EOF
  nginx -c "$scratch/nginx.conf" -g 'daemon off;' & pids+=($!)
  root_nginx=$!; port_uwsgi=$port
  wait_http "http://127.0.0.1:$port/"
  port=$(free_port)
  (cd "$scratch/app" && exec gunicorn -w 2 -b "127.0.0.1:$port" --user nobody --group nogroup \
    hello:application > "$scratch/log/gunicorn.out" 2>&1) & pids+=($!)
  root_gunicorn=$!; port_gunicorn=$port
  wait_http "http://127.0.0.1:$port/"
  port=$(free_port)
  (cd "$scratch/app" && exec "$GRANIAN" --interface wsgi --workers 2 --blocking-threads 1 \
    --host 127.0.0.1 --port "$port" --no-access-log hello:application \
    > "$scratch/log/granian.out" 2>&1) & pids+=($!)
  root_granian=$!; port_granian=$port
  wait_http "http://127.0.0.1:$port/"
  start_corral corral_wsgi 'app = "wsgi:hello:application"
  python = "/usr/bin/python3"'
  start_corral corral_wsgi_native "app = \"wsgi:hello:application\"
  worker = \"native\"
  worker_path = \"$WSGI_WORKER\"
  python = \"/usr/bin/python3\""
  targets+=(
    "wsgi|nginx → uWSGI 2.0, 2 processes|uwsgi|$root_nginx $root_uwsgi"
    "wsgi|gunicorn 20.1, 2 sync workers|gunicorn|$root_gunicorn"
    "wsgi|$("$GRANIAN" --version), --workers 2 --blocking-threads 1, direct|granian|$root_granian"
    "wsgi|corral → WSGI launcher, 2 workers, preload|corral_wsgi|$root_corral_wsgi"
    "wsgi|corral → native WSGI worker, 2 workers, preload|corral_wsgi_native|$root_corral_wsgi_native"
  )
fi

report=$scratch/report.md
exec 3>&1 1>"$report"
declare -A reqs secs cpu appcpu p50 p99 errs touts pss
for round in $(seq "$ROUNDS"); do
  for t in "${targets[@]}"; do
    IFS='|' read -r _ _ key roots <<< "$t"
    port_var=port_$key; url="http://127.0.0.1:${!port_var}/"
    wrk -t1 -c"$CONNS" -d"$WARM" "$url" > /dev/null
    all=()
    for r in $roots; do mapfile -t -O "${#all[@]}" all < <(descendants "$r"); done
    # Passenger's watchdog daemonizes its core away from `passenger start`: add every
    # process named Passenger* (its watchdog, core, preloader and app processes).
    [ "$key" != passenger ] || mapfile -t -O "${#all[@]}" all < <(pgrep -f '^Passenger' || true)
    mapfile -t all < <(printf '%s\n' "${all[@]}" | sort -un)   # each process counted once
    # The app's processes: the workers (and preloader) under corral or gunicorn's master,
    # uWSGI's whole tree behind nginx, Passenger's app and preloader processes.
    case $key in
      passenger) mapfile -t app < <(pgrep -f '^Passenger (RubyApp|AppPreloader)' || true) ;;
      uwsgi) mapfile -t app < <(descendants "$root_uwsgi") ;;
      *) mapfile -t app < <(descendants "${roots%% *}" | tail -n +2) ;;
    esac
    before=$(ticks "${all[@]}"); app_before=$(ticks "${app[@]}")
    out=$(wrk -t1 -c"$CONNS" -d"$DUR" --latency "$url")
    after=$(ticks "${all[@]}"); app_after=$(ticks "${app[@]}")
    n=$(awk '/requests in/ {print $1}' <<< "$out")
    s=$(awk '/requests in/ {sub(/s,$/, "", $4); print $4}' <<< "$out")
    read -r we wt < <(wrk_errors <<< "$out")
    errs[$key]=$(( ${errs[$key]:-0} + we )); touts[$key]=$(( ${touts[$key]:-0} + wt ))
    pss[$key]=$(pss_kib "${all[@]}")
    reqs[$key]=$(( ${reqs[$key]:-0} + n ))
    secs[$key]=$(awk -v a="${secs[$key]:-0}" -v b="$s" 'BEGIN {print a + b}')
    cpu[$key]=$(( ${cpu[$key]:-0} + after - before ))
    appcpu[$key]=$(( ${appcpu[$key]:-0} + app_after - app_before ))
    p50[$key]="${p50[$key]:-} $(awk '$1 == "50%" {print $2}' <<< "$out")"
    p99[$key]="${p99[$key]:-} $(awk '$1 == "99%" {print $2}' <<< "$out")"
    echo "round $round $key: $n requests in ${s}s, $we errors, $wt timeouts" >&2
  done
done

echo "wrk -t1 -c$CONNS -d$DUR, $ROUNDS rounds interleaved after ${WARM} warm-ups. CPU from /proc (utime+stime) over the runs;"
echo "PSS: summed \`Pss:\` of /proc/PID/smaps_rollup of the same processes after the last round."
echo "errors: wrk's socket connect, read and write errors and non-2xx/3xx answers; timeouts: its socket timeouts. A target with either is **invalid** and no ratio uses it."
echo
echo "| app | target | req/s | p50 (each round) | p99 (each round) | CPU µs/request (all its processes) | server's processes | app's processes | PSS MiB | errors | timeouts | valid |"
echo "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
valid() { [ "${errs[$1]}" = 0 ] && [ "${touts[$1]}" = 0 ] && [ "${reqs[$1]}" -gt 0 ]; }
for t in "${targets[@]}"; do
  IFS='|' read -r app name key _ <<< "$t"
  rps=$(awk -v n="${reqs[$key]}" -v s="${secs[$key]}" 'BEGIN {printf "%.0f", (s > 0) ? n / s : 0}')
  per() { awk -v c="$1" -v n="${reqs[$key]}" -v hz="$hz" 'BEGIN {if (n > 0) printf "%.0f", c / hz * 1e6 / n; else print "-"}'; }
  us=$(per "${cpu[$key]}"); app_us=$(per "${appcpu[$key]}"); server_us=$(per "$((cpu[$key] - appcpu[$key]))")
  mib=$(awk -v k="${pss[$key]}" 'BEGIN {printf "%.1f", k / 1024}')
  v=ok; valid "$key" || v="**invalid**"
  echo "| $app | $name | $rps |${p50[$key]} |${p99[$key]} | $us | $server_us | $app_us | $mib | ${errs[$key]} | ${touts[$key]} | $v |"
done
ratio() { # $1 / $2 in req/s, or — naming the invalid one
  local k bad=""
  for k in "$1" "$2"; do valid "$k" || bad+="${bad:+; }$k invalid: ${errs[$k]} errors, ${touts[$k]} timeouts"; done
  if [ -n "$bad" ]; then echo "— ($bad)"; return; fi
  awk -v a="${reqs[$1]}" -v sa="${secs[$1]}" -v b="${reqs[$2]}" -v sb="${secs[$2]}" 'BEGIN {printf "%.2f", (a / sa) / (b / sb)}'
}
target() { # $1 ratio, $2 target
  case $1 in —*) echo "not judged"; return ;; esac
  awk -v r="$1" -v t="$2" 'BEGIN { if (r >= t) print "met"; else printf "missed: %.0f %% short of it", (1 - r / t) * 100 }'
}
bold() { case $1 in —*) echo "$1" ;; *) echo "**$1×**" ;; esac; }
echo
if has rack; then
  r=$(ratio corral_rack passenger)
  m=$(ratio corral_rack puma)
  echo "- Rack: corral / Passenger standalone = $(bold "$r") (issue 21's target ≥ 1.0×: $(target "$r" 1.0)); corral / Puma = $(bold "$m") (target ≥ 0.8×: $(target "$m" 0.8))."
  r=$(ratio corral_rack_jit passenger)
  m=$(ratio corral_rack_jit puma)
  echo "- Rack with YJIT (CORRAL_RACK_YJIT=on): corral / Passenger standalone = $(bold "$r") ($(target "$r" 1.0)); corral / Puma = $(bold "$m") ($(target "$m" 0.8))."
fi
if has wsgi; then
  r=$(ratio corral_wsgi uwsgi)
  g=$(ratio corral_wsgi gunicorn)
  n=$(ratio corral_wsgi granian)
  echo "- WSGI, pure-Python launcher: corral / nginx → uWSGI = $(bold "$r") (target ≥ 0.7×: $(target "$r" 0.7)); corral / Granian = $(bold "$n") (≥ 0.5× is the native worker's target: $(target "$n" 0.5)); corral / gunicorn = $(bold "$g")."
  r=$(ratio corral_wsgi_native uwsgi)
  n=$(ratio corral_wsgi_native granian)
  l=$(ratio corral_wsgi_native corral_wsgi)
  echo "- WSGI, native worker: corral / nginx → uWSGI = $(bold "$r") (target ≥ 1.0×: $(target "$r" 1.0)); corral / Granian = $(bold "$n") (target ≥ 0.5×: $(target "$n" 0.5)); native worker / pure-Python launcher = $(bold "$l")."
fi
exec 1>&3
cat "$report"
section=launchers
title="Launchers: Rack and WSGI hello world beside Passenger, Puma, uWSGI, gunicorn, Granian"
if ! has wsgi; then
  section=launchers-rack title="Launchers: Rack hello world beside Passenger and Puma"
elif ! has rack; then
  section=launchers-wsgi title="Launchers: WSGI hello world beside uWSGI, gunicorn, Granian"
fi
results_write "$section" "$title" "$report"
