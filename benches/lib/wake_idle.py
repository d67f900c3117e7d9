"""What waking an idle CPU costs here, now: the median round trip (two wake-ups) between a
process on CPU 0 and one on CPU 1 after each side has slept for GAP µs, in µs; then the same
with both on CPU 0. On a VM whose idle vCPUs halt (decision 40), the first is what each
crossing wake-up of a one-request-at-a-time load pays, and it changes from one minute to the next.

Usage: python3 benches/lib/wake_idle.py [TURNS] [GAP_US]   (defaults 300 and 1000).
Prints "CROSS_US SAME_US".
"""

import os
import statistics
import sys
import time


def trip(child_cpu, turns, gap):
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {child_cpu})
        for _ in range(turns):
            os.read(a_r, 1)
            os.write(b_w, b"x")
        os._exit(0)
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    times = []
    try:
        for _ in range(turns):
            time.sleep(gap)
            t0 = time.perf_counter_ns()
            os.write(a_w, b"x")
            os.read(b_r, 1)
            times.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        os.sched_setaffinity(0, saved)
        os.waitpid(pid, 0)
        for fd in (a_r, a_w, b_r, b_w):
            os.close(fd)
    return statistics.median(times)


def main():
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    gap = (int(sys.argv[2]) if len(sys.argv) > 2 else 1000) / 1e6
    cross = trip(1, turns, gap) if os.cpu_count() > 1 else float("nan")
    same = trip(0, turns, gap)
    print(f"{cross:.0f} {same:.0f}")


if __name__ == "__main__":
    main()
