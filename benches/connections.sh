#!/usr/bin/env bash
# Question: how many idle front connections can corral hold, at what memory, and does it still
# answer a fresh request and /ping while holding them? Opens N (default 10000) idle TCP
# connections to corral's http listener (in front of `corral null-backend`), then reports
# corral's RSS before and after, the per-connection cost, and the status of one fresh request
# and of /ping made while they are held. Loopback only; stops what it starts.
#   N=10000 bash benches/connections.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CORRAL=${CORRAL:-target/release/corral}
N=${N:-10000}
[ -x "$CORRAL" ] || cargo build --release --quiet
scratch=$(mktemp -d /tmp/corral-conns.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port=$(free_port)
status_port=$(free_port)
"$CORRAL" null-backend --protocol fastcgi --listen "unix:$scratch/null.sock" &
pids+=($!)
cat > "$scratch/c.toml" <<TOML
[server]
runtime_dir = "$scratch/run"
log_level = "warn"
max_connections = $((N + 100))
idle_timeout = "10m"
header_timeout = "10m"
[[listen]]
address = "127.0.0.1:$http_port"
protocol = "http"
max_connections_per_client = 0
[status]
address = "127.0.0.1:$status_port"
[pools.null]
servers = ["unix:$scratch/null.sock"]
concurrency = 64
TOML
# Enough descriptors for N connections on both sides.
ulimit -n $((N * 2 + 1000)) 2>/dev/null || ulimit -n "$(ulimit -Hn)"
"$CORRAL" run -c "$scratch/c.toml" &
corral=$!
pids+=("$corral")
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$http_port/" && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2}' "/proc/$corral/status"; }
before=$(rss)
python3 - "$http_port" "$status_port" "$N" "$corral" "$before" <<'PY'
import resource, socket, sys, time, urllib.request
port, status, n, pid, before = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
conns = []
t = time.time()
for i in range(n):
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    conns.append(s)
opened = time.time() - t
time.sleep(2)
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
after = rss()
def get(p, path):
    t = time.time()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{p}{path}", timeout=10) as r:
            return r.status, time.time() - t
    except Exception as e:
        return str(e), time.time() - t
fresh = get(port, "/")
ping = get(status, "/ping")
alive = 0
for s in conns:
    s.setblocking(False)
    try:
        alive += 0 if s.recv(1) == b"" else 1
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print(f"connections opened: {n} in {opened:.1f} s; still open after the requests: {alive}")
print(f"corral RSS: {before} KiB idle, {after} KiB holding them: {(after - before) * 1024 / n:.0f} bytes per connection")
print(f"fresh request while holding them: {fresh[0]} in {fresh[1] * 1000:.1f} ms; /ping: {ping[0]} in {ping[1] * 1000:.1f} ms")
PY
