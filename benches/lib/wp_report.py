"""The tables of benches/wordpress-gateway.sh, from one run's directory or pooled over several.

    python3 benches/lib/wp_report.py RUN_DIR [RUN_DIR...]

A run directory holds what wordpress-gateway.sh keeps with KEEP=DIR: results.tsv (a line per
row, level and round), secs (the seconds of a round), groups.tsv, handoff.tsv, front.tsv and
front_level (FRONT=1's runs) and hist/ (c<LEVEL>-<ROW>-<ROUND>.txt: wrk's latency histogram of
that round, benches/lib/latency-hist.lua).

Given several, the rounds of every run are pooled: req/s is all their requests over all their
seconds, and the p99 is the 99th percentile of all their requests. A ratio pools only the runs
that measured both its rows (a BASE row one run had is set against that run's references).
The issue-19 verdict (req/s >= 0.98x cgi and fpm; p99 <= fpm's at c >= 10) is judged on the
pooled figures, with each run's own ratios printed beside it, so a verdict rests on more
rounds than one run's noise allows.
"""
import collections
import os
import statistics
import sys

FIELDS = "c r round reqs p99 errs touts ns load php wait db idle ticks inv mig halts".split()


def ms(v):
    for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if v.endswith(unit):
            try:
                return float(v[: -len(unit)]) * f
            except ValueError:
                return None
    return None


def load(d):
    """One run: {(c, row): stats} in the order the rows first appear."""
    secs = float(open(os.path.join(d, "secs")).read())
    rows = {}
    for line in open(os.path.join(d, "results.tsv")):
        v = dict(zip(FIELDS, line.rstrip("\n").split("\t")))
        k = (int(v["c"]), v["r"])
        x = rows.setdefault(k, dict(n=0, secs=0.0, p99=[], e=0, t=0, ns=0, load=[], hist=collections.Counter(),
                                    hist_n=0, php=0, wait=0, db=0, idle=0, ticks=0, inv=0, mig=0,
                                    halts=0, halts_n=0))
        x["n"] += int(v["reqs"])
        x["secs"] += secs
        x["p99"].append(ms(v["p99"]))
        x["load"].append(float(v["load"]))
        for f, key in (("errs", "e"), ("touts", "t"), ("ns", "ns"), ("php", "php"), ("wait", "wait"), ("db", "db"),
                       ("idle", "idle"), ("ticks", "ticks"), ("inv", "inv"), ("mig", "mig")):
            x[key] += int(v[f])
        if v.get("halts", "-") != "-":  # a run before the column, or no cpuidle: not counted
            x["halts"] += int(v["halts"])
            x["halts_n"] += int(v["reqs"])
        h = os.path.join(d, "hist", f"c{v['c']}-{v['r']}-{v['round']}.txt")
        if os.path.exists(h):
            x["hist_n"] += 1
            for line in open(h):
                us, count = line.split()
                x["hist"][int(us)] += int(count)
    return rows


def merge(runs):
    pooled = {}
    for rows in runs:
        for k, x in rows.items():
            y = pooled.get(k)
            if y is None:
                pooled[k] = dict(x, p99=list(x["p99"]), load=list(x["load"]), hist=collections.Counter(x["hist"]))
                continue
            for key in ("n", "secs", "e", "t", "ns", "php", "wait", "db", "idle", "ticks", "inv", "mig", "hist_n",
                        "halts", "halts_n"):
                y[key] += x[key]
            y["p99"] += x["p99"]
            y["load"] += x["load"]
            y["hist"].update(x["hist"])
    return pooled


def valid(rows, k):
    x = rows.get(k)
    return x is not None and x["n"] > 0 and x["e"] == 0 and x["t"] == 0 and None not in x["p99"]


def rps(rows, k):
    return rows[k]["n"] / rows[k]["secs"]


def p99_all(rows, k):
    """The 99th percentile of every request of k's rounds (ms), or None without every histogram."""
    x = rows[k]
    if x["hist_n"] != len(x["p99"]) or not x["hist"]:
        return None
    rank, seen = 0.99 * sum(x["hist"].values()), 0
    for us in sorted(x["hist"]):
        seen += x["hist"][us]
        if seen >= rank:
            return us / 1e3
    return None


