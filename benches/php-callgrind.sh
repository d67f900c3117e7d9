#!/usr/bin/env bash
# Question: how many user-space instructions does one PHP process spend per request, for
# corral's native PHP worker (classic mode) and for php-cgi, on the same script behind the
# same corral, repeatably (no timing noise)? The one worker of a `max = 1` pool runs under
# `valgrind --tool=callgrind` (corral is not measured); `ab -k -c1` sends N1 then, in a
# second run, N2 requests; (total of N2 - total of N1) / (N2 - N1) is the count per request
# (start-up, warm-up and shutdown cancel out). The native worker runs with `preload = false`
# (a worker corral spawns: valgrind follows one process), which serves requests exactly as a
# forked one does. For hello, a third row counts worker mode: the same page echoed by the
# handler a worker script loops on with corral_handle_request (its requests counted by that
# function's calls). For phpinfo, a second table splits each count into the page's own work
# (phpinfo()'s php_print_info and all it calls: the same PHP code under either SAPI) and the
# rest of the request, the part a SAPI can change.
# php-cgi's row once drifted from run to run (46.0k, 53.6k, 57.8k, once negative), for three
# reasons, each handled below: the scripts were newer than OPcache's file_update_protection,
# a run could share its port with another, and a php-cgi killed at the stop left an empty
# profile. Each run also counts the PHP requests its process served (php_request_startup's
# calls in the profile) and the difference must be N2 - N1 exactly, or no figure is printed. Every run binds a port of its own (a fixed one was shared with any other run of
# this script on the machine: a corral that could not bind left its ab to the other run's
# worker, whose count then held requests it was not sent), and a profile is read only once
# valgrind has written all of it (its `totals:` line, the last). Stopped with corral,
# php-cgi under valgrind did not exit within kill_timeout (10 s, or 60 s) in nearly every
# run on this machine (without valgrind it stops in about a second), and a process killed
# under valgrind leaves an empty profile (once read as 0: a figure of 133k, or a negative
# one; later refused). php-cgi is now retired by corral right after its last request
# (`max_requests`): it exits on its own within a second and writes its whole profile.
# Usage: bash benches/php-callgrind.sh [SCRIPT] [N1] [N2]   (defaults: hello 500 2500;
#   SCRIPT: hello or phpinfo)
# Env: CORRAL, WORKER (release builds by default), ROWS (the rows counted, default
# "native cgi worker"; worker only for hello; a partial run publishes nothing), OUT_DIR (where the last profiles are left
# as callgrind.out.native-SCRIPT.N and callgrind.out.cgi-SCRIPT.N for callgrind_annotate, default
# /tmp), OUT (benches/lib/results.sh; section php-callgrind-SCRIPT). Needs valgrind, ab,
# php-cgi and libphp8.2-embed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/callgrind.sh
RESULTS_VARS="CORRAL WORKER ROWS OUT_DIR"
results_start "$@"
page=${1:-hello}
n1=${2:-500}
n2=${3:-2500}
php_bench_binaries "$page"
out_dir=${OUT_DIR:-/tmp}

# inclusive FILE FUNCTION -> the instructions FUNCTION and everything it called ran, in all.
inclusive() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null \
    | awk -v fn="$2" '{ for (i = 2; i <= NF; i++) if ($i ~ (":" fn "$")) { gsub(",", "", $1); n += $1 } } END { print n + 0 }'
}

# measure WHICH N -> the callgrind total (Ir) of WHICH's one PHP process serving N requests,
# and the PHP requests it started (N and the warm-up's, and the readiness check's).
measure() {
  local which=$1 n=$2 s pool port corral
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  s=$(mktemp -d /tmp/corral-phpcg.XXXXXX)
  chmod 755 "$s"
  mkdir -p "$s/www" "$s/cg"
  chmod 777 "$s/cg"   # the workers run as corral's worker user
  echo '<?php echo "Hello, world\n";' > "$s/www/hello.php"
  echo '<?php phpinfo();' > "$s/www/phpinfo.php"
  # Worker mode: the same page from a handler the worker script loops on.
  echo '<?php while (corral_handle_request(static function () { echo "Hello, world\n"; })) {}' > "$s/www/worker.php"
  chmod -R a+rX "$s/www"
  # OPcache does not cache a script changed less than opcache.file_update_protection (2 s)
  # ago: every request in those first seconds compiled it afresh, and how many did depended
  # on how fast this busy machine ran the start, so the count moved from run to run (one
  # such pair of runs: php-cgi compiled hello.php 301 and 346 times, the worker 1 and 66
  # times, and they gave 50.2k each). The scripts are dated in the past.
  touch -d '10 minutes ago' "$s/www/hello.php" "$s/www/phpinfo.php"
  local vg="valgrind --tool=callgrind --callgrind-out-file=$s/cg/cg.%p.out"
  case $which in
    native | worker)
      printf '#!/bin/sh\nexec %s %s "$@"\n' "$vg" "$WORKER" > "$s/worker.sh"
      chmod 755 "$s/worker.sh"
      pool="worker = \"native\"
