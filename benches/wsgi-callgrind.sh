#!/usr/bin/env bash
# Question: how many user-space instructions does one WSGI worker process spend per hello-world
# request, for corral's native WSGI worker (workers/wsgi) and for the pure-Python launcher,
# behind the same corral, repeatably (no timing noise)? The one worker of a `max = 1` pool
# runs under `valgrind --tool=callgrind` (corral is not measured); `ab -k -c1` sends N1 then,
# in a second run, N2 requests; (total of N2 - total of N1) / (N2 - N1) is the count per
# request (start-up, warm-up and shutdown cancel out). Both run with `preload = false` (a
# worker corral spawns: valgrind follows one process), which serves requests exactly as a
# forked one does. Each run binds a port of its own, a profile is read once valgrind has
# written all of it (its `totals:` line, the last), and for the native worker the two runs'
# requests (cw_call's calls in the profile) must be N2 - N1 apart exactly, or the count is
# refused (the launcher's requests are Python calls, which callgrind does not name). Python's
# string hashes are seeded the same in every run (PYTHONHASHSEED=0): with a random seed, the
# environ dict's collisions differ and so did the count, by a few hundred instructions.
# Usage: bash benches/wsgi-callgrind.sh [N1] [N2]   (defaults: 200 2200)
# Env: CORRAL, WORKER (release builds by default), ROWS (default "native launcher"; `native`
# alone skips the launcher), OUT_DIR (where the last profiles are left as
# callgrind.out.wsgi-native.N and callgrind.out.wsgi-launcher.N for callgrind_annotate,
# default /tmp), OUT (benches/lib/results.sh; section wsgi-callgrind). Needs valgrind, ab
# and python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/callgrind.sh
RESULTS_VARS="CORRAL WORKER ROWS OUT_DIR"
results_start "$@"
n1=${1:-200}
n2=${2:-2200}
rows=${ROWS:-native launcher}
CORRAL=${CORRAL:-target/release/corral}
WORKER=${WORKER:-$(dirname "$CORRAL")/corral-wsgi-worker}
[ -x "$CORRAL" ] && [ -x "$WORKER" ] || cargo build --release --quiet -p corral -p corral-wsgi-worker
CORRAL=$(realpath "$CORRAL")
WORKER=$(realpath "$WORKER")
out_dir=${OUT_DIR:-/tmp}
python=/usr/bin/python3

# measure WHICH N -> the callgrind total (Ir) of WHICH's one worker process serving N requests,
# and the requests it answered through the app (native; 0 for the launcher).
measure() {
  local which=$1 n=$2 s pool port corral
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  s=$(mktemp -d /tmp/corral-wsgicg.XXXXXX)
  chmod 755 "$s"
  mkdir -p "$s/app" "$s/cg"
  chmod 777 "$s/cg"   # the workers run as corral's worker user
  cat > "$s/app/hello.py" <<'EOF'
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"Hello World"]
EOF
  chmod -R a+rX "$s/app"
  local vg="valgrind --tool=callgrind --callgrind-out-file=$s/cg/cg.%p.out"
  case $which in
    native)
      printf '#!/bin/sh\nexec %s %s "$@"\n' "$vg" "$WORKER" > "$s/worker.sh"
      chmod 755 "$s/worker.sh"
      pool="worker = \"native\"
worker_path = \"$s/worker.sh\"
python = \"$python\"" ;;
    launcher)
      # The launcher is a Python program run by the pool's interpreter: wrap that.
      printf '#!/bin/sh\nexec %s %s "$@"\n' "$vg" "$python" > "$s/python.sh"
      chmod 755 "$s/python.sh"
      pool="python = \"$s/python.sh\"" ;;
  esac
  cat > "$s/corral.toml" <<EOF
