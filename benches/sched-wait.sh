#!/usr/bin/env bash
# At c=1, what each process of a row waited for per page: from each wake-up to running
# (`perf sched record` over 5 s of wrk -t1 -c1, read back with `perf sched timehist`), on a
# stack that benches/wordpress-gateway.sh keeps up (HOLD=1; DIR is the directory it names).
#   bash benches/sched-wait.sh DIR [ROUNDS] ["ROWS"]   (default 2 rounds, every row)
# Per round and row, per page: each process's CPU time (run), its summed waits from wake-up
# to running (del), its wake-ups (in), and for PHP and MariaDB the share of wake-ups that ran
# within 5 µs (on a CPU already awake, not a halted one woken). The recording slows every
# row (by about a third here), so req/s is printed only to divide by. Needs perf and root
# (decision 46: what taking a php_children group's connections in turn changed).
set -euo pipefail
d=$(realpath "$1")
rounds=${2:-2}
host=$(cat "$d/host")
rows=${3:-$(awk '$2 ~ /^http/ {print $1}' "$d/rows.tsv")}
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
for r in $(seq "$rounds"); do
  for row in $rows; do
    url=$(awk -v x="$row" '$1 == x {print $2}' "$d/rows.tsv")
    wrk -t1 -c1 -d2s -H "Host: $host" "$url" > /dev/null 2>&1
    wrk -t1 -c1 -d7s -H "Host: $host" "$url" > "$data/wrk" 2>&1 &
    sleep 1
    perf sched record -o "$data/sched" -- sleep 5 > /dev/null 2>&1
    wait
    rps=$(awk '/Requests\/sec/ {print $2}' "$data/wrk")
    perf sched timehist -i "$data/sched" 2>/dev/null | awk -v row="$row" -v r="$r" -v rps="$rps" '
      NR > 3 && $3 !~ /idle/ {
        n = $3; sub(/\[[0-9\/]+\]$/, "", n); sub(/-serve-[0-9]+$/, "", n)
        del[n] += $5; run[n] += $6; c[n]++
        if ($5 * 1000 < 5) fast[n]++
      }
      END {
        pages = rps * 5
        printf "%d %-11s rps %5.1f |", r, row, rps
        split("php-cgi php-fpm8.2 mariadbd corral nginx wrk", ks, " ")
        for (i = 1; i in ks; i++) {
          k = ks[i]
          if (!c[k] || pages == 0 || run[k] / pages < 0.01) continue
          printf " %s run %.2f del %.2f ms in %.1f", k, run[k] / pages, del[k] / pages, c[k] / pages
          if (k ~ /php|maria/) printf " fast %.0f%%", 100 * fast[k] / c[k]
          printf " |"
        }
        print ""
      }'
  done
done
