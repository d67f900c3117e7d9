# How often the CPUs went idle, for benches that count it around a measurement (sourced).
# idle_entries: the sum of every CPU's cpuidle usage counters but the polling state's (an
# entry into a halt or a deeper state), or "-" where the machine has no cpuidle.
idle_entries() {
  local st n=0 any=
  for st in /sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*; do
    [ -r "$st/usage" ] || continue
    any=1
    [ "$(cat "$st/name")" = POLL ] || n=$((n + $(cat "$st/usage")))
  done
  if [ -n "$any" ]; then echo "$n"; else echo -; fi
}
