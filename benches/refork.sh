#!/usr/bin/env bash
# Question: how much memory does reforking (`refork_after`, docs/pools.md "Reforking") save
# on a real app, and does a preloaded Rails pool hold no more memory than Passenger's, with
# workers that answer soon after their fork? Issue 21's targets: the summed PSS of 8
# reforked Rails workers <= 0.8x that of 8 workers forked from the preloader alone; Rails
# PSS <= Passenger's; a forked worker's first answer <= 50 ms.
#
#   bash benches/refork.sh          the `refork` section: reforking on and off
#   bash benches/refork.sh peers    the `refork-peers` section: beside Passenger, and the
#                                   fork-to-first-answer times
#
# The apps are the shop of benches/lib/shop_apps.sh: Rails 6.1 (Debian's ruby-rails,
# through the Rack launcher) and Django 3.2 (Debian's python3-django, through the WSGI
# launcher), a few real pages each (templates with a layout and helpers, a form with its
# CSRF token, JSON, a page of partials; production settings, no database). Every pool is
# static and preloaded. A request not answered 200 fails the run. PSS is read from
# /proc/PID/smaps_rollup; it counts each shared page once over the processes sharing it,
# so the sums are comparable between rows and between servers.
#
# refork: with 4 and 8 workers, with and without `refork_after = $REFORK_AFTER`: REQUESTS
# (2,000) requests spread over the pages from as many keep-alive clients as workers, then
# the pool is left to settle (every worker forked from the same template: a refork
# replaces the older workers one at a time), then the PSS of every worker (the processes of
# corral's tree that have no child) and of the whole tree (the preloader and the templates
# too) is summed; then REQUESTS more requests and the same again.
#
# peers (Rails): Passenger 6 standalone (builtin engine, smart spawning: its AppPreloader
# loads the app once and forks the RubyApp processes, as corral's preloader forks its
# workers) with 2, 4 and 8 app processes, and corral's preloaded pool with as many workers,
# with the launcher's defaults (on Ruby 3.1 no YJIT, malloc_trim after a worker's
# collections, no warm-up), with the preloader's opt-in warm-up GETs of / before the fork
# (CORRAL_RACK_WARMUP=30), without the trim (CORRAL_RACK_TRIM=off: the launcher as it was
# before it), with the heap left unsettled before the fork (CORRAL_RACK_SETTLE=off: as
# before the launcher settled it), with CORRAL_RACK_YJIT=on (the default before
# docs/decisions.md, 34) and with refork_after; the same REQUESTS requests over the same
# pages from as many clients as processes (the CPU time the app's processes took for them),
# then the summed PSS of the app's processes once their number is stable: Passenger's AppPreloader and RubyApp processes of this app (found by their
# titles, which name the app's folder; the Passenger core and watchdog are left out as
# corral itself is), corral's preloader and workers (its whole tree but corral). Then, for
# Rails and Django, the fork-to-first-answer: a pool of 2 workers with `max_requests =
# $RECYCLE` serves REQUESTS GETs of one page, its recycled workers replaced by new forks of
# the preloader; corral's log says for each how long from the ask for the fork to its first
# answer (`worker ready`, `ready_ms`: the launcher's readiness probe), the access log how
# long its first real page took (benches/lib/pool_memory.py says exactly what is read).
#
# Prints a Markdown table to stdout and writes it as its section of OUT (default
# benches/RESULTS.md; OUT= prints only; benches/lib/results.sh).
#
#   APPS="rails django"  WORKERS="4 8" (peers: "2 4 8")  REFORK_AFTER="[50, 200]"
#   REQUESTS=2000  RECYCLE=100 (peers: max_requests of the fork-to-first-answer pool)
# Needs: ruby with ruby-rails, python3-django for /usr/bin/python3, passenger (peers),
# root (the workers run as nobody and their smaps_rollup is read).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/shop_apps.sh
RESULTS_VARS="APPS WORKERS REFORK_AFTER REQUESTS RECYCLE CORRAL"
results_start "$@"
MODE=${1:-refork}
case $MODE in
  refork) WORKERS=${WORKERS:-4 8} ;;
  peers) WORKERS=${WORKERS:-2 4 8} ;;
  *) echo "usage: bash benches/refork.sh [refork|peers]" >&2; exit 2 ;;
