#!/usr/bin/env bash
# Question: what does one process waking another cost on this machine, when the two share a
# CPU and when they do not? At c=1 a request through a gateway is four such wake-ups in a row
# (client -> gateway -> backend -> gateway -> client), so where the kernel places each one
# can weigh more than everything the gateway computes (docs/operations.md, "Serving
# threads", and decision 38).
# Two processes pass one byte back and forth over a pair of pipes N times, blocking in read()
# between turns, (a) both on CPU 0, (b) one on CPU 0 and one on CPU 1, (c) free to run
# anywhere; the figure is the round trip (two wake-ups) in µs, Python's own cost included
# (the same in the three rows).
# Then the same after 1 ms of sleep before each turn (benches/lib/wake_idle.py): a CPU left
# idle that long has halted on this VM, and waking it is what a crossing wake-up costs at c=1.
# Usage: bash benches/wake.sh [N]   (default 20000). Needs python3 and 2 CPUs.
set -euo pipefail
n=${1:-20000}
python3 - "$n" <<'PY'
import os, sys, time
n = int(sys.argv[1])

def trip(parent_cpu, child_cpu):
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if child_cpu is not None:
            os.sched_setaffinity(0, {child_cpu})
        for _ in range(n + 100):
            os.read(a_r, 1)
            os.write(b_w, b"x")
        os._exit(0)
    saved = os.sched_getaffinity(0)
    if parent_cpu is not None:
        os.sched_setaffinity(0, {parent_cpu})
    for _ in range(100):  # warm-up
        os.write(a_w, b"x")
        os.read(b_r, 1)
    t = time.perf_counter()
    for _ in range(n):
        os.write(a_w, b"x")
        os.read(b_r, 1)
    dt = time.perf_counter() - t
    os.waitpid(pid, 0)
    os.sched_setaffinity(0, saved)
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    return dt / n * 1e6

print(f"round trip over a pipe pair, {n} turns (two wake-ups each):")
for name, p, c in [("same CPU (0 and 0)", 0, 0), ("two CPUs (0 and 1)", 0, 1), ("free", None, None)]:
    print(f"  {name:20} {trip(p, c):7.1f} µs")
PY
# The same after each side slept 1 ms, so the other CPU had gone idle (a halted vCPU here):
# what a crossing wake-up costs a load of one request at a time.
read -r cross same < <(python3 "$(dirname "${BASH_SOURCE[0]}")/lib/wake_idle.py")
echo "median round trip after 1 ms idle (lib/wake_idle.py):"
printf '  %-20s %7s µs\n' "same CPU (0 and 0)" "$same" "two CPUs (0 and 1)" "$cross"
