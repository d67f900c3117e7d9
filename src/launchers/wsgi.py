"""corral's WSGI launcher: serves one PEP 3333 application over SCGI on the listening socket
corral hands over as fd 0, one request at a time, with only Python's standard library.

    python3 corral-wsgi.py module:callable
    python3 corral-wsgi.py module:callable --preload

The module is imported with the worker's working directory first on sys.path. corral opens
one SCGI connection per request: a netstring head (CONTENT_LENGTH first, SCGI=1, then the CGI
variables), exactly CONTENT_LENGTH body bytes, and it reads a CGI response (`Status:` line,
headers, blank line, body) until this side closes. SIGTERM and SIGINT finish the request in
progress and exit 0. Bad SCGI input closes that connection and is logged on stderr (which
corral copies into its own log); the launcher keeps serving.

With --preload, fd 0 is instead a SOCK_SEQPACKET control socket to corral and this process is
the pool's preloader (ARCHITECTURE.md, "Preload and fork"): it loads the app once, says
`ready PID`, and for each `fork KEY` message (carrying the worker's listening socket by
SCM_RIGHTS) forks a worker that serves that socket as above, answering `forked KEY PID`; it
reaps its workers and reports `exited PID code N` or `exited PID signal N`. It exits when
corral closes the control socket or on SIGTERM.
"""

import gc
import html
import importlib
import os
import platform
import random
import re
import select
import signal
import socket
import struct
import sys
import traceback
import types

# Bounds on what corral may send; corral's own limits are lower, so only a broken peer
# reaches them.
MAX_HEADER = 64 * 1024
MAX_HEADER_DIGITS = len(str(MAX_HEADER))
HEADER_TIMEOUT = 60.0
# Read size for wsgi.input and for draining an unread body before closing.
CHUNK = 64 * 1024
# A body the app left unread is discarded up to this much, so corral is not reset while it
# still writes; beyond it the connection is simply closed.
MAX_DRAIN = 64 * 1024 * 1024
# A slow uploader must not hold the worker after its answer went out.
DRAIN_TIMEOUT = 5.0

STATUS_RE = re.compile(r"[1-9][0-9][0-9] [^\x00-\x1f\x7f]*\Z")
TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
VALUE_RE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*\Z")
HOP_BY_HOP = frozenset(
    "connection keep-alive proxy-authenticate proxy-authorization te trailer "
    "transfer-encoding upgrade".split()
)

ERROR_BODY = b"Internal Server Error\n"


def log(message):
    """One line on stderr, which corral logs with this worker's pool and pid."""
    try:
        sys.stderr.write("corral-wsgi: %s\n" % message)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class BadRequest(Exception):
    """The SCGI head broke a rule; the connection is closed without an answer."""


class ClientGone(Exception):
    """corral closed the connection while the response was being written."""


# ---------------------------------------------------------------------------------------
# SCGI request head


class Reader:
    """Buffered reads straight from the connection: the head usually arrives in one recv,
    and what follows it in that recv is the start of the body. (socket.makefile costs a
    Python-level SocketIO call per read on top of the buffer; this is one recv.)"""

    __slots__ = ("conn", "buf")

    def __init__(self, conn):
        self.conn = conn
        self.buf = b""

    def fill(self):
        data = self.conn.recv(CHUNK)
        if data:
            self.buf += data
        return data

    def read(self, n):
        """Up to n bytes: n unless the connection ends first."""
        while len(self.buf) < n:
            if not self.fill():
                break
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def readline(self, limit):
        """Up to and including the next b"\\n", at most limit bytes."""
        while True:
            i = self.buf.find(b"\n", 0, limit)
            if i >= 0:
                return self.read(i + 1)
            if len(self.buf) >= limit or not self.fill():
                return self.read(limit)



def read_exact(rfile, n, what):
    data = rfile.read(n)
    if data is None or len(data) != n:
        raise BadRequest("connection closed inside the %s" % what)
    return data


