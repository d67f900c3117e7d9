#!/usr/bin/env python3
"""Captures the exact bytes real peers put on the wire, for the protocol tests.

Writes protocols/tests/data/{fastcgi,scgi}/*.bin:

* nginx as a FastCGI and SCGI client: a recorder listens on a Unix socket,
  keeps every byte nginx sends, and answers with a minimal valid response so
  nginx (and the curl driving it) completes.
* php-cgi as a FastCGI responder: a captured nginx request, with its script
  path rewritten, is sent to ``php-cgi -b SOCKET`` and every byte php-cgi
  answers is kept.

Standard library only. Needs Debian's nginx, php8.2-cgi and curl. Every
process it starts is stopped by its own pid before it exits. Usage:

    python3 scripts/capture/capture.py [--out protocols/tests/data]
"""

import argparse
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

# FastCGI record types and roles (FastCGI 1.0 specification, section 8).
BEGIN_REQUEST, ABORT_REQUEST, END_REQUEST, PARAMS, STDIN, STDOUT, STDERR = 1, 2, 3, 4, 5, 6, 7
KEEP_CONN = 1

# The document root nginx is told about; it need not exist, since nginx
# does not look at the file before fastcgi_pass / scgi_pass.
DOC_ROOT = "/var/www/html"


# --------------------------------------------------------------------------
# FastCGI encoding helpers (written from the specification).


def fcgi_record(rtype, request_id, content):
    """One record, padded to a multiple of 8 bytes as nginx does."""
    padding = (8 - len(content) % 8) % 8
    header = struct.pack(">BBHHBx", 1, rtype, request_id, len(content), padding)
    return header + content + b"\0" * padding


def fcgi_split(buf):
    """Splits complete records off buf: ([(type, id, content)], rest)."""
    records = []
    while len(buf) >= 8:
        _version, rtype, rid, clen, plen = struct.unpack(">BBHHB", buf[:7])
        total = 8 + clen + plen
        if len(buf) < total:
            break
        records.append((rtype, rid, bytes(buf[8 : 8 + clen])))
        buf = buf[total:]
    return records, buf


def fcgi_length(n):
    return bytes([n]) if n < 128 else struct.pack(">I", n | 0x80000000)


def fcgi_encode_params(pairs):
    out = b""
    for name, value in pairs:
        out += fcgi_length(len(name)) + fcgi_length(len(value)) + name + value
    return out


def fcgi_decode_params(data):
    pairs = []
    i = 0

    def length():
        nonlocal i
        if data[i] < 128:
            i += 1
            return data[i - 1]
        n = struct.unpack(">I", data[i : i + 4])[0] & 0x7FFFFFFF
        i += 4
        return n

    while i < len(data):
        nlen = length()
        vlen = length()
        name = data[i : i + nlen]
        value = data[i + nlen : i + nlen + vlen]
        i += nlen + vlen
        pairs.append((name, value))
    return pairs


def fcgi_rewrite_params(request, changes):
    """Re-encodes a captured request with some PARAMS values replaced.

    BEGIN_REQUEST and STDIN records are kept byte for byte; the PARAMS
    stream is decoded, changed and re-sent as one record plus the empty one.
    """
    records, rest = fcgi_split(request)
    assert not rest, "trailing bytes in the captured request"
    params = b"".join(c for t, _, c in records if t == PARAMS)
    pairs = [(n, changes.get(n, v)) for n, v in fcgi_decode_params(params)]
    encoded = fcgi_encode_params(pairs)
    assert len(encoded) < 65536
    rid = records[0][1]
    out = b""
    params_done = False
    for rtype, r, content in records:
        if rtype == PARAMS:
            if not params_done:
                out += fcgi_record(PARAMS, rid, encoded) + fcgi_record(PARAMS, rid, b"")
                params_done = True
            continue
        out += fcgi_record(rtype, r, content)
    return out


# --------------------------------------------------------------------------
# The recorder: a Unix-socket server that keeps what each connection sends.

OK_RESPONSE = b"Status: 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"


