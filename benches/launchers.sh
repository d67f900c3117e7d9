#!/usr/bin/env bash
# Question: do corral's embedded Rack and WSGI launchers serve a hello-world app as fast as
# the servers people would otherwise deploy (issue 12's targets: Rack >= 1.0x Passenger
# standalone, WSGI >= 0.8x nginx -> uWSGI), and what does each cost in CPU per request?
# Prints a Markdown table (req/s, p50, p99, CPU us per request summed over every process of
# the target, and that sum split between the server's processes and the app's: corral or
# nginx or gunicorn's master against the workers, preloader and uWSGI; Passenger's core and
# watchdog against its RubyApp and AppPreloader) to stdout; with OUT=benches/RESULTS.md it
# also replaces (or appends) the section between `<!-- launchers.sh -->` markers there,
# which benches/compare.sh keeps.
#
#   rack   P  passenger start --engine builtin, 2 app processes (smart spawning)
#          C  corral(http) -> Rack launcher, 2 workers (preload = true)
#   wsgi   U  nginx (1 worker) -> uWSGI (uwsgi protocol, 2 processes, --master)
#          G  gunicorn, 2 sync workers
#          C  corral(http) -> WSGI launcher, 2 workers (preload = true)
#
# Every load is wrk -t1 -c25 for $DUR after an unrecorded $WARM, targets interleaved per
# round. Loopback and unix sockets in a scratch folder; every process it starts it stops.
# Needs: passenger, uwsgi + uwsgi-plugin-python3, gunicorn, nginx, wrk, ruby, python3, root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
CORRAL=$(realpath "$CORRAL")
DUR=${DUR:-10s}
WARM=${WARM:-2s}
ROUNDS=${ROUNDS:-2}
CONNS=${CONNS:-25}

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

# Passenger standalone, builtin engine (no nginx of its own to build).
port=$(free_port)
(cd "$scratch/app" && exec passenger start --engine builtin --address 127.0.0.1 -p "$port" \
  --max-pool-size 2 --min-instances 2 -e production --disable-security-update-check \
  --log-file "$scratch/log/passenger.log" --pid-file "$scratch/run/passenger.pid" \
  > "$scratch/log/passenger.out" 2>&1) & pids+=($!)
root_passenger=$!; port_passenger=$port
wait_http "http://127.0.0.1:$port/"
start_corral corral_rack 'app = "rack:config.ru"'

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
start_corral corral_wsgi 'app = "wsgi:hello:application"'

# name, port, root pids of the processes whose CPU is counted
targets=(
  "rack|Passenger 6.0 standalone (builtin engine), 2 processes|passenger|$root_passenger"
  "rack|corral → Rack launcher, 2 workers, preload|corral_rack|$root_corral_rack"
  "wsgi|nginx → uWSGI 2.0, 2 processes|uwsgi|$root_nginx $root_uwsgi"
  "wsgi|gunicorn 20.1, 2 sync workers|gunicorn|$root_gunicorn"
  "wsgi|corral → WSGI launcher, 2 workers, preload|corral_wsgi|$root_corral_wsgi"
)

report=$scratch/report.md
exec 3>&1 1>"$report"
declare -A reqs secs cpu appcpu p50 p99
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
    errors=$(awk '/Non-2xx|Socket errors/' <<< "$out")
    [ -z "$errors" ] || echo "$key round $round: $errors" >&2
    reqs[$key]=$(( ${reqs[$key]:-0} + n ))
    secs[$key]=$(awk -v a="${secs[$key]:-0}" -v b="$s" 'BEGIN {print a + b}')
    cpu[$key]=$(( ${cpu[$key]:-0} + after - before ))
    appcpu[$key]=$(( ${appcpu[$key]:-0} + app_after - app_before ))
    p50[$key]="${p50[$key]:-} $(awk '$1 == "50%" {print $2}' <<< "$out")"
    p99[$key]="${p99[$key]:-} $(awk '$1 == "99%" {print $2}' <<< "$out")"
    echo "round $round $key: $n requests in ${s}s" >&2
  done
done

echo "| app | target | req/s | p50 (each round) | p99 (each round) | CPU µs/request (all its processes) | server's processes | app's processes |"
echo "| --- | --- | ---: | --- | --- | ---: | ---: | ---: |"
for t in "${targets[@]}"; do
  IFS='|' read -r app name key _ <<< "$t"
  rps=$(awk -v n="${reqs[$key]}" -v s="${secs[$key]}" 'BEGIN {printf "%.0f", n / s}')
  us=$(awk -v c="${cpu[$key]}" -v n="${reqs[$key]}" -v hz="$hz" 'BEGIN {printf "%.0f", c / hz * 1e6 / n}')
  app_us=$(awk -v c="${appcpu[$key]}" -v n="${reqs[$key]}" -v hz="$hz" 'BEGIN {printf "%.0f", c / hz * 1e6 / n}')
  server_us=$(awk -v c="$((cpu[$key] - appcpu[$key]))" -v n="${reqs[$key]}" -v hz="$hz" 'BEGIN {printf "%.0f", c / hz * 1e6 / n}')
  echo "| $app | $name | $rps |${p50[$key]} |${p99[$key]} | $us | $server_us | $app_us |"
done
ratio() { awk -v a="${reqs[$1]}" -v sa="${secs[$1]}" -v b="${reqs[$2]}" -v sb="${secs[$2]}" 'BEGIN {printf "%.2f", (a / sa) / (b / sb)}'; }
target() { # $1 ratio, $2 target
  awk -v r="$1" -v t="$2" 'BEGIN { if (r >= t) print "met"; else printf "missed: %.0f %% short of it", (1 - r / t) * 100 }'
}
echo
r=$(ratio corral_rack passenger)
echo "- Rack: corral / Passenger standalone = **${r}×** (issue 12's target ≥ 1.0×: $(target "$r" 1.0))."
r=$(ratio corral_wsgi uwsgi)
echo "- WSGI: corral / nginx → uWSGI = **${r}×** (target ≥ 0.8×: $(target "$r" 0.8)); corral / gunicorn = $(ratio corral_wsgi gunicorn)×."
echo
echo "wrk -t1 -c$CONNS -d$DUR, $ROUNDS rounds interleaved after ${WARM} warm-ups; corral $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src 2>/dev/null || echo ' + uncommitted changes'); $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
exec 1>&3
cat "$report"
if [ -n "${OUT:-}" ]; then
  python3 - "$OUT" "$report" <<'PY'
import re, sys
out, report = sys.argv[1], sys.argv[2]
table = open(report).read().strip()
block = "<!-- launchers.sh -->\n## Launchers: Rack and WSGI hello world beside Passenger, uWSGI, gunicorn\n\nGenerated by `benches/launchers.sh`; kept by `benches/compare.sh`.\n\n" + table + "\n<!-- /launchers.sh -->"
try:
    text = open(out).read()
except FileNotFoundError:
    text = ""
pattern = re.compile(r"<!-- launchers.sh -->.*?<!-- /launchers.sh -->", re.S)
text = pattern.sub(lambda m: block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block + "\n"
open(out, "w").write(text)
PY
fi