worker_path = \"$s/worker.sh\"
preload = false"
      [ "$which" = worker ] && pool="$pool
worker_script = \"$s/www/worker.php\"" ;;
    cgi)
      # php-cgi retired by corral right after its last request (the warm-up's 100, the
      # readiness check's 1 and N; no jitter), so that it exits and leaves its whole
      # profile (see the top: stopped with corral, it was killed, profile empty).
      pool="command = [$(printf '"%s", ' $vg)\"php-cgi\"]
max_requests = $((n + 101))
max_requests_jitter = 0" ;;
  esac
  one_php_pool_toml "$s" "$port" "$pool"
  "$CORRAL" run -c "$s/corral.toml" > "$s/corral.log" 2>&1 &
  corral=$!
  local url=http://127.0.0.1:$port/$page.php
  for _ in $(seq 600); do curl -sf -o /dev/null "$url" && break; sleep 0.1; done
  ab -q -k -n 100 -c 1 "$url" > /dev/null   # warm-up (OPcache filled)
  ab -q -k -n "$n" -c 1 "$url" > "$s/ab.txt"
  # phpinfo's length changes from request to request (it prints the request's time), which
  # ab counts as a failure: only failures of another kind refuse the run. A refused run stops
  # its corral (and the PHP process under valgrind) before it exits.
  if ! grep -q '^Failed requests: *0$' "$s/ab.txt" \
    && ! { [ "$page" = phpinfo ] && grep -q 'Connect: 0, Receive: 0, Length: [0-9]*, Exceptions: 0' "$s/ab.txt"; }; then
    echo "$which: failed requests" >&2; cat "$s/ab.txt" "$s/corral.log" >&2
    kill -TERM "$corral"; wait "$corral" || true; exit 1
  fi
  grep -q '^Non-2xx responses' "$s/ab.txt" && { echo "$which: non-2xx answers" >&2; cat "$s/ab.txt" >&2; kill -TERM "$corral"; wait "$corral" || true; exit 1; }
  # The retired php-cgi exits by itself: its profile is awaited before corral stops (a stop
  # that overtook the retirement left php-cgi waiting on its connection again).
  if [ "$which" = cgi ]; then
    for _ in $(seq 300); do
      grep -q '^totals:' "$s"/cg/cg.*.out 2>/dev/null && break
      sleep 0.1
    done
  fi
  kill -TERM "$corral"; wait "$corral" || true
  # One profile per process valgrind ran: corral's own `--check` of the worker at start,
  # the worker, and for php-cgi the worker that replaced the retired one (it served
  # nothing). The one that served is the complete profile, of no --check, whose process
  # started requests.
  local counted=php_request_startup
  [ "$which" = worker ] && counted=zif_corral_handle_request
  local out="" f
  for _ in $(seq 200); do
    for f in $(grep -L -e '^cmd:.*--check' "$s"/cg/cg.*.out 2>/dev/null || true); do
      grep -q '^totals:' "$f" && [ "$(callgrind_calls "$f" "$counted")" -gt 0 ] && out=$f
    done
    [ -n "$out" ] && break
    sleep 0.1
  done
  [ -n "$out" ] || { echo "$which: no complete profile" >&2; cat "$s/corral.log" >&2; exit 1; }
  # A second serving process (a worker replaced mid-run) would make the count meaningless.
  local workers allowed=1
  [ "$which" = cgi ] && allowed=2
  workers=$(grep -L -e '^cmd:.*--check' "$s"/cg/cg.*.out | wc -l)
  [ "$workers" -le "$allowed" ] || { echo "$which: $workers worker profiles (a worker was replaced)" >&2; cat "$s/corral.log" >&2; exit 1; }
  # For phpinfo, also the page's own work: php_print_info with all it calls.
  local page_work=0
  [ "$page" = phpinfo ] && page_work=$(inclusive "$out" php_print_info)
  echo "$(awk '/^summary:/ {print $2}' "$out") $(callgrind_calls "$out" "$counted") $page_work"
  cp "$out" "$out_dir/callgrind.out.$which-$page.$n"
  rm -rf "$s"
}

