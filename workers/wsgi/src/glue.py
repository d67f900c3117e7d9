"""The Python half of corral's native WSGI worker, run once when the interpreter starts: what
is simpler in Python than in C and runs once per worker (loading the app, the virtualenv's
activation, the stack dump on SIGUSR2) or once per request with a body (wsgi.input). The
request loop, the environ and start_response are the worker's own (python.c, Rust)."""

import faulthandler
import http
import importlib
import io
import os
import signal
import sys

import _corral_wsgi

# "200 OK" and the like: sent as the status code alone; any other reason phrase also goes as
# a `Status:` line, which corral keeps for a CGI front when the codes agree.
CANONICAL = frozenset("%d %s" % (s.value, s.phrase) for s in http.HTTPStatus)


class FileWrapper:
    """wsgi.file_wrapper: a file-like object sent in blocks."""

    def __init__(self, filelike, blksize=8192):
        self.filelike = filelike
        self.blksize = blksize
        if hasattr(filelike, "close"):
            self.close = filelike.close

    def __iter__(self):
        read, size = self.filelike.read, self.blksize
        while True:
            block = read(size)
            if not block:
                return
            yield block


# What every environ holds before the request's own variables; the defaults PEP 3333 needs
# are overwritten by what corral sends.
BASE = {
    "wsgi.version": (1, 0),
    "wsgi.input_terminated": True,
    "wsgi.errors": sys.stderr,
    "wsgi.multithread": False,
    "wsgi.multiprocess": True,
    "wsgi.run_once": False,
    "wsgi.file_wrapper": FileWrapper,
    "wsgi.url_scheme": "http",
    "REQUEST_METHOD": "GET",
    "SCRIPT_NAME": "",
    "PATH_INFO": "",
    "QUERY_STRING": "",
    "SERVER_NAME": "localhost",
    "SERVER_PORT": "80",
    "SERVER_PROTOCOL": "HTTP/1.1",
}


class _Raw(io.RawIOBase):
    """The request body as it arrives on corral's connection, read on demand: a large body is
    never held whole. `gen` names the request; after it ended, reads fail."""

    def __init__(self, gen):
        self.gen = gen

    def readable(self):
        return True

    def readinto(self, buffer):
        return _corral_wsgi.readinto(self.gen, buffer)


def make_input(gen):
    """wsgi.input for request `gen`: read, readline, readlines and iteration, buffered."""
    return io.BufferedReader(_Raw(gen), 65536)


def activate_virtualenv():
    """When this interpreter is a virtual environment's (found from the pool's `python` or
    `virtualenv` path, as bin/python finds it), makes it look activated as `bin/activate`
    would: VIRTUAL_ENV, and its bin/ first on PATH."""
    if sys.prefix == sys.base_prefix:
        return None
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    try:
        with open(cfg, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip() in ("version", "version_info"):
                    want = ".".join(value.strip().split(".")[:2])
                    have = "%d.%d" % sys.version_info[:2]
                    if want != have:
                        raise SystemExit(
                            "the virtualenv %s is for Python %s; this worker embeds Python %s: "
                            "make the virtualenv with python%s, or use the pure-Python launcher "
                            "(leave out worker = \"native\")" % (sys.prefix, want, have, have))
    except OSError:
        pass
    os.environ["VIRTUAL_ENV"] = sys.prefix
    bin_dir = os.path.join(sys.prefix, "bin")
    path = os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + (os.pathsep + path if path else "")
    return sys.prefix


def load(spec):
    """The app `module:callable` names, imported with the working directory first on
    sys.path."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit("expected module:callable, got %r" % spec)
    try:
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True, chain=True)
    except (OSError, ValueError, RuntimeError, AttributeError) as e:
        sys.stderr.write("corral-wsgi-worker: cannot install the stack dump on SIGUSR2: %s\n" % e)
    venv = activate_virtualenv()
    sys.path.insert(0, os.getcwd())
    app = importlib.import_module(module_name)
    for part in attr.split("."):
        app = getattr(app, part)
    if not callable(app):
        raise SystemExit("%s is not callable" % spec)
    sys.stderr.write("corral-wsgi-worker: serving %s (Python %s at %s%s, pid %d)\n" % (
        spec, sys.version.split()[0], sys.executable,
        ", virtualenv %s" % venv if venv else "", os.getpid()))
    return app


def check():
    """`--check`: the interpreter starts and a virtualenv fits it."""
    activate_virtualenv()
