#!/usr/bin/env bash
# Checks benches/lib/results.sh without running a bench (a second, no peers): a section is
# replaced in place and nothing else moves, a new one is appended, broken markers refuse to
# write, OUT= writes nothing, the command and commit are recorded, and wrk's error and
# timeout counts are read from its output; and benches/lib/wp_report.py's pooling of runs
# and its table of FRONT=1's runs.
#   bash benches/lib/check.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source benches/lib/results.sh
t=$(mktemp -d /tmp/corral-results-check.XXXXXX)
trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

printf 'head\n\n<!-- begin: a -->\nold a\n<!-- end: a -->\n\nbetween\n\n<!-- begin: b -->\nold b\n<!-- end: b -->\n\ntail\n' > "$t/R.md"
echo '| x | 1 |' > "$t/body"
RESULTS_VARS="SECS UNSET_ONE" SECS=7 results_start one
OUT=$t/R.md results_write a "Title A" "$t/body" 2> /dev/null
grep -q 'old a' "$t/R.md" && fail "section a was not replaced"
grep -q 'old b' "$t/R.md" || fail "section b was touched"
for line in head between tail '## Title A' '| x | 1 |' "\`SECS=7 bash benches/check.sh one\`" \
  "corral \`$(git rev-parse --short HEAD)"; do
  grep -qF -- "$line" "$t/R.md" || fail "no line '$line' in: $(cat "$t/R.md")"
done
[ "$(grep -c 'begin: a' "$t/R.md")" = 1 ] || fail "section a twice"
# In place: a still before "between".
awk '/begin: a/ {a = NR} /^between$/ {b = NR} END {exit !(a && b && a < b)}' "$t/R.md" || fail "section a moved"

OUT=$t/R.md results_write c "Title C" "$t/body" 2> /dev/null
[ "$(tail -n 1 "$t/R.md")" = '<!-- end: c -->' ] || fail "section c not appended at the end"
OUT=$t/R.md RESULTS_SECTION=c-before results_write c "Title C" "$t/body" 2> /dev/null
grep -q 'begin: c-before' "$t/R.md" || fail "RESULTS_SECTION not used"
[ "$(grep -c 'begin: c -->' "$t/R.md")" = 1 ] || fail "RESULTS_SECTION wrote section c again"

cp "$t/R.md" "$t/before"
OUT= results_write a "Title A" "$t/body"
cmp -s "$t/R.md" "$t/before" || fail "OUT= wrote"
printf '<!-- begin: a -->\nno end\n' > "$t/broken.md"
if OUT=$t/broken.md results_write a "Title A" "$t/body" 2> /dev/null; then fail "broken markers written"; fi
grep -q 'no end' "$t/broken.md" || fail "broken file changed"

read -r e to < <(printf 'Running 1s test\n  Socket errors: connect 1, read 2, write 3, timeout 28\n  Non-2xx or 3xx responses: 5\n' | wrk_errors)
[ "$e $to" = "11 28" ] || fail "wrk_errors read '$e $to', not '11 28'"
read -r e to < <(printf 'Running 1s test\n  1000 requests in 1.00s, 100KB read\n' | wrk_errors)
[ "$e $to" = "0 0" ] || fail "wrk_errors read '$e $to' from a clean run"