class Recorder:
    """Accepts connections on a Unix socket and records their bytes.

    ``proto`` is "fastcgi" or "scgi"; after each complete request the
    recorder answers with OK_RESPONSE in that protocol.
    """

    def __init__(self, path, proto):
        self.path = path
        self.proto = proto
        self.lock = threading.Lock()
        self.conns = []  # one dict per accepted connection
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o666)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            entry = {"data": bytearray(), "requests": 0, "closed": False}
            with self.lock:
                self.conns.append(entry)
            handler = self._fastcgi if self.proto == "fastcgi" else self._scgi
            threading.Thread(target=handler, args=(conn, entry), daemon=True).start()

    def _recv(self, conn, entry):
        chunk = conn.recv(65536)
        if chunk:
            with self.lock:
                entry["data"] += chunk
        return chunk

    def _fastcgi(self, conn, entry):
        buf = b""
        flags = {}
        try:
            while True:
                chunk = self._recv(conn, entry)
                if not chunk:
                    break
                buf += chunk
                records, buf = fcgi_split(buf)
                close = False
                for rtype, rid, content in records:
                    if rtype == BEGIN_REQUEST:
                        flags[rid] = content[2]
                    elif rtype == STDIN and not content:
                        conn.sendall(
                            fcgi_record(STDOUT, rid, OK_RESPONSE)
                            + fcgi_record(STDOUT, rid, b"")
                            + fcgi_record(END_REQUEST, rid, struct.pack(">IB3x", 0, 0))
                        )
                        with self.lock:
                            entry["requests"] += 1
                        if not flags.get(rid, 0) & KEEP_CONN:
                            close = True
                if close:
                    break
        finally:
            conn.close()
            with self.lock:
                entry["closed"] = True

    def _scgi(self, conn, entry):
        buf = b""
        try:
            while True:
                colon = buf.find(b":")
                if colon > 0:
                    hlen = int(buf[:colon])
                    if len(buf) >= colon + 1 + hlen + 1:
                        header = buf[colon + 1 : colon + 1 + hlen].split(b"\0")
                        fields = dict(zip(header[0::2], header[1::2]))
                        need = colon + 1 + hlen + 1 + int(fields[b"CONTENT_LENGTH"])
                        if len(buf) >= need:
                            conn.sendall(OK_RESPONSE)
                            with self.lock:
                                entry["requests"] += 1
                            break
                chunk = self._recv(conn, entry)
                if not chunk:
                    break
                buf += chunk
        finally:
            conn.close()
            with self.lock:
                entry["closed"] = True

    def take(self, requests, timeout=10.0):
        """Waits until `requests` requests were answered; returns and forgets
        the connections seen so far."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if sum(c["requests"] for c in self.conns) >= requests:
                    taken, self.conns = self.conns, []
                    return taken
            time.sleep(0.02)
        raise RuntimeError(f"{self.proto} recorder: fewer than {requests} requests arrived")

    def close(self):
        self.sock.close()
        os.unlink(self.path)


# --------------------------------------------------------------------------
# Processes.


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_connectable(family, address, proc, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.connect(address)
                return
            except OSError:
                time.sleep(0.02)
    raise RuntimeError(f"{address} did not accept connections in {timeout} s")


def stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


NGINX_CONF = """\
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    fastcgi_temp_path {tmp}/fastcgi;
    scgi_temp_path {tmp}/scgi;
    proxy_temp_path {tmp}/proxy;
    uwsgi_temp_path {tmp}/uwsgi;
    upstream keep_fcgi {{
        server unix:{tmp}/keep.sock;
        keepalive 2;
    }}
    server {{
        listen 127.0.0.1:{port};
        server_name localhost;
        root {root};
        location ^~ /keep/ {{
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_keep_conn on;
            fastcgi_pass keep_fcgi;
        }}
        location ^~ /app/ {{
            include /etc/nginx/scgi_params;
            scgi_pass unix:{tmp}/scgi.sock;
        }}
        location ~ \\.php$ {{
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_pass unix:{tmp}/fcgi.sock;
        }}
    }}
}}
"""


def curl(*args):
    subprocess.run(["curl", "-sS", "-o", "/dev/null", *args], check=True, timeout=30)


def save(path, data):
    with open(path, "wb") as f:
        f.write(data)
    print(f"  {os.path.relpath(path)}: {len(data)} bytes")


def capture_nginx(tmp, out):
    fcgi = Recorder(f"{tmp}/fcgi.sock", "fastcgi")
    keep = Recorder(f"{tmp}/keep.sock", "fastcgi")
    scgi = Recorder(f"{tmp}/scgi.sock", "scgi")
    port = free_port()
    conf = f"{tmp}/nginx.conf"
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(tmp=tmp, port=port, root=DOC_ROOT))
    for d in ("body", "fastcgi", "scgi", "proxy", "uwsgi"):
        os.mkdir(f"{tmp}/{d}")
    nginx = subprocess.Popen(["nginx", "-p", tmp, "-c", conf, "-e", f"{tmp}/error.log"])
    base = f"http://127.0.0.1:{port}"
    fdir = os.path.join(out, "fastcgi")
    sdir = os.path.join(out, "scgi")
    try:
        wait_connectable(socket.AF_INET, ("127.0.0.1", port), nginx)

        curl(f"{base}/index.php?id=42&name=hello%20world&tags[]=a&tags[]=b",
             "-b", "session=abc123; theme=dark")
        (c,) = fcgi.take(1)
        save(f"{fdir}/nginx-get-query-cookies.bin", bytes(c["data"]))

        curl(f"{base}/form.php", "-d", "name=corral&lang=rust%20%26%20c&empty=")
        (c,) = fcgi.take(1)
        save(f"{fdir}/nginx-post-urlencoded.bin", bytes(c["data"]))

        body = f"{tmp}/body-100k.bin"
        with open(body, "wb") as f:
            f.write(bytes(i % 251 for i in range(100 * 1024)))
        curl(f"{base}/upload.php", "-H", "Content-Type: application/octet-stream",
             "-H", "Expect:", "--data-binary", f"@{body}")
        (c,) = fcgi.take(1)
        save(f"{fdir}/nginx-post-100k.bin", bytes(c["data"]))

        # One curl, two URLs: nginx reuses its kept upstream connection.
        curl(f"{base}/keep/first.php?n=1", "-o", "/dev/null", f"{base}/keep/second.php?n=2")
        conns = keep.take(2)
        if len(conns) != 1:
            raise RuntimeError(f"keep-conn: {len(conns)} connections, wanted 1")
        save(f"{fdir}/nginx-keepconn-two-requests.bin", bytes(conns[0]["data"]))

        curl(f"{base}/app/items?page=2&sort=name", "-H", "Accept: text/html")
        (c,) = scgi.take(1)
        save(f"{sdir}/nginx-get.bin", bytes(c["data"]))

        curl(f"{base}/app/items", "-H", "Content-Type: application/json",
             "--data-binary", '{"name":"corral","tags":["a","b"]}')
        (c,) = scgi.take(1)
        save(f"{sdir}/nginx-post.bin", bytes(c["data"]))
    finally:
        stop(nginx, signal.SIGQUIT)
        for r in (fcgi, keep, scgi):
            r.close()
    print(f"  nginx error log:\n{open(f'{tmp}/error.log').read()}")


PHP_SCRIPTS = {
    "hello": '<?php echo "Hello, world\\n";\n',
    "status-cookies-stderr": (
        "<?php\n"
        "http_response_code(404);\n"
        "setcookie('a', '1');\n"
        "setcookie('b', 'two', ['path' => '/', 'httponly' => true]);\n"
        "error_log('corral capture: something went wrong');\n"
        'echo "not found\\n";\n'
    ),
    "output-200k": "<?php echo str_repeat(\"0123456789abcdef\", 12800);\n",
    "redirect": "<?php header('Location: /x');\n",
}

PHP_CGI_FLAGS = ["-n", "-d", "display_errors=0", "-d", "log_errors=1", "-d", "html_errors=0"]


def fcgi_exchange(path, request):
    """Sends one request, returns every byte until php-cgi closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(request)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk


