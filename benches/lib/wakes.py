"""Who woke whom, and on which CPU, from `perf script` of a `perf sched record` (benches/hop.sh
with WAKES=1).

Usage: perf script -i sched.data | python3 wakes.py TID_OR_COMM...
Counts the wake-ups among the given threads, named by thread id or by command name (a front,
its backends, and `wrk`, whose threads come and go with each run): a `sched_waking`
event whose waker and wakee are both among them, matched with the wakee's next `sched_switch`
onto a CPU. A wake-up crosses CPUs when that CPU is not the waker's. Prints one line:
"WAKES_PER_SECOND CROSSING_SHARE CROSS_MEDIAN_US LOCAL_MEDIAN_US", the medians being the time
from the wake-up to the wakee running ("-" when there were none). On a VM whose idle vCPUs halt,
a crossing wake-up that finds the other vCPU halted waits for it to be resumed: tens of µs
(docs/decisions.md, decision 40).
"""

import re
import sys

EVENT = re.compile(r"\s*(\S.*?)\s+(\d+) \[(\d+)\] ([\d.]+):\s+sched:(sched_waking|sched_switch): (.*)")
WAKEE = re.compile(r"comm=(.*?) pid=(\d+)")
NEXT = re.compile(r"next_comm=.*? next_pid=(\d+)")


def median(xs):
    xs = sorted(xs)
    return f"{xs[len(xs) // 2]:.1f}" if xs else "-"


def main():
    tids = {int(a) for a in sys.argv[1:] if a.isdigit()}
    comms = {a for a in sys.argv[1:] if not a.isdigit()}
    pending = {}  # wakee tid -> (waker's CPU, time)
    cross, local = [], []
    first = last = None
    for line in sys.stdin:
        m = EVENT.match(line)
        if not m:
            continue
        comm, tid, cpu, t = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4))
        kind, rest = m.group(5), m.group(6)
        first = t if first is None else first
        last = t
        if kind == "sched_waking":
            w = WAKEE.search(rest)
            ours = lambda c, i: i in tids or c in comms
            if w and ours(comm, tid) and ours(w.group(1), int(w.group(2))):
                pending[int(w.group(2))] = (cpu, t)
        else:
            n = NEXT.search(rest)
            if n and int(n.group(1)) in pending:
                waker_cpu, woken = pending.pop(int(n.group(1)))
                (cross if waker_cpu != cpu else local).append((t - woken) * 1e6)
    wakes = len(cross) + len(local)
    span = (last - first) if first is not None and last > first else 0
    rate = wakes / span if span else 0
    share = len(cross) / wakes if wakes else 0
    print(f"{rate:.0f} {share:.3f} {median(cross)} {median(local)}")


main()