[server]
runtime_dir = "$s/run"
log_level = "warn"
threads = 1
# A process under valgrind may take many seconds to stop and write its profile on a busy
# machine: killed at the default 10 s, it leaves none.
kill_timeout = "300s"
[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[pools.app]
app = "wsgi:hello:application"
$pool
preload = false
env = { PYTHONHASHSEED = "0" }
cwd = "$s/app"
mode = "static"
max = 1
start_timeout = "60s"
[[contexts]]
pool = "app"
EOF
  "$CORRAL" run -c "$s/corral.toml" > "$s/corral.log" 2>&1 &
  corral=$!
  local url=http://127.0.0.1:$port/
  for _ in $(seq 600); do curl -sf -o /dev/null "$url" && break; sleep 0.1; done
  ab -q -k -n 100 -c 1 "$url" > /dev/null   # warm-up (keys and values cached)
  ab -q -k -n "$n" -c 1 "$url" > "$s/ab.txt"
  grep -q '^Failed requests: *0$' "$s/ab.txt" || { echo "$which: failed requests" >&2; cat "$s/ab.txt" "$s/corral.log" >&2; exit 1; }
  grep -q '^Non-2xx responses' "$s/ab.txt" && { echo "$which: non-2xx answers" >&2; cat "$s/ab.txt" >&2; exit 1; }
  kill -TERM "$corral"; wait "$corral" || true
  # One profile per process valgrind ran: corral's own `--check` of the worker (or of the
  # interpreter) at start, then the worker; the one that served is the one whose command
  # names the app.
  local out=""
  for _ in $(seq 200); do
    out=$(grep -l -e '^cmd:.*hello:application' "$s"/cg/cg.*.out 2>/dev/null | head -n 1 || true)
    [ -n "$out" ] && grep -q '^totals:' "$out" && break
    sleep 0.1
  done
  [ -n "$out" ] && grep -q '^totals:' "$out" || { echo "$which: no complete profile" >&2; cat "$s/corral.log" >&2; exit 1; }
  # A second serving process (a worker replaced mid-run) would make the count meaningless.
  local served
  served=$(grep -l -e '^cmd:.*hello:application' "$s"/cg/cg.*.out | wc -l)
  [ "$served" = 1 ] || { echo "$which: $served worker profiles (a worker was replaced)" >&2; cat "$s/corral.log" >&2; exit 1; }
  echo "$(awk '/^summary:/ {print $2}' "$out") $(callgrind_calls "$out" cw_call)"
  cp "$out" "$out_dir/callgrind.out.wsgi-$which.$n"
  rm -rf "$s"
}

per_request() { # WHICH -> instructions per request
  local a ra b rb
  read -r a ra < <(measure "$1" "$n1")
  read -r b rb < <(measure "$1" "$n2")
  if [ -z "$a" ] || [ -z "$b" ] || { [ "$1" = native ] && [ $((rb - ra)) != $((n2 - n1)) ]; }; then
    echo "$1: the two runs answered $ra and $rb requests, not $((n2 - n1)) apart: refusing the count" >&2
    exit 1
  fi
  awk -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" 'BEGIN { printf "%.0f", (b - a) / (n2 - n1) }'
}

kilo() { awk -v v="$1" 'BEGIN {printf "%.1fk", v / 1000}'; }

report=$(mktemp /tmp/corral-wsgicg-report.XXXXXX)
native="" launcher=""
for row in $rows; do
  case $row in
    native) native=$(per_request native) ;;
    launcher) launcher=$(per_request launcher) ;;
    *) echo "unknown row $row (native or launcher)" >&2; exit 2 ;;
  esac
done
{
  echo "A hello-world WSGI app (one list item), ab -k -c1 through corral's HTTP listener to a pool of one worker process (preload = false); each count is (the run of $n2 requests - the run of $n1) / $((n2 - n1)), the worker under valgrind --tool=callgrind (corral not counted)."
  echo
  echo "| WSGI worker process | user-space instructions per request |"
  echo "| --- | ---: |"
  [ -z "$native" ] || echo "| corral-wsgi-worker (native) | $(kilo "$native") |"
  [ -z "$launcher" ] || echo "| pure-Python launcher (src/launchers/wsgi.py) | $(kilo "$launcher") |"
  if [ -n "$native" ] && [ -n "$launcher" ]; then
    echo "| native / launcher | $(awk -v a="$native" -v b="$launcher" 'BEGIN {printf "%.2f", a / b}') |"
  fi
} > "$report"
cat "$report"
RESULTS_BINARY=$WORKER results_write "wsgi-callgrind" "Native WSGI worker against the pure-Python launcher: instructions per hello request" "$report"
rm -f "$report"
