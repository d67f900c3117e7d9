#!/usr/bin/env bash
# Question: how many user-space instructions does corral itself spend per PHP request, in
# front of its native PHP worker (LSAPI) and in front of php-cgi (FastCGI), repeatably? The
# other side of benches/php-callgrind.sh, which counts the PHP process: here corral runs
# under `valgrind --tool=callgrind` (its workers are not followed) with one pool of each
# kind, `max = 1`, and curl sends N1 then, in a second run, N2 requests for the page over one
# kept HTTP/1.1 connection (ab -k speaks HTTP/1.0, on which a chunked answer ends with the
# connection: corral would count a connection per request); (total of N2 - total of N1) /
# (N2 - N1) is corral's count per request. The native pool runs with `preload = false`: a
# worker forked from the template does not outlive a parent under valgrind.
# The count holds no timing noise, but it follows how an answer's bytes fall into corral's
# reads, which depends on when the PHP process writes. php-cgi's row gave 91.1k, 60.9k and
# 92.0k for phpinfo in three runs of one build while a FastCGI record cut by a read waited in
# the read buffer and was copied at its refill; with body STDOUT handed on as it is read
# (ResponseDecoder::partial_stdout) it gave 36.3k to 60.3k in eight runs, memcpy about 1.5k
# of each (how many reads and pieces an answer takes still varies). The native worker's row:
# 48.0k and 48.1k.
# Usage: bash benches/php-corral-callgrind.sh [SCRIPT] [N1] [N2]   (defaults: phpinfo 100 300;
#   SCRIPT: hello or phpinfo)
# Env: CORRAL, WORKER (release builds by default), OUT_DIR (corral's last profiles are left
# there as callgrind.out.corral-ROW-SCRIPT.N, default /tmp), OUT (benches/lib/results.sh;
# section php-corral-callgrind-SCRIPT). Needs valgrind, curl, php-cgi, libphp8.2-embed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
source benches/lib/callgrind.sh
RESULTS_VARS="CORRAL WORKER OUT_DIR"
results_start "$@"
page=${1:-phpinfo}
n1=${2:-100}
n2=${3:-300}
php_bench_binaries "$page"
out_dir=${OUT_DIR:-/tmp}

# measure ROW N -> corral's callgrind total (Ir) over its run with N requests (and 20 of
# warm-up) to ROW's pool (native or cgi).
measure() {
  local which=$1 n=$2 s port pool corral codes
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  s=$(mktemp -d /tmp/corral-phpccg.XXXXXX)
  chmod 755 "$s"
  mkdir -p "$s/www"
  echo '<?php echo "Hello, world\n";' > "$s/www/hello.php"
  echo '<?php phpinfo();' > "$s/www/phpinfo.php"
  chmod -R a+rX "$s/www"
  # Older than OPcache's file_update_protection, so that every request runs cached code.
  touch -d '10 minutes ago' "$s/www/hello.php" "$s/www/phpinfo.php"
  case $which in
    native) pool="worker = \"native\"
worker_path = \"$WORKER\"
preload = false" ;;
    cgi) pool='command = ["php-cgi"]' ;;
  esac
  one_php_pool_toml "$s" "$port" "$pool"
  valgrind --tool=callgrind --callgrind-out-file="$s/cg.out" "$CORRAL" run -c "$s/corral.toml" > "$s/corral.log" 2>&1 &
  corral=$!
  local url=http://127.0.0.1:$port/$page.php
  for _ in $(seq 600); do curl -sf -o /dev/null "$url" && break; sleep 0.1; done
  # One curl, one connection: each request's status on a line of its own.
  urls() { for _ in $(seq "$1"); do printf 'url = "%s"\noutput = /dev/null\nwrite-out = "%%{http_code} %%{num_connects}\\n"\n' "$url"; done; }
  urls 20 > "$s/warm.cfg"
  urls "$n" > "$s/run.cfg"
  curl -s -K "$s/warm.cfg" > /dev/null
  codes=$(curl -s -K "$s/run.cfg")
  kill -TERM "$corral"; wait "$corral" || true
  # Every request answered 200, and only the first opened a connection.
  if [ "$(grep -c '^200 ' <<<"$codes")" != "$n" ] || [ "$(awk '{c += $2} END {print c}' <<<"$codes")" != 1 ]; then
    echo "$which: not $n answers of 200 over one connection:" >&2
    sort <<<"$codes" | uniq -c >&2; cat "$s/corral.log" >&2; exit 1
  fi
  grep -q '^totals:' "$s/cg.out" || { echo "$which: no complete profile" >&2; exit 1; }
  awk '/^totals:/ {print $2}' "$s/cg.out"
  cp "$s/cg.out" "$out_dir/callgrind.out.corral-$which-$page.$n"
  rm -rf "$s"
}

per_request() { # ROW -> corral's instructions per request
  local a b
  a=$(measure "$1" "$n1")
  b=$(measure "$1" "$n2")
  awk -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" 'BEGIN { printf "%.0f", (b - a) / (n2 - n1) }'
}

kilo() { awk -v v="$1" 'BEGIN {printf "%.1fk", v / 1000}'; }
native=$(per_request native)
cgi=$(per_request cgi)
report=$(mktemp /tmp/corral-phpccg-report.XXXXXX)
{
  echo "$page.php, curl over one kept HTTP/1.1 connection to corral's HTTP listener, a pool of one PHP process behind it; each count is (the run of $n2 requests - the run of $n1) / $((n2 - n1)), corral under valgrind --tool=callgrind (the PHP process not counted)."
  echo
  echo "| corral in front of | corral's user-space instructions per request |"
  echo "| --- | ---: |"
  echo "| corral-php-worker (LSAPI) | $(kilo "$native") |"
  echo "| php-cgi (FastCGI) | $(kilo "$cgi") |"
  echo "| native / php-cgi | $(awk -v a="$native" -v b="$cgi" 'BEGIN {printf "%.2f", a / b}') |"
} > "$report"
cat "$report"
RESULTS_BINARY=$CORRAL results_write "php-corral-callgrind-$page" "corral's own instructions per PHP request, native worker against php-cgi ($page)" "$report"
rm -f "$report"
