#!/usr/bin/env bash
# Question: what do the in-process criterion benches measure at this commit? Runs them
# (benches/slots.rs and benches/pipeline.rs of corral, protocols/benches/codecs.rs of
# corral-protocols) and publishes what criterion wrote for this run,
# target/criterion/*/new/estimates.json and benchmark.json, as a table: the mean with its 95 %
# confidence interval, the median, the standard deviation and the throughput the bench
# declares. Estimates older than this run (a bench not run this time) are left out.
#
#   bash benches/criterion.sh                       # every bench, criterion's defaults
#   BENCHES=slots bash benches/criterion.sh -- --measurement-time 2
# Arguments after `--` go to the bench binaries (criterion's options). Env: BENCHES (which,
# default "slots pipeline codecs"), CARGO_TARGET_DIR, OUT (default benches/RESULTS.md, whose
# `criterion` section the table replaces; OUT= prints only; benches/lib/results.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="BENCHES CARGO_TARGET_DIR"
results_start "$@"
BENCHES=${BENCHES:-slots pipeline codecs}
[ "${1:-}" != -- ] || shift
dir=${CARGO_TARGET_DIR:-target}/criterion
stamp=$(mktemp /tmp/corral-criterion.XXXXXX)   # estimates newer than this are this run's
trap 'rm -f "$stamp" "$stamp.md"' EXIT
for b in $BENCHES; do
  case $b in
    codecs) pkg=corral-protocols ;;
    slots | pipeline) pkg=corral ;;
    *) echo "unknown bench $b (slots, pipeline or codecs)" >&2; exit 2 ;;
  esac
  cargo bench --quiet -p "$pkg" --bench "$b" -- "$@" >&2
done
python3 - "$dir" "$stamp" > "$stamp.md" <<'PY'
import glob, json, os, re, sys
root, stamp = sys.argv[1], os.path.getmtime(sys.argv[2])
def t(ns):
    for unit, f in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= f:
            return f"{ns / f:.3g} {unit}"
    return f"{ns:.3g} ns"
rows = []
def natural(p):  # checkout_return/4 before checkout_return/16
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p)]
for est in sorted(glob.glob(f"{root}/**/new/estimates.json", recursive=True), key=natural):
    if os.path.getmtime(est) < stamp:
        continue
    e = json.load(open(est))
    b = json.load(open(os.path.join(os.path.dirname(est), "benchmark.json")))
    mean, ci = e["mean"]["point_estimate"], e["mean"]["confidence_interval"]
    thr = ""
    for kind, n in (b.get("throughput") or {}).items():
        per = n / (mean / 1e9)
        unit = {"Elements": "elements", "Bytes": "B", "BytesDecimal": "B"}.get(kind, kind)
        thr = next(f"{per / f:.3g} {p}{unit}/s" for f, p in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (0, "")) if per >= f)
    rows.append(f"| {b['full_id']} | {t(mean)} | {t(ci['lower_bound'])} – {t(ci['upper_bound'])} | "
                f"{t(e['median']['point_estimate'])} | {t(e['std_dev']['point_estimate'])} | {thr} |")
if not rows:
    sys.exit(f"no estimates written under {root} by this run")
print("Time per iteration as criterion estimated it (target/criterion/*/new/estimates.json of this run).")
print()
print("| bench | mean | mean, 95 % confidence interval | median | std dev | throughput |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
print("\n".join(rows))
PY
cat "$stamp.md"
results_write criterion "Criterion benches (cargo bench)" "$stamp.md"
