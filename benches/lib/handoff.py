#!/usr/bin/env python3
"""How long a FastCGI PHP process sits idle between two requests, from `perf script` output.

Reads the read/write syscall tracepoints of one or more PHP processes (perf record -e
syscalls:sys_{enter,exit}_{read,write}) and, per process, measures each hand-off: from the
return of the last write of a response on its FastCGI connection (the write that carries
FCGI_END_REQUEST) to the return of the 8-byte read that brings the next request's first
record header. That is the time the process had nothing to run: for php-cgi -b and php-fpm
it spans shutdown, close and accept (the next connection waits in the kernel's accept
queue); behind corral it spans corral reading the response's end, giving the slot back and
writing the next request on the kept connection.

A request's first read is told apart from the reads inside a request by what came before
it: the first 8-byte read after the process wrote on that connection. Writes on any other
descriptor (the database's socket, stderr) are not responses.

Also counts response writes that were short or failed (a process blocked on a full socket,
or a response cut off because its client went away, as wrk's connections do when it stops)
and the slowest one.

    perf script -i perf.data | python3 benches/lib/handoff.py
prints one line: hand-offs, median and p90 in ms, short or failed writes, slowest write in ms.
"""

import re
import statistics
import sys

LINE = re.compile(
    r"\s(\d+)\s+\[\d+\]\s+(\d+\.\d+):\s+syscalls:sys_(enter|exit)_(read|write):\s*(.*)"
)
FIELD = re.compile(r"(fd|count): (0x[0-9a-f]+)")


def main() -> None:
    # Per process: the call in progress, the connection's fd, when its last write returned.
    state: dict[str, dict] = {}
    gaps: list[float] = []
    short_writes = 0
    slowest_write = 0.0
    for line in sys.stdin:
        m = LINE.search(line)
        if not m:
            continue
        pid, ts, edge, call, rest = m.groups()
        t = float(ts)
        st = state.setdefault(pid, {"call": None, "conn": None, "last_write": None})
        if edge == "enter":
            fields = {k: int(v, 16) for k, v in FIELD.findall(rest)}
            st["call"] = (call, fields.get("fd"), fields.get("count"), t)
            continue
        if st["call"] is None or st["call"][0] != call:
            continue
        _, fd, count, t0 = st["call"]
        st["call"] = None
        try:
            ret = int(rest.strip(), 16)
        except ValueError:
            ret = -1
        if call == "write":
            if fd is not None and fd == st["conn"]:
                st["last_write"] = t
                slowest_write = max(slowest_write, (t - t0) * 1e3)
                if count is not None and ret != count:
                    short_writes += 1
            continue
        if count == 8 and ret == 8:
            # The same kept connection (corral) or a new one (php-cgi -b and php-fpm:
            # the gap then spans the close and the accept).
            if st["last_write"] is not None:
                gaps.append((t - st["last_write"]) * 1e3)
            st["last_write"] = None
            st["conn"] = fd
    if not gaps:
        print("- - - 0 0", end="")
        return
    gaps.sort()
    p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
    print(
        f"{len(gaps)} {statistics.median(gaps):.3f} {p90:.3f} {short_writes} {slowest_write:.3f}",
        end="",
    )


if __name__ == "__main__":
    main()
