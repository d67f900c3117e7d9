#!/usr/bin/env bash
# Question: what does SCHED_BATCH on corral's threads change in the front's cost per WordPress
# page, and in req/s, all else the same (decision 45)? Paired rounds on the stacks that
# `HOLD=1 bash benches/wordpress-gateway.sh` keeps up: each round measures each corral row
# once with corral's threads under SCHED_OTHER and once under SCHED_BATCH, set with chrt on
# the running corral, the two in alternating order round by round. One round's two runs see
# the same machine within a minute, so the VM's drift (decision 43) is shared by the pair.
#
# Per row and policy, over the rounds: req/s (wrk -t1), corral's and nginx's worker's CPU per
# request (schedstat, ns), their voluntary and involuntary context switches per request
# (/proc/PID/task/*/status), and in how many rounds batch cost corral less CPU.
#
#   HOLD=1 CORRALS=gw-pc FLAT=1 bash benches/wordpress-gateway.sh &   # names DIR/rows.tsv
#   bash benches/sched-batch.sh DIR
#   rm DIR/hold                                                       # stops the stacks
#
# Env: ROUNDS (6), SECS (10), C (10), ROWS ("gw-fcgi-pc gw-http-pc": rows of rows.tsv that a
# corral serves). chrt sets every thread of that corral, its control thread too (no worker is
# forked during a run); each thread's own policy is put back at the end.
set -euo pipefail
s=${1:?usage: bash benches/sched-batch.sh HOLD_DIR}
ROUNDS=${ROUNDS:-6} SECS=${SECS:-10} C=${C:-10} ROWS=${ROWS:-"gw-fcgi-pc gw-http-pc"}
[ -f "$s/rows.tsv" ] && [ -f "$s/host" ] || { echo "$s is not a HOLD=1 directory" >&2; exit 1; }
host=$(cat "$s/host")
field() { awk -v r="$1" -v f="$2" '$1 == r { print $f }' "$s/rows.tsv"; }
nginx=$(pgrep -P "$(field nginx 3)" | head -n 1)
corral=$(field "${ROWS%% *}" 3)

declare -A was
# The policy is stat's field 41; fields are counted after the name, which may hold spaces.
for t in /proc/"$corral"/task/*; do was[${t##*/}]=$(sed 's/.*) //' "$t/stat" | awk '{print $39}'); done
restore() {
  for tid in "${!was[@]}"; do
    case ${was[$tid]} in 3) chrt -b -p 0 "$tid" ;; *) chrt -o -p 0 "$tid" ;; esac 2> /dev/null || true
  done
}
trap restore EXIT

snap() { # PID: CPU ns, voluntary and involuntary switches, over all its threads
  local ns=0 vol=0 inv=0 t
  for t in /proc/"$1"/task/*; do
    ns=$((ns + $(cut -d' ' -f1 "$t/schedstat")))
    vol=$((vol + $(awk '/^voluntary_ctxt/ {print $2}' "$t/status")))
    inv=$((inv + $(awk '/^nonvoluntary_ctxt/ {print $2}' "$t/status")))
  done
  echo "$ns $vol $inv"
}

out=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="other batch"; else order="batch other"; fi
  for policy in $order; do
    if [ "$policy" = batch ]; then chrt -a -b -p 0 "$corral"; else chrt -a -o -p 0 "$corral"; fi
    for row in $ROWS; do
      read -r c0 cv0 ci0 <<< "$(snap "$corral")"; read -r n0 nv0 ni0 <<< "$(snap "$nginx")"
      w=$(wrk -t1 -c"$C" -d"$SECS"s -H "Host: $host" "$(field "$row" 2)")
      read -r c1 cv1 ci1 <<< "$(snap "$corral")"; read -r n1 nv1 ni1 <<< "$(snap "$nginx")"
      reqs=$(awk '/requests in/ {print $1}' <<< "$w")
      rps=$(awk '/Requests\/sec/ {print $2}' <<< "$w")
      bad=$(grep -cE 'Non-2xx|Socket errors' <<< "$w" || true)
      [ "$bad" = 0 ] || { echo "$row $policy round $r: wrk reported errors:" >&2; echo "$w" >&2; exit 1; }
      # nginx's worker only serves the fcgi row; on the http row its figures stay near 0.
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$policy" "$row" "$reqs" "$rps" \
        $((c1 - c0)) $((cv1 - cv0)) $((ci1 - ci0)) $((n1 - n0)) $((nv1 - nv0)) $((ni1 - ni0)) | tee -a "$out"
    done
  done
done

echo
echo "| row | policy | rounds | req/s | corral µs/req | corral vol /req | corral invol /req | nginx µs/req | nginx vol /req | nginx invol /req | rounds batch cost corral less |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F'\t' '
  { k = $3 SUBSEP $2; n[k]++; rps[k] += $5; q[k] += $4
    cns[k] += $6; cv[k] += $7; ci[k] += $8; nns[k] += $9; nv[k] += $10; ni[k] += $11
    per[$1 SUBSEP $3 SUBSEP $2] = $6 / $4; rows[$3] = 1; rounds[$1] = 1 }
  END {
    for (row in rows) {
      less = 0; for (r in rounds) if (per[r SUBSEP row SUBSEP "batch"] < per[r SUBSEP row SUBSEP "other"]) less++
      for (p = 0; p < 2; p++) {
        pol = p ? "batch" : "other"; k = row SUBSEP pol
        printf "| %s | %s | %d | %.1f | %.0f | %.2f | %.2f | %.0f | %.2f | %.2f | %s |\n", row, pol, n[k],
          rps[k] / n[k], cns[k] / q[k] / 1000, cv[k] / q[k], ci[k] / q[k], nns[k] / q[k] / 1000,
          nv[k] / q[k], ni[k] / q[k], p ? less " of " n[k] : ""
      }
    }
  }' "$out" | sort
rm -f "$out"
