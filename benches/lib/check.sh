#!/usr/bin/env bash
# Checks benches/lib/results.sh without running a bench (a second, no peers): a section is
# replaced in place and nothing else moves, a new one is appended, broken markers refuse to
# write, OUT= writes nothing, the command and commit are recorded, and wrk's error and
# timeout counts are read from its output.   bash benches/lib/check.sh
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
echo "benches/lib/results.sh: ok"
