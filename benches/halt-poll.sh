#!/usr/bin/env bash
# At c=1, each row's req/s and how often a CPU halted per request, with the guest's halt
# polling off (guest_halt_poll_ns=0) and on (200000, the kernel's default), on a stack that
# benches/wordpress-gateway.sh keeps up (HOLD=1; DIR is the directory it names).
#   bash benches/halt-poll.sh DIR [ROUNDS] [SECS]
# Each round runs both settings in turn, the order alternating by round, and every row of
# DIR/rows.tsv in a shuffled order under each: 2 s of warm-up, then wrk -t1 -c1 for SECS.
# It prints a line per measurement: round, setting, row, requests, req/s, halts per request.
# It changes a machine-wide setting (a KVM guest with the cpuidle-haltpoll driver, as root)
# while it runs, and puts the old value back when it ends (benches/RESULTS.md section
# `halt-poll-c1`, decision 40).
set -euo pipefail
d=$(realpath "$1")
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/cpuidle.sh
rounds=${2:-4}
secs=${3:-8}
host=$(cat "$d/host")
knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
[ -w "$knob" ] || { echo "no writable $knob: not a haltpoll guest, or not root" >&2; exit 1; }
old=$(cat "$knob")
trap 'echo "$old" > "$knob"' EXIT
rows=$(awk '$2 ~ /^http/ {print $1}' "$d/rows.tsv")
for r in $(seq "$rounds"); do
  modes="0 200000"
  [ $((r % 2)) = 1 ] || modes="200000 0"
  for m in $modes; do
    echo "$m" > "$knob"
    # shellcheck disable=SC2086 # a list of rows
    for row in $(printf '%s\n' $rows | awk -v seed="$r$m" 'BEGIN {srand(seed)} {print rand() "\t" $0}' | sort -n | cut -f2); do
      url=$(awk -v x="$row" '$1 == x {print $2}' "$d/rows.tsv")
      wrk -t1 -c1 -d2s -H "Host: $host" "$url" > /dev/null 2>&1
      a=$(idle_entries)
      out=$(wrk -t1 -c1 -d"${secs}s" -H "Host: $host" "$url" 2>&1)
      b=$(idle_entries)
      n=$(awk '/requests in/ {print $1}' <<< "$out")
      echo "$r $m $row $n $(awk '/Requests\/sec/ {print $2}' <<< "$out") $(((b - a) / ${n:-1}))"
    done
  done
done