per_request() { # WHICH -> instructions per request, and of them the page's own (phpinfo)
  local a ra pa b rb pb
  read -r a ra pa < <(measure "$1" "$n1")
  read -r b rb pb < <(measure "$1" "$n2")
  if [ -z "$a" ] || [ -z "$b" ] || [ $((rb - ra)) != $((n2 - n1)) ]; then
    echo "$1: the two runs started $ra and $rb PHP requests, not $((n2 - n1)) apart: refusing the count" >&2
    exit 1
  fi
  awk -v a="$a" -v b="$b" -v pa="$pa" -v pb="$pb" -v n1="$n1" -v n2="$n2" \
    'BEGIN { printf "%.0f %.0f", (b - a) / (n2 - n1), (pb - pa) / (n2 - n1) }'
}

rows=" ${ROWS:-native cgi worker} "
# row WHICH -> its count per request, or nothing when ROWS leaves it out.
row() { if [[ $rows == *" $1 "* ]]; then per_request "$1"; fi; }
# Partial runs (one row, to follow a change to the worker) print their figures only.
[ "$rows" = " native cgi worker " ] || OUT=
kilo() { [ -n "$1" ] && awk -v v="$1" 'BEGIN {printf "%.1fk", v / 1000}' || echo -; }
report=$(mktemp /tmp/corral-phpcg-report.XXXXXX)
# (Assigned first: a refused count ends the script here, under set -e.)
counts=$(row native); read -r native native_page <<<"$counts"
counts=$(row cgi); read -r cgi cgi_page <<<"$counts"
# Worker mode serves the hello page from its handler (hello only).
worker=""
if [ "$page" = hello ]; then counts=$(row worker); read -r worker _ <<<"$counts"; fi
{
  echo "$page.php, ab -k -c1 through corral's HTTP listener to a pool of one PHP process; each count is (the run of $n2 requests - the run of $n1) / $((n2 - n1)), the PHP process under valgrind --tool=callgrind (corral not counted)."
  echo
  echo "| PHP process | user-space instructions per request |"
  echo "| --- | ---: |"
  echo "| corral-php-worker, classic mode | $(kilo "$native") |"
  echo "| php-cgi (FastCGI) | $(kilo "$cgi") |"
  if [ -n "$native" ] && [ -n "$cgi" ]; then
    echo "| native / php-cgi | $(awk -v a="$native" -v b="$cgi" 'BEGIN {printf "%.2f", a / b}') |"
  fi
  if [ -n "$worker" ]; then
    echo "| corral-php-worker, worker mode (the page from corral_handle_request's handler) | $(kilo "$worker") |"
  fi
  # phpinfo: how much of each count is the page itself (phpinfo()'s php_print_info and all it
  # calls, the same PHP code under either SAPI) and how much is everything else the process
  # does for a request (its start and end, the variables, the output path, the protocol).
  if [ "$page" = phpinfo ] && [ -n "$native" ] && [ -n "$cgi" ]; then
    echo
    echo "| PHP process | per request | phpinfo() itself (php_print_info, inclusive) | the rest of the request |"
    echo "| --- | ---: | ---: | ---: |"
    echo "| corral-php-worker, classic mode | $(kilo "$native") | $(kilo "$native_page") | $(kilo $((native - native_page))) |"
    echo "| php-cgi (FastCGI) | $(kilo "$cgi") | $(kilo "$cgi_page") | $(kilo $((cgi - cgi_page))) |"
  fi
} > "$report"
cat "$report"
RESULTS_BINARY=$WORKER results_write "php-callgrind-$page" "Native PHP worker against php-cgi: instructions per request ($page)" "$report"
rm -f "$report"
