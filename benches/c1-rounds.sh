#!/usr/bin/env bash
# At c=1, each row's req/s and how often a CPU went idle per request, round after round, on
# a stack that benches/wordpress-gateway.sh keeps up (HOLD=1; DIR is the directory it names).
#   bash benches/c1-rounds.sh DIR [ROUNDS] [SECS]
# Each round runs every row of DIR/rows.tsv in a shuffled order: 2 s of warm-up, then wrk
# -t1 -c1 for SECS. It prints a line per measurement (round, setting, row, requests, req/s,
# idle entries per request) and, at the end, each row's requests over all its seconds.
# HALT_POLL="0 200000" runs each round once per guest halt-polling setting, in an order
# alternating by round (guest_halt_poll_ns: a KVM guest with the cpuidle-haltpoll driver, as
# root), and puts the old value back when it ends (benches/halt-poll.sh; benches/RESULTS.md
# section `halt-poll-c1`, decision 40); without it the setting is left as it is ("-").
set -euo pipefail
d=$(realpath "$1")
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/cpuidle.sh
rounds=${2:-4}
secs=${3:-8}
host=$(cat "$d/host")
knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
settings=${HALT_POLL:-}
if [ -n "$settings" ]; then
  [ -w "$knob" ] || { echo "no writable $knob: not a haltpoll guest, or not root" >&2; exit 1; }
  old=$(cat "$knob")
  trap 'echo "$old" > "$knob"' EXIT
fi
rows=$(awk '$2 ~ /^http/ {print $1}' "$d/rows.tsv")
lines=$(mktemp)
for r in $(seq "$rounds"); do
  modes=${settings:--}
  [ -z "$settings" ] || [ $((r % 2)) = 1 ] || modes=$(printf '%s\n' $settings | tac | tr '\n' ' ')
  for m in $modes; do
    [ "$m" = - ] || echo "$m" > "$knob"
    # shellcheck disable=SC2086 # a list of rows
    for row in $(printf '%s\n' $rows | awk -v seed="$r$m" 'BEGIN {srand(seed)} {print rand() "\t" $0}' | sort -n | cut -f2); do
      url=$(awk -v x="$row" '$1 == x {print $2}' "$d/rows.tsv")
      wrk -t1 -c1 -d2s -H "Host: $host" "$url" > /dev/null 2>&1
      a=$(idle_entries)
      out=$(wrk -t1 -c1 -d"${secs}s" -H "Host: $host" "$url" 2>&1)
      b=$(idle_entries)
      n=$(awk '/requests in/ {print $1}' <<< "$out")
      echo "$r $m $row $n $(awk '/Requests\/sec/ {print $2}' <<< "$out") $(((b - a) / ${n:-1}))" | tee -a "$lines"
    done
  done
done
echo "# row, setting: requests over all its seconds"
awk -v secs="$secs" '{k = $3 " " $2; n[k] += $4; t[k] += secs} END {for (k in n) printf "%s %.2f\n", k, n[k] / t[k]}' "$lines" | sort
rm -f "$lines"