def read_head(rfile):
    """Reads the netstring head and returns the variables as a dict of str (latin-1, as
    PEP 3333 wants native strings), strictly checked."""
    limit = MAX_HEADER_DIGITS + 1
    while True:
        buf = rfile.buf
        colon = buf.find(b":", 0, limit)
        lead = buf[:colon] if colon >= 0 else buf[:limit]
        if lead and not lead.isdigit():
            bad = [c for c in lead if not 48 <= c <= 57]
            raise BadRequest("netstring length holds %r, not a digit" % bytes(bad[:1]))
        if colon >= 0:
            break
        if len(buf) >= limit:
            raise BadRequest("netstring length has more than %d digits" % MAX_HEADER_DIGITS)
        if not rfile.fill():
            if not buf:
                return None  # connected and closed without a request: not an error
            raise BadRequest("connection closed inside the netstring length")
    digits = rfile.read(colon)
    rfile.read(1)
    if not digits:
        raise BadRequest("netstring length is empty")
    if len(digits) > 1 and digits.startswith(b"0"):
        raise BadRequest("netstring length %s has a leading zero" % digits.decode())
    size = int(digits)
    if size > MAX_HEADER:
        raise BadRequest("SCGI head of %d bytes is over the %d byte limit" % (size, MAX_HEADER))
    payload = read_exact(rfile, size, "SCGI head")
    if read_exact(rfile, 1, "netstring end") != b",":
        raise BadRequest("netstring does not end with ','")
    if not payload.endswith(b"\0"):
        raise BadRequest("SCGI head does not end with NUL")
    # One decode and one split for the whole head; names and values alternate.
    fields = payload[:-1].decode("latin-1").split("\0")
    if len(fields) % 2:
        raise BadRequest("SCGI head has a name without a value")
    names = fields[0::2]
    environ = dict(zip(names, fields[1::2]))
    if len(environ) != len(names):
        seen = set()
        repeated = next(n for n in names if n in seen or seen.add(n))
        raise BadRequest("SCGI head repeats the variable %s" % repeated)
    if "" in environ:
        raise BadRequest("SCGI head has an empty variable name")
    if names[0] != "CONTENT_LENGTH":
        raise BadRequest("SCGI head does not start with CONTENT_LENGTH")
    length = fields[1]
    if not length.isdigit() or not length.isascii():
        raise BadRequest("CONTENT_LENGTH %r is not a decimal number" % length)
    if environ.get("SCGI") != "1":
        raise BadRequest("SCGI head does not carry SCGI=1")
    return environ


# ---------------------------------------------------------------------------------------
# wsgi.input


class Input:
    """wsgi.input: the request body, exactly CONTENT_LENGTH bytes streamed from the socket;
    reads past the end give b"" (so wsgi.input_terminated holds)."""

    def __init__(self, rfile, length):
        self._rfile = rfile
        self._left = length

    def _take(self, data):
        self._left -= len(data)
        if not data and self._left:
            self._left = 0  # corral closed early; the app sees a short body, then EOF
        return data

    def read(self, size=-1):
        if size is None or size < 0:
            parts = []
            while self._left:
                part = self._take(self._rfile.read(min(self._left, CHUNK)))
                if not part:
                    break
                parts.append(part)
            return b"".join(parts)
        if not self._left or size == 0:
            return b""
        return self._take(self._rfile.read(min(size, self._left)) or b"")

    def readline(self, size=-1):
        if not self._left:
            return b""
        limit = self._left if size is None or size < 0 else min(size, self._left)
        return self._take(self._rfile.readline(limit))

    def readlines(self, hint=-1):
        lines = []
        total = 0
        while True:
            line = self.readline()
            if not line:
                return lines
            lines.append(line)
            total += len(line)
            if hint is not None and 0 < hint <= total:
                return lines

    def __iter__(self):
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def drain(self):
        """Discards what the app left unread, up to MAX_DRAIN."""
        budget = MAX_DRAIN
        while self._left and budget > 0:
            part = self._take(self._rfile.read(min(self._left, CHUNK, budget)) or b"")
            if not part:
                break
            budget -= len(part)


# ---------------------------------------------------------------------------------------
# One request


def build_environ(environ, rfile):
    del environ["SCGI"]
    length = int(environ["CONTENT_LENGTH"])
    if not environ.get("CONTENT_TYPE", "x"):
        del environ["CONTENT_TYPE"]
    environ.setdefault("REQUEST_METHOD", "GET")
    environ.setdefault("SERVER_NAME", "localhost")
    environ.setdefault("SERVER_PORT", "80")
    environ.setdefault("SERVER_PROTOCOL", "HTTP/1.1")
    environ.setdefault("QUERY_STRING", "")
    script = environ.get("SCRIPT_NAME", "")
    path = environ.get("PATH_INFO", "")
    # PEP 3333: SCRIPT_NAME is "" for an app at the root, never "/" or "/x/".
    if script.endswith("/"):
        script = script.rstrip("/")
        path = "/" + path.lstrip("/")
    environ["SCRIPT_NAME"] = script
    environ["PATH_INFO"] = path
    https = environ.get("HTTPS", "").lower() in ("on", "1", "yes")
    body = Input(rfile, length)
    environ.update(
        {
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https" if https else "http",
            "wsgi.input": body,
            "wsgi.input_terminated": True,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.file_wrapper": FileWrapper,
        }
    )
    return environ, body


