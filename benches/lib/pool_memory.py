"""What benches/refork.sh reads from /proc and from corral's log (python3, standard library).

  pool_memory.py tree ROOT N LOG
      corral's tree under ROOT, and the trees of the promoted templates LOG names (a
      promoted template outlives the template it came from, orphaned), once it has settled
      (every worker forked by one template, N of them, and the same processes a second
      later): prints "WORKERS_PSS_KIB ALL_PSS_KIB TEMPLATES", the workers being the
      processes with no child and the templates the others.
  pool_memory.py passenger DIR N
      Passenger's processes of the app in DIR, once N "Passenger RubyApp: DIR" processes
      and no more are alive and stay so for a second: prints the same three numbers, the
      RubyApp processes being the workers and the "Passenger AppPreloader: DIR" the
      templates.
  pool_memory.py first-answers LOG ACCESS_LOG N [promoted]
      The workers of a pool of N that were forked after its first N (replacing recycled
      ones; with `promoted`, only those forked by a promoted template, not the preloader): `ready_ms`, from corral's ask for the fork to the worker's first answer (its
      readiness probe), from corral's LOG ("worker ready ... forked=true"); the first
      request each served, its time on the worker (total_ms - queue_ms of the JSON
      ACCESS_LOG); their sum (fork to the first page answered, had a request been waiting);
      and the same time for the requests they served after their first. Prints "WORKERS
      READY_MEDIAN READY_MAX FIRST_MEDIAN FIRST_MAX SUM_MEDIAN SUM_MAX WARM_MEDIAN" (ms).
      Fails if a request was answered other than 200.

PSS is the `Pss:` line of /proc/PID/smaps_rollup (the workers may run as another user:
reading it needs root).
"""

import os
import re
import statistics
import sys
import time

SETTLE_WITHIN = 120.0


def processes():
    """Every live process: {pid: (ppid, cmdline)}; zombies hold no memory and are left out."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open("/proc/%s/stat" % d).read()
            cmdline = open("/proc/%s/cmdline" % d, "rb").read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            out[int(d)] = (int(fields[1]), cmdline.replace(b"\0", b" ").decode(errors="replace").strip())
    return out


def children(procs):
    kids = {}
    for p, (pp, _) in procs.items():
        kids.setdefault(pp, []).append(p)
    return kids


def below(root, kids):
    seen, todo = set(), [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            seen.add(c)
            todo.append(c)
    return seen


def pss(pid):
    try:
        for line in open("/proc/%d/smaps_rollup" % pid):
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def corral_tree(root, log):
    """(workers, all) of corral's pool processes under `root`, promoted templates included."""
    procs = processes()
    kids = children(procs)
    text = open(log).read()
    promoted = {int(m) for m in re.findall(r"worker promoted: .* pid=(\d+)", text)}
    out = below(root, kids)
    for p in promoted:
        if p in procs and p not in out:
            out |= {p} | below(p, kids)
    workers = sorted(p for p in out if not kids.get(p))
    # Settled: the workers have one parent (one template forks them all).
    one_parent = len({procs[p][0] for p in workers}) == 1
    return workers, sorted(out), one_parent


def passenger_tree(app_dir):
    procs = processes()
    workers = sorted(p for p, (_, c) in procs.items() if c == "Passenger RubyApp: " + app_dir)
    templates = sorted(p for p, (_, c) in procs.items() if c == "Passenger AppPreloader: " + app_dir)
    return workers, workers + templates, True


def settle(look, want):
    """Waits until `look()` finds `want` workers and the same processes a second later."""
    deadline = time.time() + SETTLE_WITHIN
    while True:
        workers, all_, ok = look()
        if len(workers) == want and ok:
            time.sleep(1.0)
            if look()[1] == all_:
                return workers, all_
        if time.time() > deadline:
            sys.exit("the pool did not settle at %d workers: %r" % (want, all_))
        time.sleep(0.5)


def print_pss(workers, all_):
    print(sum(map(pss, workers)), sum(map(pss, all_)), len(all_) - len(workers))


def field(line, name):
    m = re.search(r"\b%s=([0-9.]+)" % name, line)
    return float(m.group(1)) if m else None


def first_answers(log, access, initial, promoted):
    """Fork to first answer of the workers forked after the first `initial` (see above)."""
    import json
    ready, parent = {}, {}
    for line in open(log).read().splitlines():
        if "worker forked" in line:
            parent[int(field(line, "pid"))] = int(field(line, "preloader"))
        if "worker ready" in line and "forked=true" in line:
            ready[int(field(line, "pid"))] = field(line, "ready_ms")
    fresh = list(ready)[initial:]
    if promoted:
        first = parent[next(iter(ready))]
        fresh = [p for p in fresh if parent.get(p) != first]
    served = {}
    for line in open(access):
        r = json.loads(line)
        if r["status"] != 200:
            sys.exit("a request was answered %d: %s" % (r["status"], line))
        served.setdefault(r["worker_pid"], []).append(r["total_ms"] - r["queue_ms"])
    firsts, sums, warm = [], [], []
    for pid in fresh:
        if pid not in served:
            continue  # forked at the end of the load: served nothing
        firsts.append(served[pid][0])
        sums.append(ready[pid] + served[pid][0])
        warm += served[pid][1:]
    if not firsts:
        sys.exit("no worker forked after the first %d (promoted: %s) served a request" % (initial, promoted))
    ready_ms = [ready[p] for p in fresh]
    out = []
    for xs in (ready_ms, firsts, sums):
        out += [statistics.median(xs), max(xs)]
    out.append(statistics.median(warm))
    print(len(fresh), " ".join("%.1f" % x for x in out))


def main(argv):
    if len(argv) == 4 and argv[0] == "tree":
        root, want, log = int(argv[1]), int(argv[2]), argv[3]
        print_pss(*settle(lambda: corral_tree(root, log), want))
    elif len(argv) == 3 and argv[0] == "passenger":
        app_dir, want = argv[1], int(argv[2])
        print_pss(*settle(lambda: passenger_tree(app_dir), want))
    elif len(argv) in (4, 5) and argv[0] == "first-answers":
        first_answers(argv[1], argv[2], int(argv[3]), argv[4:] == ["promoted"])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
