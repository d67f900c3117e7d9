"""What one request touches: distinct 64-byte lines of code and of data, and distinct 4 KiB
pages, per request, from a `valgrind --tool=lackey --trace-mem=yes` trace (benches/callgrind.sh
with FOOTPRINT=1).

Usage: footprint.py TRACE WINDOW [BINARY [sources]]
The trace is cut into windows of WINDOW instructions (the server's instructions per request,
as callgrind counted them), and the median of the last windows (start-up and the first
requests left out, shutdown too) is printed as "CODE_LINES DATA_LINES PAGES". With BINARY (a
position-independent executable, which valgrind maps at 0x108000), the code lines of those
windows are also counted by the crate of the function they fall in, on the following lines as
"crate lines", most first; then a line "--" and the functions touching the most code lines
as "lines density name", where density is the share of those lines' bytes the request ran
(1.0 if every byte of every line touched was executed; a hot path with its cold arms in line
sits lower). With "sources" as well, a line "--" more and the source files holding the most of
those code lines, as "lines file": each code line counted to the innermost frame of its first
instruction that is not the standard library's (`addr2line -i` over the binary's line
tables), so code inlined from a crate counts to that crate's file, and std's inlined
helpers to the file that called them.
"""

import bisect
import collections
import re
import subprocess
import sys

PIE_BASE = 0x108000  # where valgrind maps a position-independent main executable
KEEP = 40  # windows looked at, before the last few (shutdown)


def windows(trace, size):
    """The last KEEP + 5 windows of `size` instructions: (code lines, data lines, pages)."""
    out = collections.deque(maxlen=KEEP + 5)
    code, data, pages, count = {}, set(), set(), 0
    with open(trace, "rb") as f:
        for line in f:
            kind = line[:2]
            if kind not in (b"I ", b" L", b" S", b" M"):
                continue
            try:
                addr = int(line[3:].split(b",")[0], 16)
            except ValueError:
                continue
            pages.add(addr >> 12)
            if kind == b"I ":
                code[addr] = int(line[3:].split(b",")[1])
                count += 1
                if count % size == 0:
                    out.append((code, data, pages))
                    code, data, pages = {}, set(), set()
            else:
                data.add(addr >> 6)
    return list(out)[:KEEP]


def crate_of(name):
    m = re.match(r"^<?(?:&|\*const |\*mut )?([a-z_][a-z0-9_]*)::", name)
    if m:
        return m.group(1)
    m = re.search(r"(?:as |<)([a-z_][a-z0-9_]*)::", name)
    return m.group(1) if m else "(other)"


def code_lines(code):
    """The distinct 64-byte lines an {address: size} map of executed instructions touches."""
    return {a >> 6 for a in code}


def symbols(binary):
    """(starts, names) of the binary's functions, sorted by address."""
    nm = subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True, text=True)
    syms = []
    for line in nm.stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.append((int(parts[0], 16), parts[2]))
    syms.sort()
    return [a for a, _ in syms], [n for _, n in syms]


def function_of(starts, names, addr):
    """The name of the function holding a run-time address, or None outside the binary."""
    addr -= PIE_BASE
    i = bisect.bisect_right(starts, addr) - 1
    if i < 0 or addr - starts[i] > 1 << 20:
        return None
    return names[i]


def by_crate(starts, names, wins):
    counts = collections.Counter()
    for code, _, _ in wins:
        for line in code_lines(code):
            name = function_of(starts, names, line << 6)
            counts["(libc, the loader, the vDSO)" if name is None else crate_of(name)] += 1
    return [(k, v / len(wins)) for k, v in counts.most_common()]


def by_function(starts, names, wins, top=25):
    """(lines, density, name) of the functions touching the most code lines per window."""
    lines, ran = collections.Counter(), collections.Counter()
    for code, _, _ in wins:
        for line in code_lines(code):
            lines[function_of(starts, names, line << 6) or "(outside the binary)"] += 1
        for addr, size in code.items():
            ran[function_of(starts, names, addr) or "(outside the binary)"] += size
    n = len(wins)
    return [(v / n, ran[k] / (v * 64), k) for k, v in lines.most_common(top)]


def by_source(binary, wins, top=40):
    """(lines, file) of the source files the code lines per window fall in."""
    counts, first = collections.Counter(), {}
    for code, _, _ in wins:
        for a in code:
            first.setdefault(a >> 6, a)
        for line in code_lines(code):
            counts[line] += 1
    lines = list(counts)
    starts, names = symbols(binary)
    # After each address, the address of `main` (never on a request's path): its answer
    # marks where that address's inlined frames end.
    mark = starts[names.index("main")]
    ask = lambda q: subprocess.run(["addr2line", "-i", "-e", binary], input=q,
                                   capture_output=True, text=True).stdout.splitlines()
    sentinel = ask(f"{mark:#x}\n")
    out = ask("".join(f"{first[l] - PIE_BASE:#x}\n{mark:#x}\n" for l in lines))
    files, frames, i, it = collections.Counter(), [], 0, iter(lines)
    while i < len(out):
        if out[i:i + len(sentinel)] == sentinel:
            i += len(sentinel)
            line = next(it, None)
            if line is None:
                break
            kept = [f for f in frames if "/rustc/" not in f] or frames or ["(unknown)"]
            name = re.sub(r":(\d+|\?).*$", "", kept[0])
            if name == "??":
                name = "(outside the binary, or no line table)"
            elif "/rustc/" in name:  # drop glue and other std code with no caller of ours
                name = "std: " + re.sub(r"^.*/library/", "", name)
            elif "/registry/src/" in name:
                name = re.sub(r"^.*/registry/src/[^/]+/", "", name)
            else:
                name = re.sub(r"^.*?/(src|protocols|workers)/", r"\1/", name)
            files[name] += counts[line] / len(wins)
            frames = []
        else:
            frames.append(out[i])
            i += 1
    return [(v, k) for k, v in files.most_common(top)]


def main():
    trace, size = sys.argv[1], int(float(sys.argv[2]))
    wins = windows(trace, size)
    if not wins:
        sys.exit(f"{trace}: fewer than one window of {size} instructions")
    med = lambda k: sorted(len(code_lines(w[0]) if k == 0 else w[k]) for w in wins)[len(wins) // 2]
    print(med(0), med(1), med(2))
    if len(sys.argv) > 3:
        starts, names = symbols(sys.argv[3])
        for crate, lines in by_crate(starts, names, wins):
            if lines >= 1:
                print(crate, round(lines))
        print("--")
        for lines, density, name in by_function(starts, names, wins):
            print(round(lines), f"{density:.2f}", name)
        if len(sys.argv) > 4 and sys.argv[4] == "sources":
            print("--")
            for lines, name in by_source(sys.argv[3], wins):
                print(round(lines), name)


main()