class FileWrapper:
    """wsgi.file_wrapper: a file-like object sent in blocks (PEP 3333's optional
    platform-specific file handling; here it only saves the app writing the loop)."""

    def __init__(self, filelike, blksize=8192):
        self.filelike = filelike
        self.blksize = blksize
        if hasattr(filelike, "close"):
            self.close = filelike.close

    def __iter__(self):
        while True:
            block = self.filelike.read(self.blksize)
            if not block:
                return
            yield block


class Response:
    """start_response and write() for one request, and the CGI head they produce."""

    def __init__(self, conn):
        self.conn = conn
        self.status = None
        self.headers = None
        self.head_sent = False

    def start_response(self, status, headers, exc_info=None):
        if exc_info:
            try:
                if self.head_sent:
                    # Too late to change the answer: PEP 3333 says re-raise.
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("start_response() called twice without exc_info")
        if type(status) is not str or not STATUS_RE.match(status):
            raise ValueError("status %r is not '<3 digits> <reason>'" % (status,))
        if type(headers) is not list:
            raise TypeError("headers must be a list, not %s" % type(headers).__name__)
        checked = []
        for item in headers:
            if type(item) is not tuple or len(item) != 2:
                raise TypeError("header %r is not a (name, value) tuple" % (item,))
            name, value = item
            if type(name) is not str or not TOKEN_RE.match(name):
                raise ValueError("header name %r is not an HTTP token" % (name,))
            if type(value) is not str or not VALUE_RE.match(value):
                raise ValueError("header %s has a value with a control character" % name)
            if name.lower() == "status":
                raise ValueError("a header named Status would be read as the CGI status")
            if name.lower() in HOP_BY_HOP:
                log("dropped hop-by-hop header %s: %s (the gateway owns the connection)"
                    % (name, value))
                continue
            checked.append((name, value))
        try:
            (status + "".join(n + v for n, v in checked)).encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError("status or header is not latin-1 text") from None
        self.status = status
        self.headers = checked
        return self.write

    def write(self, data):
        if self.status is None:
            raise AssertionError("write() before start_response()")
        if type(data) is not bytes:
            raise TypeError("response data must be bytes, not %s" % type(data).__name__)
        if data:
            self._send(data)

    def finish(self):
        """Sends the head if no body chunk carried it (an empty body)."""
        if self.status is None:
            raise AssertionError("the application returned without calling start_response()")
        if not self.head_sent:
            self._send(b"")

    def _send(self, data):
        if not self.head_sent:
            lines = ["Status: %s\r\n" % self.status]
            lines.extend("%s: %s\r\n" % h for h in self.headers)
            lines.append("\r\n")
            data = "".join(lines).encode("latin-1") + data
            self.head_sent = True
        try:
            self.conn.sendall(data)
        except OSError as e:
            raise ClientGone(e) from None


def error_response(conn):
    head = (
        b"Status: 500 Internal Server Error\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\n\r\n" % len(ERROR_BODY)
    )
    try:
        conn.sendall(head + ERROR_BODY)
    except OSError:
        pass


def run_app(app, environ, conn):
    """Calls the app and streams its answer; an error before the head becomes a 500."""
    response = Response(conn)
    result = None
    try:
        result = app(environ, response.start_response)
        for chunk in result:
            if type(chunk) is not bytes:
                raise TypeError("the app yielded %s, not bytes" % type(chunk).__name__)
            if chunk:
                if response.status is None:
                    raise AssertionError(
                        "the application gave a body chunk before calling start_response()")
                response.write(chunk)
        response.finish()
    except ClientGone as e:
        log("%s %s: connection closed while answering (%s)"
            % (environ["REQUEST_METHOD"], request_uri(environ), e))
    except Exception:
        log("%s %s: the application raised an error:\n%s"
            % (environ["REQUEST_METHOD"], request_uri(environ), traceback.format_exc()))
        if not response.head_sent:
            error_response(conn)
        # Otherwise the answer is cut short: closing the connection is all there is left.
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                log("the response iterable's close() raised:\n%s" % traceback.format_exc())


def request_uri(environ):
    uri = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    if environ.get("QUERY_STRING"):
        uri += "?" + environ["QUERY_STRING"]
    return uri