# benches/lib/wp_report.py: two runs of c=10 pooled. Run 1 alone misses (gw 0.99x and a p99 of
# 150 ms against 100); pooled, the requests over the seconds and the p99 over all the requests
# of both runs' histograms meet.
wp_run() { # DIR GW_REQS: a run of fpm, cgi (1000 requests each) and gw-http-pc, round 1, 10 s
  mkdir -p "$1/hist"
  echo 10 > "$1/secs"
  for r in fpm cgi gw-http-pc; do
    n=1000
    [ "$r" = gw-http-pc ] && n=$2
    printf '10\t%s\t1\t%s\t100.00ms\t0\t0\t1000\t1.0\t1\t1\t1\t1\t2\t1\t1\n' "$r" "$n" >> "$1/results.tsv"
  done
}
wp_run "$t/wp1" 990
printf '100000 990\n200000 10\n' | tee "$t/wp1/hist/c10-fpm-1.txt" > "$t/wp1/hist/c10-cgi-1.txt"
printf '100000 980\n150000 10\n' > "$t/wp1/hist/c10-gw-http-pc-1.txt"
wp_run "$t/wp2" 1010
printf '100000 1000\n' | tee "$t/wp2/hist/c10-fpm-1.txt" > "$t/wp2/hist/c10-cgi-1.txt"
printf '90000 1010\n' > "$t/wp2/hist/c10-gw-http-pc-1.txt"
want='- c=10 gw-http-pc: / cgi **0.99**, / fpm **0.99**, p99 / fpm 1.50: missed'
python3 benches/lib/wp_report.py "$t/wp1" | grep -xF -- "$want" > /dev/null || fail "wp_report.py, one run: no line '$want'"
want='- c=10 gw-http-pc: / cgi **1.00**, / fpm **1.00**, p99 / fpm 1.00: met [0.99 0.99 1.50; 1.01 1.01 0.90]'
python3 benches/lib/wp_report.py "$t/wp1" "$t/wp2" | grep -xF -- "$want" > /dev/null ||
  fail "wp_report.py, pooled: no line '$want' in: $(python3 benches/lib/wp_report.py "$t/wp1" "$t/wp2")"
# A row only one run measured is compared with that run's references, not the pooled ones:
# base-http's 600 requests against run 3's 500 are 1.20, not 0.72 of all three runs' cgi.
mkdir -p "$t/wp3/hist"
echo 10 > "$t/wp3/secs"
for r in fpm:500 cgi:500 base-http:600; do
  printf '10\t%s\t1\t%s\t100.00ms\t0\t0\t1000\t1.0\t1\t1\t1\t1\t2\t1\t1\n' "${r%:*}" "${r#*:}" >> "$t/wp3/results.tsv"
  printf '100000 %s\n' "${r#*:}" > "$t/wp3/hist/c10-${r%:*}-1.txt"
done
want='- c=10 base-http: / cgi **1.20**, / fpm **1.20**, p99 / fpm 1.00: met [— — —; — — —; 1.20 1.20 1.00]'
python3 benches/lib/wp_report.py "$t/wp1" "$t/wp2" "$t/wp3" | grep -xF -- "$want" > /dev/null ||
  fail "wp_report.py, a row of one run: no line '$want' in: $(python3 benches/lib/wp_report.py "$t/wp1" "$t/wp2" "$t/wp3")"
# The idle entries per request pool only the rounds that counted them (a run from before the
# column has 16 fields): 30,000 over run 4's 1,000 requests, not over run 1's as well.
mkdir -p "$t/wp4/hist"
echo 10 > "$t/wp4/secs"
printf '10\tfpm\t1\t1000\t100.00ms\t0\t0\t1000\t1.0\t1\t1\t1\t1\t2\t1\t1\t30000\n' > "$t/wp4/results.tsv"
python3 benches/lib/wp_report.py "$t/wp1" "$t/wp4" | grep -E '^\| fpm \| 10 \| .* \| 30\.0 \|$' > /dev/null ||
  fail "wp_report.py, idle entries: no fpm line ending in 30.0 in: $(python3 benches/lib/wp_report.py "$t/wp1" "$t/wp4")"
# FRONT=1's table, from one run's front.tsv: ticks of 10,000 µs over the requests, switches
# and system calls per request as written.
printf 'gw-http-pc\t1000\t20\t30\t4260\t2290\t11.6\trecvfrom 4.80, epoll_wait 1.56\n' > "$t/wp1/front.tsv"
echo '10 100' > "$t/wp1/front_level"
want='| gw-http-pc | 1000 | 200 | 300 | 4.26 | 2.29 | 11.6 | recvfrom 4.80, epoll_wait 1.56 |'
python3 benches/lib/wp_report.py "$t/wp1" | grep -xF -- "$want" > /dev/null ||
  fail "wp_report.py, FRONT=1: no line '$want' in: $(python3 benches/lib/wp_report.py "$t/wp1")"
echo "benches/lib/results.sh, benches/lib/wp_report.py: ok"
