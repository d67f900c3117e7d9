#!/usr/bin/env bash
# Question: how many heap allocations does corral make per request on each path, against
# issue 19's budget on http -> FastCGI? Runs `cargo bench --bench pipeline -- --allocs`
# (benches/pipeline.rs: a counting global allocator, the null backends in processes of their
# own) and publishes its table and verdict as the `pipeline-allocs` section of OUT (default
# benches/RESULTS.md; OUT= prints only; benches/lib/results.sh). Exits as the bench does:
# 1 over the budget.
#
#   bash benches/allocs.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="CARGO_TARGET_DIR"
results_start "$@"
out=$(mktemp /tmp/corral-allocs.XXXXXX)
trap 'rm -f "$out"' EXIT
status=0
# The bench prints its table on stdout and a FAIL line on stderr; both go in the section.
cargo bench --quiet -p corral --bench pipeline -- --allocs > "$out" 2>&1 || status=$?
cat "$out"
grep -q '^| path |' "$out" || { echo "the bench printed no table (exit $status)" >&2; exit 1; }
{
  echo "Counted over 2,000 requests per path after as many to warm up; the bench's output as it printed it:"
  echo
  grep '^|' "$out"
  echo
  grep -E '^(ok|FAIL):' "$out" || echo "the bench exited with $status and no verdict"
} > "$out.md"
results_write pipeline-allocs "Heap allocations per request (benches/pipeline.rs --allocs)" "$out.md"
rm -f "$out.md"
exit "$status"