def serve_connection(app, conn):
    # Reads time out after HEADER_TIMEOUT through SO_RCVTIMEO, which the connection took
    # over from the listener (see serve): no per-connection timeout calls, and the socket
    # stays blocking, so a recv is one system call rather than a poll and a recv.
    rfile = Reader(conn)
    try:
        try:
            head = read_head(rfile)
        except BadRequest as e:
            log("bad SCGI request, connection closed: %s" % e)
            return
        except OSError as e:
            log("could not read the SCGI request head: %s" % e)
            return
        if head is None:
            return
        environ, body = build_environ(head, rfile)
        run_app(app, environ, conn)
        if body._left:
            try:
                # EOF ends the answer for corral at once; the body the app left unread is
                # then read and discarded, so closing does not reset a connection corral
                # still writes.
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(DRAIN_TIMEOUT)
                body.drain()
            except OSError:
                pass
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# The accept loop and signals


class Stop(Exception):
    """A stop signal came while the worker waited for a connection."""


class Stopper:
    """SIGTERM and SIGINT raise a flag; a request in progress is finished first (Python
    retries interrupted system calls), and a worker waiting in accept() stops at once (the
    handler raises out of it). The wakeup fd interrupts the preloader's select()."""

    def __init__(self):
        self.stopping = False
        self.idle = False
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum, frame):
        self.stopping = True
        if self.idle:
            raise Stop()


def serve(app, listener, stopper):
    # Inherited by every accepted connection (Linux copies SO_RCVTIMEO to it).
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack("ll", int(HEADER_TIMEOUT), 0))
    while not stopper.stopping:
        stopper.idle = True
        try:
            if stopper.stopping:
                return
            conn, _ = listener.accept()
        except Stop:
            return
        except OSError as e:
            stopper.idle = False
            log("accept failed: %s" % e)
            continue
        stopper.idle = False
        serve_connection(app, conn)


# ---------------------------------------------------------------------------------------
# The demo app of corral's embedded default configuration


DEMO_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>corral is running</title></head>
<body>
<h1>corral is running</h1>
<p>This page comes from <code>corral_demo</code>, a WSGI app served through corral's
embedded WSGI launcher (SCGI on fd 0), one request at a time per worker.</p>
<ul>
<li>Request path: <code>{path}</code></li>
<li>Python: <code>{python}</code></li>
<li>Worker pid: <code>{pid}</code></li>
</ul>
<p>See <a href="{env}">{env}</a> for the WSGI environ keys this request carried.</p>
<p>Point a pool at your own app with <code>app = "wsgi:module:callable"</code>.</p>
</body>
</html>
"""


def demo_application(environ, start_response):
    """corral_demo.application: a page saying what is serving it; /env lists environ keys."""
    script = environ.get("SCRIPT_NAME", "")
    path = environ.get("PATH_INFO", "") or "/"
    if path == "/env":
        body = "".join(k + "\n" for k in sorted(environ)).encode("utf-8")
        ctype = "text/plain; charset=utf-8"
    else:
        body = DEMO_PAGE.format(
            path=html.escape(script + path),
            python=html.escape("%s %s" % (platform.python_implementation(),
                                          platform.python_version())),
            pid=os.getpid(),
            env=html.escape(script + "/env"),
        ).encode("utf-8")
        ctype = "text/html; charset=utf-8"
    start_response("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [body]


def install_demo():
    module = types.ModuleType("corral_demo", "corral's built-in demo WSGI app.")
    module.application = demo_application
    sys.modules["corral_demo"] = module


# ---------------------------------------------------------------------------------------
# Start-up


def activate_virtualenv():
    """When the interpreter is a virtual environment's (the pool's `python` or `virtualenv`),
    makes its environment look activated, as `bin/activate` would: VIRTUAL_ENV names it and
    its bin/ comes first on PATH, so programs the app starts (its own console scripts, a
    `python` it calls) are the environment's too. The imports need nothing: this Python
    found the environment's site-packages from the path it was started by."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return None
    os.environ["VIRTUAL_ENV"] = sys.prefix
    bin_dir = os.path.join(sys.prefix, "bin")
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + (os.pathsep + path if path else "")
    return sys.prefix


def load_app(spec):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit("corral-wsgi: expected module:callable, got %r" % spec)
    sys.path.insert(0, os.getcwd())
    if module_name == "corral_demo":
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != "corral_demo":
                raise
            install_demo()
    app = importlib.import_module(module_name)
    for part in attr.split("."):
        app = getattr(app, part)
    if not callable(app):
        raise SystemExit("corral-wsgi: %s is not callable" % spec)
    return app