def capture_php_cgi(tmp, out):
    php_cgi = shutil.which("php-cgi8.2") or shutil.which("php-cgi")
    if not php_cgi:
        raise RuntimeError("php-cgi not found (apt-get install php8.2-cgi)")
    docroot = f"{tmp}/php"
    os.mkdir(docroot)
    for name, text in PHP_SCRIPTS.items():
        with open(f"{docroot}/{name}.php", "w") as f:
            f.write(text)
    fdir = os.path.join(out, "fastcgi")
    with open(f"{fdir}/nginx-get-query-cookies.bin", "rb") as f:
        template = f.read()
    sock = f"{tmp}/php.sock"
    env = {"PATH": "/usr/bin:/bin", "PHP_FCGI_CHILDREN": "0", "PHP_FCGI_MAX_REQUESTS": "0"}
    proc = subprocess.Popen([php_cgi, *PHP_CGI_FLAGS, "-b", sock], env=env)
    try:
        wait_connectable(socket.AF_UNIX, sock, proc)
        for name in PHP_SCRIPTS:
            request = fcgi_rewrite_params(template, {
                b"SCRIPT_FILENAME": f"{docroot}/{name}.php".encode(),
                b"DOCUMENT_ROOT": docroot.encode(),
            })
            save(f"{fdir}/php-cgi-{name}.request.bin", request)
            save(f"{fdir}/php-cgi-{name}.response.bin", fcgi_exchange(sock, request))
    finally:
        stop(proc)


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(repo, "protocols/tests/data"))
    args = ap.parse_args()
    for d in ("fastcgi", "scgi"):
        os.makedirs(os.path.join(args.out, d), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="corral-capture-")
    os.chmod(tmp, 0o755)  # nginx's worker may run as nobody
    try:
        print("nginx:", subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip())
        capture_nginx(tmp, args.out)
        print("php-cgi")
        capture_php_cgi(tmp, args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