def p99(rows, k):
    """The p99 the verdict uses: over all requests when histograms exist, else the rounds' median."""
    p = p99_all(rows, k)
    return p if p is not None else statistics.median(rows[k]["p99"])


def paired(runs, *keys):
    """The runs that measured every one of the rows validly, pooled: a ratio compares rows of
    the same runs."""
    return merge([run for run in runs if all(valid(run, k) for k in keys)])


def ratio(runs, a, b, f):
    rows = paired(runs, a, b)
    return f"{f(rows, a) / f(rows, b):.2f}" if a != b and rows else "—"


def front_table(front, level):
    """FRONT=1's table: what the front's CPU per request is made of, one run per row."""
    c, hz = (level.split() + ["10", "100"])[:2]
    tick = 1e6 / float(hz)  # µs
    print()
    print(f"The front per request at c={c} (nginx's worker, plus the row's corral), FRONT=1: user and system CPU and")
    print("voluntary and involuntary context switches, from /proc/PID/task/*/stat and status over a run of its own")
    print(f"(CPU in ticks of {tick:.0f} µs, so a short run rounds it); system calls under `perf trace -s`, a second")
    print("run, and the five commonest. Neither run counts in req/s.")
    print()
    print("| row | requests | user µs/req | system µs/req | voluntary /req | involuntary /req | system calls /req | commonest, per request |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for v in front:
        r, n, user, system, vol, inv, calls, top = (v + ["—"] * 8)[:8]
        n = int(n) if n.isdigit() else 0
        per = lambda x, f: f.format(x / n) if n else "—"
        print(f"| {r} | {n} | {per(int(user) * tick, '{:.0f}')} | {per(int(system) * tick, '{:.0f}')} | "
              f"{per(int(vol), '{:.2f}')} | {per(int(inv), '{:.2f}')} | {calls} | {top} |")


def tables(runs, rows, groups, handoff, handoff_level):
    print("| row | c | req/s | / fpm | / cgi | p99 ms per round | p99 median | p99 all | p99 / fpm | front µs/req | errors | timeouts | load | valid |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|")
    for (c, r), x in rows.items():
        k = (c, r)
        us = x["ns"] / 1e3 / x["n"] if x["n"] else 0
        per = " ".join("—" if v is None else f"{v:.0f}" for v in x["p99"])
        med = f"{statistics.median(x['p99']):.0f}" if None not in x["p99"] else "—"
        allp = p99_all(rows, k)
        print(f"| {r} | {c} | {rps(rows, k):.1f} | {ratio(runs, k, (c, 'fpm'), rps)} | {ratio(runs, k, (c, 'cgi'), rps)} | "
              f"{per} | {med} | {'—' if allp is None else f'{allp:.0f}'} | {ratio(runs, k, (c, 'fpm'), p99)} | {us:.0f} | "
              f"{x['e']} | {x['t']} | {min(x['load']):.1f}–{max(x['load']):.1f} | {'ok' if valid(rows, k) else '**invalid**'} |")
    print()
    print("What the PHP processes did, per request (schedstat, summed over the row's PHP processes): CPU, and time runnable but")
    print("waiting for a CPU; MariaDB's CPU; the share of both CPUs' time left idle during the row's runs (/proc/stat); the row's PHP")
    print("processes and the sessions they are in (each session is a scheduling group of its own when autogroups apply); how often")
    print("per request a PHP process was preempted (involuntary switches) and moved to the other CPU (migrations), /proc/PID/task/*/sched;")
    print("how often per request a CPU went idle (cpuidle's usage counters, both CPUs; at c=1 a wake-up onto a halted CPU):")
    print()
    print("| row | c | PHP µs/req | PHP wait µs/req | MariaDB µs/req | CPU idle % | PHP processes / sessions | preempted /req | migrated /req | idle entries /req |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for (c, r), x in rows.items():
        per = lambda v: f"{v / 1e3 / x['n']:.0f}" if x["n"] else "—"
        idle = f"{100 * x['idle'] / x['ticks']:.1f}" if x["ticks"] else "—"
        count = lambda v: f"{v / x['n']:.2f}" if x["n"] else "—"
        halts = f"{x['halts'] / x['halts_n']:.1f}" if x["halts_n"] else "—"
        print(f"| {r} | {c} | {per(x['php'])} | {per(x['wait'])} | {per(x['db'])} | {idle} | {groups.get(r, '—')} | "
              f"{count(x['inv'])} | {count(x['mig'])} | {halts} |")
    if handoff:
        print()
        print(f"The hand-off at c={handoff_level}, one run per row with the PHP processes' read/write system calls recorded (perf):")
        print("how long a PHP process sat idle from the return of its response's last write to the return of the read that")
        print("brought the next request (benches/lib/handoff.py); short or failed response writes; the slowest response write.")
        print()
        print("| row | hand-offs | median ms | p90 ms | short or failed writes | slowest write ms |")
        print("|---|---:|---:|---:|---:|---:|")
        for r, v in handoff:
            n, med, p90, short, slow = (v.split() + ["—"] * 5)[:5]
            print(f"| {r} | {n} | {med} | {p90} | {short} | {slow} |")


def verdict(runs):
    pooled = len(runs) > 1
    print()
    print("Issue 19's real-application targets (req/s ≥ 0.98× cgi and fpm; p99 ≤ fpm's at c ≥ 10), "
          + (f"pooled over the runs (of {len(runs)}) that measured the row; each run's own ratios in brackets:" if pooled else "from this run:"))
    print()
    keys = {k for run in runs for k in run}
    gw = sorted({r for _, r in keys if r not in ("fpm", "cgi", "cgi-sep")})
    for c in sorted({c for c, _ in keys}):
        for r in gw:
            a = (c, r)
            rows = paired(runs, a, (c, "cgi"), (c, "fpm"))
            if not rows:
                print(f"- c={c} {r}: — (no run has it and both references valid)")
                continue
            q_cgi, q_fpm = rps(rows, a) / rps(rows, (c, "cgi")), rps(rows, a) / rps(rows, (c, "fpm"))
            q_p99 = p99(rows, a) / p99(rows, (c, "fpm"))
            met = q_cgi >= 0.98 and q_fpm >= 0.98 and (c < 10 or q_p99 <= 1.0)
            each = ""
            if pooled:
                each = " [" + "; ".join(
                    f"{ratio([run], a, (c, 'cgi'), rps)} {ratio([run], a, (c, 'fpm'), rps)}"
                    + (f" {ratio([run], a, (c, 'fpm'), p99)}" if c >= 10 else "") for run in runs) + "]"
            tail = f", p99 / fpm {q_p99:.2f}" if c >= 10 else ""
            print(f"- c={c} {r}: / cgi **{q_cgi:.2f}**, / fpm **{q_fpm:.2f}**{tail}: {'met' if met else 'missed'}{each}")


def main(dirs):
    runs = [load(d) for d in dirs]
    rows = merge(runs)
    groups, handoff, level = {}, [], "10"
    for d in dirs:  # the same rows in every run: the last run's say
        path = os.path.join(d, "groups.tsv")
        if os.path.exists(path):
            groups.update(line.rstrip("\n").split("\t") for line in open(path) if line.strip())
    if len(dirs) == 1:  # one run's own hand-off table (not pooled)
        d = dirs[0]
        path = os.path.join(d, "handoff.tsv")
        if os.path.exists(path):
            handoff = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
        path = os.path.join(d, "handoff_level")
        if os.path.exists(path):
            level = open(path).read().strip()
    tables(runs, rows, groups, handoff, level)
    if len(dirs) == 1:
        path = os.path.join(dirs[0], "front.tsv")
        front = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()] if os.path.exists(path) else []
        if front:
            path = os.path.join(dirs[0], "front_level")
            front_table(front, open(path).read().strip() if os.path.exists(path) else "10 100")
    verdict(runs)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