# ---------------------------------------------------------------------------------------
# Preload and fork

# Longest control message either way; corral's are a few bytes.
MAX_CONTROL = 256
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(parent):
    """SIGKILL this worker when the preloader (its parent) dies, so no worker outlives the
    process corral tracks it through; a worker whose parent is already gone exits."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError, ImportError) as e:
        log("cannot set the parent-death signal: %s" % e)
    if os.getppid() != parent:
        os._exit(1)


def exit_text(status):
    if os.WIFSIGNALED(status):
        return "signal %d" % os.WTERMSIG(status)
    return "code %d" % os.waitstatus_to_exitcode(status)


def reap(control):
    """Reports every worker that ended; a report that cannot be sent means corral is gone."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(("exited %d %s" % (pid, exit_text(status))).encode("ascii"))


def fork_worker(app, control, stopper, listener_fd):
    """Forks one worker serving `listener_fd`; returns its pid (in the preloader)."""
    parent = os.getpid()
    # A stop signal reaching the child before it has its own handlers would set the
    # preloader's flag, copied into the child and then forgotten: hold them until then.
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        os.close(listener_fd)
        return pid
    code = 0
    try:
        # Its own session and process group, as a spawned worker has: corral signals the
        # group and sums memory over the worker's own process tree.
        os.setsid()
        set_parent_death_signal(parent)
        control.close()
        signal.set_wakeup_fd(-1)
        os.close(stopper.wake_r)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # The preloader's random state must not be every worker's.
        random.seed()
        listener = socket.socket(fileno=listener_fd)
        listener.setblocking(True)
        log("worker %d forked from preloader %d" % (os.getpid(), parent))
        own = Stopper()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        serve(app, listener, own)
    except BaseException:
        log("worker failed:\n%s" % traceback.format_exc())
        code = 1
    finally:
        # Never back into the preloader's loop, and none of its exit handlers.
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os._exit(code)


def preload(app, control, stopper):
    """The preloader's loop: fork workers on request, reap them, report both."""
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    # Collected once, then moved out of the collector's sight: a worker's collections would
    # otherwise write to every preloaded object's header and unshare its page.
    gc.collect()
    gc.freeze()
    control.send(("ready %d" % os.getpid()).encode("ascii"))
    while not stopper.stopping:
        try:
            readable, _, _ = select.select([control, stopper.wake_r], [], [])
        except InterruptedError:
            continue
        if stopper.wake_r in readable:
            try:
                os.read(stopper.wake_r, 64)
            except BlockingIOError:
                pass
        reap(control)
        if control not in readable or stopper.stopping:
            continue
        msg, fds, _, _ = socket.recv_fds(control, MAX_CONTROL, 4)
        if not msg:
            for fd in fds:
                os.close(fd)
            log("corral closed the control socket; the preloader exits")
            return
        words = msg.split()
        if len(words) != 2 or words[0] != b"fork" or not words[1].isdigit() or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            log("ignoring a malformed control message (%d bytes, %d descriptors)" % (len(msg), len(fds)))
            continue
        pid = fork_worker(app, control, stopper, fds[0])
        control.send(b"forked %s %d" % (words[1], pid))


def main(argv):
    preloading = len(argv) == 3 and argv[2] == "--preload"
    if len(argv) != 2 and not preloading:
        raise SystemExit("usage: corral-wsgi.py module:callable [--preload] (listening or control socket on fd 0)")
    # Keep the listening socket off fd 0 and give fd 0 /dev/null, so an app that reads
    # stdin cannot steal bytes from the socket.
    listener = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    listener.setblocking(True)
    # print() in an app should reach corral's log line by line, not when a buffer fills.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    # Signals are caught before the app is imported: a stop during a slow import exits 0
    # once the import is done, instead of dying mid-import.
    stopper = Stopper()
    venv = activate_virtualenv()
    try:
        app = load_app(argv[1])
    except SystemExit:
        raise
    except BaseException:
        log("cannot load %s:\n%s" % (argv[1], traceback.format_exc()))
        return 1
    log("%s %s (Python %s at %s%s, pid %d)" % (
        "preloaded" if preloading else "serving",
        argv[1], platform.python_version(), sys.executable,
        ", virtualenv %s" % venv if venv else "", os.getpid()))
    if preloading:
        try:
            preload(app, listener, stopper)
        except OSError as e:
            # corral went away mid-message: nothing left to serve.
            log("control socket failed: %s" % e)
        return 0
    serve(app, listener, stopper)
    log("stopped on signal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