esac
APPS=${APPS:-rails django}
REFORK_AFTER=${REFORK_AFTER:-[50, 200]}
REQUESTS=${REQUESTS:-2000}
RECYCLE=${RECYCLE:-100}
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet -p corral
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
CORRAL=$(realpath "$CORRAL")
RESULTS_BINARY=$CORRAL

SCRATCH=$(mktemp -d /tmp/corral-refork-bench.XXXXXX)
chmod 755 "$SCRATCH"
CORRAL_PID=
PASSENGER_PIDFILE=
cleanup() {
  stop_corral
  stop_passenger
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

RAILS=$SCRATCH/shop
DJANGO=$SCRATCH/site
write_rails_shop "$RAILS"
write_django_shop "$DJANGO"
SECRET=$(printf 'be%.0s' {1..64})
measure() { python3 benches/lib/pool_memory.py "$@"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_200() { # URL
  for _ in $(seq 600); do
    curl -fs -o /dev/null "$1" && return 0
    sleep 0.2
  done
  echo "no answer from $1" >&2
  return 1
}
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
pages_of() { if [ "$1" = rails ]; then echo "$RAILS_PAGES"; else echo "$DJANGO_PAGES"; fi; }

# Starts corral with one static pool of N workers of APP (rails or django) in $SCRATCH/NAME
# and waits for its first answer; KEYS are more keys of the pool, ENV more entries of the
# Rails pool's env (", KEY = \"VALUE\""), SERVER more keys of [server]. Sets CORRAL_PID,
# port and dir (the log: $dir/log).
start_corral() { # APP N NAME KEYS ENV [SERVER]
  local app=$1 n=$2 keys=$4 env=$5 server=${6:-} pool
  dir=$SCRATCH/$3
  # Traversable: the workers run as nobody and open the launcher corral writes in run/.
  mkdir -p "$dir"; chmod 755 "$dir"
  port=$(free_port)
  if [ "$app" = rails ]; then
    pool="app = \"rack:config.ru\"
cwd = \"$RAILS\"
env = { RAILS_ENV = \"production\", SECRET_KEY_BASE = \"$SECRET\"$env }"
  else
    pool="app = \"wsgi:site_app.wsgi:application\"
python = \"/usr/bin/python3\"
cwd = \"$DJANGO\""
  fi
  cat > "$dir/corral.toml" <<EOF
[server]
runtime_dir = "$dir/run"
kill_timeout = "5s"
$server

[[listen]]
address = "127.0.0.1:$port"
protocol = "http"

[pools.app]
$pool
mode = "static"
max = $n
start_timeout = "120s"
queue_timeout = "120s"
$keys

[[contexts]]
prefix = "/"
pool = "app"
EOF
  "$CORRAL" run -c "$dir/corral.toml" > "$dir/log" 2>&1 &
  CORRAL_PID=$!
  wait_200 "http://127.0.0.1:$port/"
}
stop_corral() {
  if [ -n "$CORRAL_PID" ]; then kill "$CORRAL_PID" 2>/dev/null || true; wait "$CORRAL_PID" 2>/dev/null || true; fi
  CORRAL_PID=
}

# Passenger standalone on the Rails shop with N app processes, smart spawning; waits for
# its first answer. Sets port and PASSENGER_PIDFILE.
start_passenger() { # N
  local n=$1 d=$SCRATCH/passenger-$1
  mkdir -p "$d"
  port=$(free_port)
  PASSENGER_PIDFILE=$d/passenger.pid
  (cd "$RAILS" && exec passenger start --engine builtin --spawn-method smart \
    --address 127.0.0.1 -p "$port" --max-pool-size "$n" --min-instances "$n" \
    -e production --envvar "SECRET_KEY_BASE=$SECRET" --disable-security-update-check \
    --log-file "$d/passenger.log" --pid-file "$PASSENGER_PIDFILE" > "$d/out" 2>&1) &
  wait_200 "http://127.0.0.1:$port/"
}
stop_passenger() {
  if [ -n "$PASSENGER_PIDFILE" ] && [ -f "$PASSENGER_PIDFILE" ]; then
    passenger stop --pid-file "$PASSENGER_PIDFILE" > /dev/null 2>&1 || true
    # Its app processes end after the core: wait for them, so the next row starts alone.
    for _ in $(seq 100); do
      pgrep -f "^Passenger (RubyApp|AppPreloader): $RAILS\$" > /dev/null || break
      sleep 0.1
    done
  fi
  PASSENGER_PIDFILE=
}

# ---- refork: PSS with and without refork_after ----------------------------------------

run_one() { # APP WORKERS REFORK(on|off)
  local app=$1 n=$2 refork=$3 keys="" pages first second promoted
  [ "$refork" = on ] && keys="refork_after = $REFORK_AFTER"
  pages=$(pages_of "$app")
  start_corral "$app" "$n" "run-$app-$n-$refork" "$keys" ""
  # shellcheck disable=SC2086
  REQUESTS=$REQUESTS load "$port" "$n" $pages
  first=$(measure tree "$CORRAL_PID" "$n" "$dir/log")
  # shellcheck disable=SC2086
  REQUESTS=$REQUESTS load "$port" "$n" $pages
  second=$(measure tree "$CORRAL_PID" "$n" "$dir/log")
  promoted=$(grep -c "worker promoted:" "$dir/log" || true)
  stop_corral
  echo "$first $second $promoted"
}

refork_rows() {
  echo "Summed PSS after $REQUESTS and $((2 * REQUESTS)) requests over a few real pages, from as many keep-alive clients as workers, once the pool settled; reforking with \`refork_after = $REFORK_AFTER\`. \"workers\" sums the workers (the processes with no child), \"all\" adds the templates alive (the preloader; with reforking the newest promoted template, and an older one until its last worker is replaced). Ratio: reforked workers over workers without reforking (target for 8 Rails workers: <= 0.80); \"all ratio\" the same for all the processes. Right after a promotion the new workers have served little, so a column taken just after one flatters reforking: the later column is the one to read."
  echo
  echo "| app | workers | refork | promotions | workers MiB after $REQUESTS | all MiB | ratio | all ratio | workers MiB after $((2 * REQUESTS)) | all MiB | ratio | all ratio |"
  echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for app in $APPS; do
    for n in $WORKERS; do
      # Not in a subshell, so the exit trap can stop a corral a failure leaves running.
      run_one "$app" "$n" off > "$SCRATCH/row"
      read -r off_w1 off_a1 _ off_w2 off_a2 _ _ < "$SCRATCH/row"
      run_one "$app" "$n" on > "$SCRATCH/row"
      read -r on_w1 on_a1 _ on_w2 on_a2 _ promoted < "$SCRATCH/row"
      echo "| $app | $n | off | 0 | $(mib "$off_w1") | $(mib "$off_a1") | | | $(mib "$off_w2") | $(mib "$off_a2") | | |"
      echo "| $app | $n | on | $promoted | $(mib "$on_w1") | $(mib "$on_a1") | $(ratio "$on_w1" "$off_w1") | $(ratio "$on_a1" "$off_a1") | $(mib "$on_w2") | $(mib "$on_a2") | $(ratio "$on_w2" "$off_w2") | $(ratio "$on_a2" "$off_a2") |"
    done
  done
}

# ---- peers: beside Passenger, and the fork-to-first-answer ----------------------------

# One row of the PSS table: NAME N "WORKERS_KIB ALL_KIB TEMPLATES" CPU_MS [PASSENGER_ALL_KIB].
pss_row() {
  local w a t vs=""
  read -r w a t <<< "$3"
  [ -n "${5:-}" ] && vs="$(ratio "$a" "$5")"
  echo "| $1 | $2 | $t | $(mib "$w") | $(mib "$a") | $vs | $4 |"
  echo "$1 $2: $3, $4 ms CPU per request" >&2
}

# CPU time (user + system, in clock ticks) the processes PIDS have used so far; one that
# has ended counts nothing. The fields after the command name, which may hold spaces.
ticks_of() { # PIDS...
  local t=0 p
  for p in "$@"; do
    t=$((t + $( (sed 's/.*) //' "/proc/$p/stat" 2>/dev/null || echo) | awk '{ print $12 + $13 + 0 }')))
  done
  echo "$t"
}
# The app's processes: corral's preloader and workers, Passenger's AppPreloader and RubyApps.
corral_pids() { local p; for p in $(pgrep -P "$CORRAL_PID"); do echo "$p"; pgrep -P "$p" || true; done; }
passenger_pids() { pgrep -f "^Passenger (RubyApp|AppPreloader): $RAILS\$" || true; }
# Milliseconds of CPU per request between two ticks_of readings over REQUESTS requests.
cpu_ms() { # BEFORE AFTER
  awk -v a="$1" -v b="$2" -v n="$REQUESTS" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (b - a) * 1000 / hz / n }'
}

# One corral row of the PSS table: the Rails shop on N preloaded workers with the pool's
# KEYS and ENV (start_corral), loaded as Passenger was; PASSENGER_ALL_KIB for the ratio.
# No CPU figure with refork_after: the workers it replaces during the load take theirs along.
ROW=0
corral_row() { # N KEYS ENV WHAT PASSENGER_ALL_KIB
  local n=$1 c before cpu=""
  ROW=$((ROW + 1))
  start_corral rails "$n" "peer-rails-$ROW" "$2" "$3"
  # shellcheck disable=SC2046
  before=$(ticks_of $(corral_pids))
  # shellcheck disable=SC2086
  REQUESTS=$REQUESTS load "$port" "$n" $(pages_of rails)
  # shellcheck disable=SC2046
  [ -z "$2" ] && cpu=$(cpu_ms "$before" "$(ticks_of $(corral_pids))")
  c=$(measure tree "$CORRAL_PID" "$n" "$dir/log")
  stop_corral
  pss_row "corral, Rack launcher, preload, $4" "$n" "$c" "$cpu" "$5"
}

peer_rows() {
  local n p vs pages page first keys what before cpu
  echo "Rails (the shop of benches/lib/shop_apps.sh, production), $REQUESTS requests over its pages from as many keep-alive clients as app processes, then, once the number of processes is stable, the summed PSS of the app's processes: Passenger's \`Passenger AppPreloader\` and \`Passenger RubyApp\` processes of the app (not its core and watchdog), corral's preloader and workers (every process under corral; with reforking, the templates alive too: the promoted one, and an older one until its last worker is replaced). \"workers\" are the app processes alone (RubyApp; corral's processes with no child). \"vs Passenger\" is all over Passenger's all (Rails PSS <= Passenger's: <= 1.00). Each corral row but the first keeps the launcher's defaults (on Ruby 3.1 no YJIT, malloc_trim after a worker's collections, no warm-up) except what it names. \"app CPU\" is the user and system time the app's processes (the same ones) took during the $REQUESTS requests, per request, first requests on each worker included (not given for refork_after, whose replaced workers take theirs along); on a busy machine it moves by a third from run to run: compare rows of one run with care. Shared libraries count in PSS divided among every process that maps them, the Passenger core (left out) included, which maps libcrypto and libstdc++ as Ruby does: measured once at 2 processes, the libraries weighed 13.3 MiB in corral's three processes and 10.4 MiB in Passenger's. The refork_after row is read as soon as the pool settled, when its newest workers may have just been forked from a promoted template and dirtied little: it flatters reforking (the \`refork\` section reads its pools twice)."
  echo
  echo "| server | app processes | templates | workers MiB | all MiB | vs Passenger | app CPU ms per request |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  pages=$(pages_of rails)
  for n in $WORKERS; do
    start_passenger "$n"
    # shellcheck disable=SC2046
    before=$(ticks_of $(passenger_pids))
    # shellcheck disable=SC2086
    REQUESTS=$REQUESTS load "$port" "$n" $pages
    # shellcheck disable=SC2046
    cpu=$(cpu_ms "$before" "$(ticks_of $(passenger_pids))")
    p=$(measure passenger "$RAILS" "$n")
    stop_passenger
    pss_row "Passenger $(passenger --version | awk '{print $NF; exit}') standalone, smart spawning" "$n" "$p" "$cpu"
    vs=$(cut -d' ' -f2 <<< "$p")
    corral_row "$n" "" "" "the defaults: no YJIT (Ruby 3.1), trim, no warm-up" "$vs"
    corral_row "$n" "" ", CORRAL_RACK_WARMUP = \"30\"" "CORRAL_RACK_WARMUP=30 (opt-in)" "$vs"
    corral_row "$n" "" ", CORRAL_RACK_TRIM = \"off\"" "CORRAL_RACK_TRIM=off" "$vs"
    corral_row "$n" "" ", CORRAL_RACK_SETTLE = \"off\"" "CORRAL_RACK_SETTLE=off" "$vs"
    corral_row "$n" "" ", CORRAL_RACK_YJIT = \"on\"" "CORRAL_RACK_YJIT=on (YJIT, 1 MiB area)" "$vs"
    corral_row "$n" "refork_after = $REFORK_AFTER" "" "refork_after = $REFORK_AFTER" "$vs"
  done
  echo
  echo "Fork to first answer: a pool of 2 preloaded workers with \`max_requests = $RECYCLE\` serves $REQUESTS GETs of its first page from 2 keep-alive clients, so that its workers are recycled and replaced by new ones forked from the preloader; for each new worker that served, \`ready_ms\` is corral's log (\`worker ready\`): from the ask to the preloader to the worker's first answer, the launcher's readiness probe (a 204 from its request loop, after which corral gives it requests); \"first page\" is the first request it served, the time on the worker (access log: total - queue), rendered by a worker that had served nothing before; \"fork to first page\" is their sum per worker (the first page's answer, had a request been waiting); \"warm page\" the same page's time on those workers afterwards. With \`refork_after = [$((RECYCLE / 4))]\` too, a worker that served $((RECYCLE / 4)) is promoted to be the template, and only the workers it forks are counted. Target: a forked worker's first answer <= 50 ms."
  echo
  echo "| pool, workers counted | page | new workers | ready_ms median | max | first page ms median | max | fork to first page ms median | max | warm page ms median |"
  echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for app in $APPS; do
    page=$(pages_of "$app"); page=${page%% *}
    for refork in off on; do
      keys="max_requests = $RECYCLE"
      [ "$refork" = on ] && keys+=$'\n'"refork_after = [$((RECYCLE / 4))]"
      start_corral "$app" 2 "first-$app-$refork" "$keys" "" \
        "access_log = \"$SCRATCH/first-$app-$refork/access.log\"
access_log_format = \"json\""
      REQUESTS=$REQUESTS load "$port" 2 "$page"
      stop_corral
      if [ "$refork" = on ]; then
        first=$(measure first-answers "$dir/log" "$dir/access.log" 2 promoted)
        what="$app, refork_after = [$((RECYCLE / 4))]: forked by a promoted template"
      else
        first=$(measure first-answers "$dir/log" "$dir/access.log" 2)
        what="$app: forked by the preloader"
      fi
      echo "$what: $first" >&2
      echo "| $what | \`$page\` | $(sed 's/ / | /g' <<< "$first") |"
    done
  done
}

BODY=$SCRATCH/body.md
if [ "$MODE" = refork ]; then
  refork_rows > "$BODY"
  cat "$BODY"
  results_write refork "Reforking: summed PSS with and without refork_after" "$BODY"
else
  peer_rows > "$BODY"
  cat "$BODY"
  results_write refork-peers "Rails memory beside Passenger, and fork to first answer" "$BODY"
fi
