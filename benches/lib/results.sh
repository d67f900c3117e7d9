# Sourced by the bench scripts (bash). Each script writes what it measured into one section of
# benches/RESULTS.md, between `<!-- begin: NAME -->` and `<!-- end: NAME -->`, and leaves the
# rest of the file alone; a section it does not find yet is appended. Every section says what
# it was measured at: the date, the commit (and whether the tree had uncommitted changes), the
# exact command, the binary and the machine.
#
#   source benches/lib/results.sh
#   results_start "$@"                # first thing: the command as typed, the load, the time
#   ... measure, write the section's body (Markdown) to a file ...
#   results_write NAME "TITLE" BODY_FILE
#   read -r errors timeouts < <(wrk_errors <<< "$wrk_output")
#
# The command is `bash benches/SCRIPT ARGS` with, in front, every variable of RESULTS_VARS
# (the script's settings, space-separated, set before results_start) that was set in the
# environment. RESULTS_BINARY, if set, is the corral binary measured.
# OUT names the file (default benches/RESULTS.md); OUT= (set and empty) writes no section.
# RESULTS_SECTION, if set, replaces NAME: a second run kept beside the first (a baseline
# build, another setting), e.g. RESULTS_SECTION=callgrind-http-before CORRAL=old/corral.

results_start() {
  local v cmd=""
  for v in ${RESULTS_VARS:-} RESULTS_SECTION; do
    if [ -n "${!v+x}" ]; then cmd+="$v=$(printf '%q' "${!v}") "; fi
  done
  cmd+="bash benches/$(basename "$0")"
  for v in "$@"; do cmd+=" $(printf '%q' "$v")"; done
  results_cmd=$cmd
  results_load_start=$(cut -d' ' -f1-3 /proc/loadavg)
  results_started=$(date -u '+%Y-%m-%d %H:%M UTC')
}

# The commit, with "+ uncommitted changes" when tracked files other than the results differ.
results_commit() {
  local c dirty
  c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  dirty=$(git status --porcelain --untracked-files=no -- . ':(exclude)benches/RESULTS.md' \
    ':(exclude)benches/results' 2>/dev/null | head -n 1)
  if [ -n "$dirty" ]; then echo "$c + uncommitted changes"; else echo "$c"; fi
}

results_write() { # NAME TITLE BODY_FILE
  local out=${OUT-benches/RESULTS.md} meta binary=""
  [ -n "$out" ] || return 0
  if [ -n "${RESULTS_BINARY:-}" ]; then
    binary=", binary \`${RESULTS_BINARY/#$PWD\//}\` built $(date -u -r "$RESULTS_BINARY" '+%Y-%m-%d %H:%M UTC')"
  fi
  meta="corral \`$(results_commit)\`$binary; started ${results_started:-?}, ended $(date -u '+%Y-%m-%d %H:%M UTC')"
  meta+="; $(nproc --all) CPUs ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo))"
  # Started under `taskset`: the run and every process it started were held to those CPUs.
  [ "$(nproc)" = "$(nproc --all)" ] || meta+=", this run and all it started on CPU $(taskset -pc $$ | awk -F': ' '{print $2}') only (taskset)"
  meta+="; load average ${results_load_start:-?} at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end."
  python3 - "$out" "${RESULTS_SECTION:-$1}" "$2" "${results_cmd:-bash benches/$(basename "$0")}" "$meta" "$3" <<'PY'
import sys
out, name, title, command, meta, body_file = sys.argv[1:7]
begin, end = f"<!-- begin: {name} -->", f"<!-- end: {name} -->"
body = open(body_file).read().strip("\n")
block = f"{begin}\n## {title}\n\n`{command}`\n\n{meta}\n\n{body}\n{end}"
try:
    text = open(out).read()
except FileNotFoundError:
    text = ""
i, j = text.find(begin), text.find(end)
if (i < 0) != (j < 0) or j < i:
    sys.exit(f"{out}: the markers of section {name} are broken; not written")
if i >= 0:
    text = text[:i] + block + text[j + len(end):]
else:
    text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
open(out, "w").write(text)
print(f"wrote section {name} of {out}", file=sys.stderr)
PY
}

# wrk's output on stdin -> "ERRORS TIMEOUTS": its socket connect, read and write errors plus
# its non-2xx/3xx answers, and its socket timeouts. A run with either is invalid.
wrk_errors() {
  awk '/Socket errors/ { gsub(/,/, ""); e += $4 + $6 + $8; t += $10 }
       /Non-2xx or 3xx/ { e += $NF }
       END { print e + 0, t + 0 }'
}

# A TCP port free on 127.0.0.1 now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# `wrk -t1 -cCONNS -dDUR URL` after a 1 s warm-up, and the CPU the process PID took during it
# (user + system, /proc/PID/stat): prints "req/s µs-per-request errors timeouts requests"
# (µs "-" when no request was answered).
#   read -r rps us errs touts reqs < <(wrk_cpu 20 5s "$url" "$pid")
wrk_cpu() { # CONNS DUR URL PID
  local conns=$1 dur=$2 url=$3 pid=$4 c0 c1 out errs touts
  wrk -t1 -c"$conns" -d1s "$url" > /dev/null
  c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  out=$(wrk -t1 -c"$conns" -d"$dur" "$url")
  c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  read -r errs touts < <(wrk_errors <<< "$out")
  awk -v a="$c0" -v b="$c1" -v hz="$(getconf CLK_TCK)" -v e="$errs" -v t="$touts" '
    /Requests\/sec/ { rps = $2 } /requests in/ { n = $1 }
    END { us = n > 0 ? sprintf("%.1f", (b - a) * 1e6 / hz / n) : "-"
          print (rps == "" ? "-" : rps), us, e, t, n + 0 }' <<< "$out"
}
