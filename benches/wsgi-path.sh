#!/usr/bin/env bash
# Question: where does the embedded WSGI launcher's own per-request work go, and what would a
# native protocol handler save (issue 12)? Counts user-space instructions per hello-world
# request under callgrind (the difference of a run of N requests and a run of none, so start-up
# cancels out) for the launcher's pure-Python path, no system calls: parsing the BEGIN_REQUEST
# corral really sends for `GET /` (captured from a corral http listener in front of a
# capturing LSAPI server), building the environ, calling the app with start_response and
# framing its answer into a no-op sendall; each stage alone too; and, for comparison, the
# SCGI launcher of $SCGI_REV on the same variables.
#
#   bash benches/wsgi-path.sh        (CORRAL=path/to/corral to skip the build; N=3000)
# The table goes to stdout and to the `wsgi-path` section of OUT (default benches/RESULTS.md;
# OUT= prints only; benches/lib/results.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/lib/results.sh
RESULTS_VARS="N SCGI_REV PYTHON CORRAL"
results_start "$@"
if [ -z "${CORRAL:-}" ]; then
  cargo build --release --quiet
  CORRAL=${CARGO_TARGET_DIR:-target}/release/corral
fi
N=${N:-3000}
SCGI_REV=${SCGI_REV:-2c19060}
PYTHON=${PYTHON:-python3}
# The interpreter itself, not a wrapper that execs it (pyenv's shims are shell scripts, and
# callgrind would count the wrapper).
PYTHON=$("$PYTHON" -c 'import sys; print(sys.executable)')
s=$(mktemp -d /tmp/corral-wsgi-path.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$s"
}
trap cleanup EXIT
mkdir -m 700 "$s/run"
cp src/launchers/wsgi.py "$s/lsapi.py"
git show "$SCGI_REV:src/launchers/wsgi.py" > "$s/scgi.py"

# A capturing LSAPI server: keeps the first BEGIN_REQUEST, answers every request with 200.
cat > "$s/capture.py" <<'EOF'
import socket, struct, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(8)
pk = lambda t, n: struct.pack("<2sBBi", b"LS", t, 0, 8 + n)
line = b"Content-Type: text/plain\0"
answer = (pk(7, 0) + pk(3, 10 + len(line)) + struct.pack("<iiH", 1, 200, len(line)) + line
          + pk(4, 5) + b"Hello" + pk(5, 0))
saved = False
while True:
    conn, _ = listener.accept()
    buf = b""
    while True:
        while len(buf) < 8 or len(buf) < struct.unpack_from("<i", buf, 4)[0]:
            data = conn.recv(65536)
            if not data:
                break
            buf += data
        else:
            n = struct.unpack_from("<i", buf, 4)[0]
            if not saved:
                open(sys.argv[2], "wb").write(buf[:n])
                saved = True
            buf = buf[n:]
            conn.sendall(answer)
            continue
        break
    conn.close()
EOF
"$PYTHON" "$s/capture.py" "$s/lsapi.sock" "$s/request.bin" & pids+=($!)
port=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for _ in $(seq 100); do [ -S "$s/lsapi.sock" ] && break; sleep 0.05; done
cat > "$s/corral.toml" <<EOF
[server]
runtime_dir = "$s/run"
log_level = "warn"
[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[pools.capture]
protocol = "lsapi"
servers = ["unix:$s/lsapi.sock"]
[[contexts]]
pool = "capture"
EOF
"$CORRAL" run -c "$s/corral.toml" > "$s/corral.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do curl -s -m 1 "http://127.0.0.1:$port/" > /dev/null 2>&1 && break; sleep 0.1; done
[ -s "$s/request.bin" ] || { echo "no BEGIN_REQUEST captured" >&2; cat "$s/corral.log" >&2; exit 1; }

# The driver: one stage of the request path, N times.
cat > "$s/drive.py" <<'EOF'
import importlib.util, sys
stage, n = sys.argv[1], int(sys.argv[2])
def load(name):
    spec = importlib.util.spec_from_file_location(name, sys.argv[3] + "/" + name + ".py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m
lsapi, scgi = load("lsapi"), load("scgi")
packet = open(sys.argv[3] + "/request.bin", "rb").read()
text = packet.decode("latin-1")
class Sock:
    def sendall(self, data):
        pass
sock = Sock()
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"Hello World"]
def connection():
    conn = lsapi.Connection(sock)
    conn.buf = packet
    return conn
order, parsed, body_len = lsapi.read_request(connection())
environ = lsapi.build_environ(dict(parsed), connection(), body_len)
fields = lsapi.ORDERS[packet[3] & 1].fields.unpack_from(packet, 8)
variables = dict(parsed)
variables.pop("CONTENT_LENGTH", None)
pairs = [("CONTENT_LENGTH", "0"), ("SCGI", "1")] + list(variables.items())
payload = b"".join(k.encode("latin-1") + b"\0" + v.encode("latin-1") + b"\0" for k, v in pairs)
head = b"%d:" % len(payload) + payload + b","
for _ in range(n):
    if stage == "lsapi":
        conn = connection()
        o, env, length = lsapi.read_request(conn)
        conn.served += 1
        lsapi.run_app(app, lsapi.build_environ(env, conn, length), sock, o)
    elif stage == "parse":
        lsapi.read_request(connection())
    elif stage == "pairs":
        lsapi.read_pairs(packet, text, 48, fields[7], {}, "env")
    elif stage == "environ":
        lsapi.build_environ(dict(parsed), connection(), body_len)
    elif stage == "respond":
        lsapi.run_app(app, dict(environ), sock, order)
    elif stage == "scgi":
        reader = scgi.Reader(sock)
        reader.buf = head
        env, body = scgi.build_environ(scgi.read_head(reader), reader)
        scgi.run_app(app, env, sock)
if stage == "info":
    print("%d-byte BEGIN_REQUEST, %d env pairs; %d-byte SCGI head" % (len(packet), fields[7], len(head)))
EOF
report=$s/report.md
exec 3>&1 1>"$report"
"$PYTHON" "$s/drive.py" info 0 "$s"
echo
ir() {
  local n
  n=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$PYTHON" "$s/drive.py" "$1" "$2" "$s" 2>&1 | awk '/Collected/ {print $4}')
  [ -n "$n" ] || { echo "callgrind counted nothing for stage $1" >&2; exit 1; }
  echo "$n"
}
echo "| stage | instructions per request |"
echo "| --- | ---: |"
for stage in lsapi parse pairs environ respond scgi; do
  zero=$(ir "$stage" 0)
  full=$(ir "$stage" "$N")
  echo "| $stage | $(( (full - zero) / N )) |"
done
echo
echo "lsapi: the whole path (parse, environ, app, framing); parse: BEGIN_REQUEST alone; pairs: its env pairs; environ; respond: app, start_response and framing; scgi: the whole path of the SCGI launcher at $SCGI_REV. callgrind, (N requests - none) / N, N=$N, $("$PYTHON" -V 2>&1)."
exec 1>&3
cat "$report"
results_write wsgi-path "The WSGI launcher's pure-Python request path, instructions per request" "$report"
