"""corral's WSGI launcher: serves one PEP 3333 application over LSAPI on the listening socket
corral hands over as fd 0, one connection at a time and on it any number of sequential
requests, with only Python's standard library.

    python3 corral-wsgi.py module:callable
    python3 corral-wsgi.py module:callable --preload

The module is imported with the worker's working directory first on sys.path. corral keeps
its connection open between requests (protocols/LSAPI.md, the same framing the Rack
launcher speaks). Per request corral sends one BEGIN_REQUEST packet (the CGI variables as
env pairs, the HTTP headers through the known-header index and the unknown-header table)
followed by exactly the announced number of raw body bytes, which are read whole before the
app is called (in memory up to MEMORY_BODY, in an unlinked temporary file above), so the
connection is in step for the next request whatever the app reads. This side answers
REQ_RECEIVED, RESP_HEADER, RESP_STREAM packets of at most 16 KiB and RESP_END, with every
integer in the byte order the request used; a small answer is one write. SIGTERM and SIGINT
finish the request in progress and exit 0. Bad LSAPI input closes that connection and is
logged on stderr (which corral copies into its own log); the launcher keeps serving.
SIGUSR2 writes every thread's stack to stderr, then the line `corral-stacks: end of pid PID`:
corral asks for it before it kills a worker past request_timeout and when a request passes
slow_threshold (ARCHITECTURE.md, "Stacks of a stuck worker").

With --preload, fd 0 is instead a SOCK_SEQPACKET control socket to corral and this process is
the pool's preloader (ARCHITECTURE.md, "Preload and fork"): it loads the app once, says
`ready PID`, and for each `fork KEY` message (carrying the worker's listening socket by
SCM_RIGHTS) forks a worker that serves that socket as above, answering `forked KEY PID`; it
reaps its workers and reports `exited PID code N` or `exited PID signal N`. It exits when
corral closes the control socket or on SIGTERM. For a pool with refork_after, `fork KEY`
carries a second descriptor, the worker's own control socket: when corral writes `promote`
there and sends SIGURG, the idle worker closes its listener and becomes the template on that
socket, speaking the same protocol (docs/pools.md, "Reforking").
"""

import faulthandler
import gc
import html
import http
import importlib
import io
import os
import platform
import random
import re
import select
import signal
import socket
import struct
import sys
import tempfile
import traceback
import types
from itertools import compress

# Packet types (lsapidef.h).
BEGIN_REQUEST = 1
ABORT_REQUEST = 2
RESP_HEADER = 3
RESP_STREAM = 4
RESP_END = 5
REQ_RECEIVED = 7

PACKET_HEADER_LEN = 8
REQ_HEADER_LEN = 44
HEADER_INDEX_LEN = 152
UNKNOWN_ENTRY_LEN = 16
# The smallest BEGIN_REQUEST: the request header, two empty env lists, the index.
MIN_BEGIN_REQUEST = REQ_HEADER_LEN + 8 + HEADER_INDEX_LEN
# lsphp refuses a BEGIN_REQUEST or RESP_HEADER over this size.
MAX_HEADER_PACKET = 65535
# Largest RESP_STREAM payload (LSAPI_MAX_DATA_PACKET_LEN).
MAX_DATA = 16384
MAX_ENV_PAIRS = 8192
MAX_RESP_HEADERS = 1000
# Longest response header line; its length travels as an int16.
MAX_HEADER_LINE = 32766
# m_reqBodyLen value meaning "2 GiB or more, read Content-Length".
BODY_LEN_FROM_CONTENT_LENGTH = -2
MAX_BODY_DIGITS = 18
# Bodies above this go to an unlinked temporary file instead of memory.
MEMORY_BODY = 1 << 20
# A packet (or body) not complete this long after it started is given up, and the
# connection closed: SO_RCVTIMEO on each accepted connection.
READ_TIMEOUT = 60
# accept() returns at least this often (SO_RCVTIMEO on the listener), so that a stop or
# promotion signal that came just before the call began (Python runs its handler only
# when the call returns) is acted on within this bound, not after READ_TIMEOUT.
ACCEPT_WAIT = 1
# Read size; one recv usually holds the whole BEGIN_REQUEST and a small body.
CHUNK = 64 * 1024
# Response bytes queued before they are written: an answer up to this size is one write.
FLUSH_AT = 64 * 1024

# The known-header index, slot by slot, as CGI variables. Slot 24 (Transfer-Encoding) is
# skipped, as lsphp does: the body always arrives with its length.
KNOWN_HEADERS = (
    "HTTP_ACCEPT", "HTTP_ACCEPT_CHARSET", "HTTP_ACCEPT_ENCODING", "HTTP_ACCEPT_LANGUAGE",
    "HTTP_AUTHORIZATION", "HTTP_CONNECTION", "CONTENT_TYPE", "CONTENT_LENGTH", "HTTP_COOKIE",
    "HTTP_COOKIE2", "HTTP_HOST", "HTTP_PRAGMA", "HTTP_REFERER", "HTTP_USER_AGENT",
    "HTTP_CACHE_CONTROL", "HTTP_IF_MODIFIED_SINCE", "HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH",
    "HTTP_IF_RANGE", "HTTP_IF_UNMODIFIED_SINCE", "HTTP_KEEP_ALIVE", "HTTP_RANGE",
    "HTTP_X_FORWARDED_FOR", "HTTP_VIA",
)
N_KNOWN = len(KNOWN_HEADERS)

STATUS_RE = re.compile(r"[1-9][0-9][0-9] [^\x00-\x1f\x7f]*\Z")
TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
VALUE_RE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*\Z")
HOP_BY_HOP = frozenset(
    "connection keep-alive proxy-authenticate proxy-authorization te trailer "
    "transfer-encoding upgrade".split()
)
# "200 OK" and the like: valid without the regular expression, and sent as the status
# field alone. Any other reason phrase also goes as a `Status:` line, which corral keeps
# for a CGI front when the codes agree.
CANONICAL_STATUS = frozenset("%d %s" % (s.value, s.phrase) for s in http.HTTPStatus)

ERROR_BODY = b"Internal Server Error\n"

# Whether the LiteSpeed library built for this machine reads flag 0 as little-endian (x86
# and big-endian CPUs) or, on other little-endian CPUs, as big-endian (protocols/LSAPI.md §1).
LITERAL_FLAG = sys.byteorder == "big" or platform.machine().lower() in (
    "x86_64", "amd64", "i386", "i486", "i586", "i686", "x86")


def log(message):
    """One line on stderr, which corral logs with this worker's pool and pid."""
    try:
        sys.stderr.write("corral-wsgi: %s\n" % message)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# corral asks for a worker's stacks with this signal (src/process/stacks.rs) and reads them
# from stderr up to the end line.
STACK_SIGNAL = signal.SIGUSR2
STACK_END = "corral-stacks: end of pid %d\n"


def install_stack_dump():
    """Makes STACK_SIGNAL dump every thread's stack on stderr. faulthandler writes the stacks
    from the C signal handler itself, so a worker stuck in C code holding the GIL (a
    runaway regular expression) still answers; it then chains to the Python handler, which
    writes the end line once the interpreter runs Python code again (a sleep or a blocking
    read is interrupted for it and then resumed). Set before the app is imported, so a hung
    import can be asked too; forked workers inherit it and name their own pid."""
    def end_of_stacks(signum, frame):
        try:
            sys.stderr.write(STACK_END % os.getpid())
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    try:
        signal.signal(STACK_SIGNAL, end_of_stacks)
        faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True, chain=True)
    except (OSError, ValueError, RuntimeError, AttributeError) as e:
        log("cannot install the stack dump on SIGUSR2: %s" % e)


class BadRequest(Exception):
    """The peer broke an LSAPI rule; the connection is closed without an answer."""


class ClientGone(Exception):
    """corral closed the connection while the response was being written."""


# ---------------------------------------------------------------------------------------
# Byte orders


class Order:
    """The integer formats of one byte order, compiled once."""

    __slots__ = ("flag", "e", "fields", "index", "packet", "received", "end", "heads")

    def __init__(self, big, flag):
        e = ">" if big else "<"
        self.flag = flag
        self.e = e
        # The nine int32 of the request header after the packet header.
        self.fields = struct.Struct(e + "9i")
        # The known-header index in one unpack: 24 lengths, slot 24's length and the
        # padding skipped, 24 offsets (slot 24's offset is never read).
        self.index = struct.Struct("%s%dH4x%di" % (e, N_KNOWN, N_KNOWN))
        # A packet header: magic, type, flag, whole length.
        self.packet = struct.Struct(e + "2sBBi")
        self.received = self.packet.pack(b"LS", REQ_RECEIVED, flag, PACKET_HEADER_LEN)
        self.end = self.packet.pack(b"LS", RESP_END, flag, PACKET_HEADER_LEN)
        # RESP_HEADER's packet header, count, status and line lengths, by line count.
        self.heads = {}

    def head_struct(self, n):
        s = self.heads.get(n)
        if s is None:
            s = self.heads[n] = struct.Struct("%s2sBBiii%dH" % (self.e, n))
        return s


ORDERS = {}
for _flag in (0, 1):
    ORDERS[_flag] = Order((_flag == 1) == LITERAL_FLAG, _flag)
del _flag

# Env pair lengths are always big-endian, whatever the flag says.
PAIR_LENGTHS = struct.Struct(">HH").unpack_from


# ---------------------------------------------------------------------------------------
# Reading a request


class Connection:
    """One kept LSAPI connection: its receive buffer, and how many requests it carried."""

    __slots__ = ("sock", "buf", "served")

    def __init__(self, sock):
        self.sock = sock
        # Bytes received and not yet consumed; usually empty between requests.
        self.buf = b""
        self.served = 0

    def need(self, n, what):
        """Receives until at least n bytes are buffered."""
        buf = self.buf
        while len(buf) < n:
            try:
                data = self.sock.recv(CHUNK)
            except BlockingIOError:
                raise BadRequest("%s not complete after %d s (%d of %d bytes)"
                                 % (what, READ_TIMEOUT, len(buf), n)) from None
            if not data:
                raise BadRequest("connection closed inside the %s (%d of %d bytes)"
                                 % (what, len(buf), n))
            buf = buf + data if buf else data
        self.buf = buf
        return buf

    def body(self, length):
        """wsgi.input for `length` raw body bytes, read whole now."""
        buf = self.buf
        if length <= len(buf):
            # The usual small body: it came in the same recv as its BEGIN_REQUEST.
            self.buf = buf[length:]
            return io.BytesIO(buf[:length])
        if length <= MEMORY_BODY:
            return io.BytesIO(self.take_exact(length))
        spool = tempfile.TemporaryFile(prefix="corral-wsgi-body-")
        try:
            left = length - len(buf)
            spool.write(buf)
            self.buf = b""
            sock = self.sock
            while left:
                try:
                    data = sock.recv(min(left, CHUNK))
                except BlockingIOError:
                    raise BadRequest("body not complete after %d s (%d of %d bytes)"
                                     % (READ_TIMEOUT, length - left, length)) from None
                if not data:
                    raise BadRequest("connection closed inside the body (%d of %d bytes)"
                                     % (length - left, length))
                spool.write(data)
                left -= len(data)
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return spool

    def take_exact(self, length):
        buf = self.buf
        into = bytearray(length)
        into[:len(buf)] = buf
        got = len(buf)
        self.buf = b""
        view = memoryview(into)
        sock = self.sock
        while got < length:
            try:
                n = sock.recv_into(view[got:])
            except BlockingIOError:
                raise BadRequest("body not complete after %d s (%d of %d bytes)"
                                 % (READ_TIMEOUT, got, length)) from None
            if not n:
                raise BadRequest("connection closed inside the body (%d of %d bytes)"
                                 % (got, length))
            got += n
        return bytes(into)


def read_request(conn):
    """Reads and checks one BEGIN_REQUEST from `conn.buf` (at least its first byte is
    there). Returns (order, environ without the wsgi.* keys, body length), or None for an
    ABORT_REQUEST. Every length and offset is checked against the packet before it is
    used; nothing a peer sends can raise anything but BadRequest."""
    buf = conn.need(PACKET_HEADER_LEN, "packet header")
    if buf[:2] != b"LS":
        raise BadRequest("packet magic is %r, not b'LS'" % buf[:2])
    kind = buf[2]
    order = ORDERS[buf[3] & 1]
    _, _, _, length = order.packet.unpack_from(buf)
    if kind == ABORT_REQUEST and length == PACKET_HEADER_LEN:
        return None  # corral gives up on the connection: close it
    if kind != BEGIN_REQUEST:
        raise BadRequest("packet type %d is not BEGIN_REQUEST (1)" % kind)
    if not MIN_BEGIN_REQUEST <= length <= MAX_HEADER_PACKET:
        raise BadRequest("BEGIN_REQUEST length %d is outside %d..%d"
                         % (length, MIN_BEGIN_REQUEST, MAX_HEADER_PACKET))
    buf = conn.need(length, "BEGIN_REQUEST")
    if len(buf) == length:
        p, conn.buf = buf, b""
    else:
        p, conn.buf = buf[:length], buf[length:]
    (header_len, body_len, off0, off1, off2, off3, unknown, env_count,
     special_count) = order.fields.unpack_from(p, PACKET_HEADER_LEN)
    if not (0 <= off0 < length and 0 <= off1 < length and 0 <= off2 < length
            and 0 <= off3 < length):
        raise BadRequest("a string offset (%d, %d, %d, %d) is outside the %d-byte packet"
                         % (off0, off1, off2, off3, length))
    if header_len < 0:
        raise BadRequest("m_httpHeaderLen %d is negative" % header_len)
    if body_len < 0 and body_len != BODY_LEN_FROM_CONTENT_LENGTH:
        raise BadRequest("m_reqBodyLen %d is negative" % body_len)
    if not (0 <= env_count <= MAX_ENV_PAIRS and 0 <= special_count <= MAX_ENV_PAIRS):
        raise BadRequest("env pair counts %d and %d are outside 0..%d"
                         % (special_count, env_count, MAX_ENV_PAIRS))
    if unknown < 0:
        raise BadRequest("unknown header count %d is negative" % unknown)

    # One decode for the whole packet: latin-1 maps byte i to character i, so every offset
    # holds in the text too, and PEP 3333 wants latin-1 native strings.
    text = p.decode("latin-1")
    environ = {}
    # The special env (PHP ini settings, suEXEC control) means nothing here: checked, then
    # dropped; the env pairs are the CGI variables.
    if special_count or not p.startswith(b"\0\0\0\0", REQ_HEADER_LEN):
        at = read_pairs(p, text, REQ_HEADER_LEN, special_count, {}, "special env")
    else:
        at = REQ_HEADER_LEN + 4
    at = read_pairs(p, text, at, env_count, environ, "env")
    index_at = (at + 7) & ~7
    if p.count(0, at, index_at) != index_at - at:
        raise BadRequest("padding before the header index is not zero")
    table_at = index_at + HEADER_INDEX_LEN
    head_at = table_at + unknown * UNKNOWN_ENTRY_LEN
    if head_at + header_len != length:
        raise BadRequest("BEGIN_REQUEST sections end at %d, packet length is %d"
                         % (head_at + header_len, length))

    index = order.index.unpack_from(p, index_at)
    offsets = index[N_KNOWN:]
    # Only the headers the request has (compress skips the zero offsets in C).
    for name, size, off in compress(zip(KNOWN_HEADERS, index, offsets), offsets):
        if off < 0 or off + size > header_len:
            raise BadRequest("known header %s value at %d, %d bytes, is outside the "
                             "%d-byte header block" % (name, off, size, header_len))
        at = head_at + off
        if name in environ:
            add_header(environ, name, text[at:at + size])
        else:
            environ[name] = text[at:at + size]
    if unknown:
        table = struct.unpack_from("%s%di" % (order.e, 4 * unknown), p, table_at)
        for i in range(unknown):
            name_off, name_len, value_off, value_len = table[4 * i:4 * i + 4]
            if (name_off < 0 or name_len <= 0 or name_off + name_len > header_len
                    or value_off < 0 or value_len < 0 or value_off + value_len > header_len):
                raise BadRequest("unknown header %d (name %d+%d, value %d+%d) is outside "
                                 "the %d-byte header block" % (
                                     i, name_off, name_len, value_off, value_len, header_len))
            name = "HTTP_" + text[head_at + name_off:head_at + name_off + name_len] \
                .upper().replace("-", "_")
            # Never let a header pose as the entity variables CGI reserves.
            if name != "HTTP_CONTENT_TYPE" and name != "HTTP_CONTENT_LENGTH":
                add_header(environ, name,
                           text[head_at + value_off:head_at + value_off + value_len])

    if body_len == BODY_LEN_FROM_CONTENT_LENGTH:
        declared = environ.get("CONTENT_LENGTH", "")
        if not (declared.isdigit() and declared.isascii()
                and len(declared) <= MAX_BODY_DIGITS):
            raise BadRequest("m_reqBodyLen is -2 but Content-Length %r is not a number"
                             % declared)
        body_len = int(declared)
    return order, environ, body_len


def read_pairs(p, text, at, count, into, what):
    """`count` env pairs from `at` into `into`, then the four-zero-byte terminator; returns
    the offset after it. Pair lengths are big-endian and count the NUL."""
    lengths = PAIR_LENGTHS
    i = 0
    try:
        for i in range(count):
            klen, vlen = lengths(p, at)
            key_end = at + 3 + klen
            value_end = key_end + vlen
            # One test for the usual pair (an index past the end raises IndexError);
            # pair_fault says what is wrong with another.
            if klen > 1 and vlen and text[key_end] == "\0" == text[value_end]:
                into[text[at + 4:key_end]] = text[key_end + 1:value_end]
                at = value_end + 1
            else:
                break
        else:
            if p[at:at + 4] != b"\0\0\0\0":
                raise BadRequest("%s list is not ended by four zero bytes" % what)
            return at + 4
    except (struct.error, IndexError):
        pass
    raise BadRequest(pair_fault(p, text, at, what, i))


def pair_fault(p, text, at, what, i):
    length = len(p)
    if at + 4 > length:
        return "%s pair %d runs past the %d-byte packet" % (what, i, length)
    klen, vlen = PAIR_LENGTHS(p, at)
    if not klen or not vlen:
        return "%s pair %d has a zero length (lengths count the NUL)" % (what, i)
    if at + 3 + klen + vlen >= length:
        return "%s pair %d runs past the %d-byte packet" % (what, i, length)
    if klen == 1:
        return "%s pair %d has an empty name" % (what, i)
    return "%s pair %d is not NUL-terminated" % (what, i)


def add_header(environ, name, value):
    old = environ.get(name)
    if old is None:
        environ[name] = value
    else:
        environ[name] = old + ("; " if name == "HTTP_COOKIE" else ", ") + value


# ---------------------------------------------------------------------------------------
# One request


class FileWrapper:
    """wsgi.file_wrapper: a file-like object sent in blocks (PEP 3333's optional
    platform-specific file handling). Its blocks are queued like a list's rather than each
    written as it is read, since the whole file is there to be read."""

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


# What every environ holds before the request's own variables.
ENVIRON_BASE = {
    "wsgi.version": (1, 0),
    "wsgi.input_terminated": True,
    "wsgi.errors": sys.stderr,
    "wsgi.multithread": False,
    "wsgi.multiprocess": True,
    "wsgi.run_once": False,
    "wsgi.file_wrapper": FileWrapper,
}


def build_environ(environ, conn, body_len):
    """The request's variables plus what PEP 3333 adds; returns the environ."""
    environ.update(ENVIRON_BASE)
    # The body's real length, whatever a header said (corral always sends one for a body).
    environ["CONTENT_LENGTH"] = str(body_len)
    if not environ.get("CONTENT_TYPE", "x"):
        del environ["CONTENT_TYPE"]
    if "REQUEST_METHOD" not in environ or not environ["REQUEST_METHOD"]:
        environ["REQUEST_METHOD"] = "GET"
    environ.setdefault("SERVER_NAME", "localhost")
    environ.setdefault("SERVER_PORT", "80")
    environ.setdefault("SERVER_PROTOCOL", "HTTP/1.1")
    environ.setdefault("QUERY_STRING", "")
    script = environ.get("SCRIPT_NAME", "")
    # PEP 3333: SCRIPT_NAME is "" for an app at the root, never "/" or "/x/".
    if script.endswith("/"):
        environ["SCRIPT_NAME"] = script.rstrip("/")
        environ["PATH_INFO"] = "/" + environ.get("PATH_INFO", "").lstrip("/")
    else:
        environ["SCRIPT_NAME"] = script
        environ.setdefault("PATH_INFO", "")
    https = environ.get("HTTPS")
    environ["wsgi.url_scheme"] = (
        "https" if https and https.lower() in ("on", "1", "yes") else "http")
    # How many requests this connection has carried, this one included: above 1 when
    # corral reuses its kept connection.
    environ["corral.connection_requests"] = conn.served
    environ["wsgi.input"] = conn.body(body_len) if body_len else io.BytesIO()
    return environ


# Header names seen before: name -> its lower-case form, or None for a hop-by-hop header.
# Bounded, so an app inventing names cannot grow it without end.
NAMES = {}
MAX_NAMES = 512


def check_name(name):
    if type(name) is not str or not TOKEN_RE.match(name):
        raise ValueError("header name %r is not an HTTP token" % (name,))
    lower = name.lower()
    if lower == "status":
        raise ValueError("a header named Status would be read as the CGI status")
    verdict = None if lower in HOP_BY_HOP else lower
    if len(NAMES) < MAX_NAMES:
        NAMES[name] = verdict
    return verdict


class Response:
    """start_response and write() for one request, and the packets they produce. Packets
    are queued and written together: the head leaves with the first body chunk, a list
    body with RESP_END."""

    __slots__ = ("sock", "order", "status", "code", "headers", "out", "queued", "sent", "left")

    def __init__(self, sock, order):
        self.sock = sock
        self.order = order
        self.status = None
        self.code = 0
        self.headers = None
        # REQ_RECEIVED leads the first write rather than going alone: corral takes from it
        # only that a byte came, so alone it would wake corral once more per request and
        # end its first_byte_timeout before the app has answered. (A kept connection closed
        # before any byte then reads to corral as stale, not as a suspect worker.)
        self.out = [order.received]
        self.queued = 0
        # Whether any of RESP_HEADER has been written: until then an error can still be a
        # 500 on a connection that stays usable.
        self.sent = False
        # Body bytes the app's one Content-Length still announces, None without one.
        self.left = None

    def start_response(self, status, headers, exc_info=None):
        if exc_info:
            try:
                if self.sent:
                    # Too late to change the answer: PEP 3333 says re-raise.
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("start_response() called twice without exc_info")
        if type(status) is not str or (status not in CANONICAL_STATUS
                                       and not STATUS_RE.match(status)):
            raise ValueError("status %r is not '<3 digits> <reason>'" % (status,))
        if type(headers) is not list:
            raise TypeError("headers must be a list, not %s" % type(headers).__name__)
        checked = []
        names = NAMES
        length = None
        for item in headers:
            if type(item) is not tuple or len(item) != 2:
                raise TypeError("header %r is not a (name, value) tuple" % (item,))
            name, value = item
            verdict = names.get(name, False) if type(name) is str else False
            if verdict is False:
                verdict = check_name(name)
            if type(value) is not str or not (value.isascii() and value.isprintable()
                                              or VALUE_RE.match(value)):
                raise ValueError("header %s has a value with a control character" % name)
            if verdict is None:
                log("dropped hop-by-hop header %s: %s (the gateway owns the connection)"
                    % (name, value))
                continue
            checked.append(name + ": " + value)
            if len(name) == 14 and name.lower() == "content-length":
                # Two of them, or one that is not a plain count: no end is known ahead.
                ok = length is None and value.isascii() and value.isdigit() and len(value) < 19
                length = int(value) if ok else -1
        if status not in CANONICAL_STATUS:
            checked.append("Status: " + status)
        if len(checked) > MAX_RESP_HEADERS:
            raise ValueError("%d response headers, over %d" % (len(checked), MAX_RESP_HEADERS))
        self.status = status
        self.code = int(status[:3])
        self.headers = checked
        self.left = length if length is not None and length >= 0 else None
        return self.write

    def write(self, data):
        """PEP 3333's write(): sent at once."""
        if self.status is None:
            raise AssertionError("write() before start_response()")
        if type(data) is not bytes:
            raise TypeError("response data must be bytes, not %s" % type(data).__name__)
        if data:
            self.chunk(data)
            self.flush()

    def head(self):
        """Queues RESP_HEADER: count, status, each line's length (its NUL included), the
        NUL-terminated lines."""
        lines = self.headers
        self.headers = None
        try:
            text = ("\0".join(lines) + "\0").encode("latin-1") if lines else b""
        except UnicodeEncodeError:
            raise ValueError("a response header is not latin-1 text") from None
        n = len(lines)
        total = PACKET_HEADER_LEN + 8 + 2 * n + len(text)
        if total > MAX_HEADER_PACKET:
            raise ValueError("response headers take %d bytes, over %d"
                             % (total, MAX_HEADER_PACKET))
        lengths = [len(line) + 1 for line in lines]
        if max(lengths, default=0) > MAX_HEADER_LINE:
            raise ValueError("a response header line is longer than %d bytes" % MAX_HEADER_LINE)
        self.out.append(self.order.head_struct(n).pack(
            b"LS", RESP_HEADER, self.order.flag, total, n, self.code, *lengths))
        self.out.append(text)
        self.queued += total

    def chunk(self, data):
        """Queues `data` as RESP_STREAM packets of at most 16 KiB (the head first, once)."""
        if self.headers is not None:
            self.head()
        out = self.out
        pack = self.order.packet.pack
        flag = self.order.flag
        size = len(data)
        if size <= MAX_DATA:
            out.append(pack(b"LS", RESP_STREAM, flag, PACKET_HEADER_LEN + size))
            out.append(data)
        else:
            view = memoryview(data)
            for at in range(0, size, MAX_DATA):
                part = view[at:at + MAX_DATA]
                out.append(pack(b"LS", RESP_STREAM, flag, PACKET_HEADER_LEN + len(part)))
                out.append(part)
        self.queued += size + 8
        if self.left is not None:
            self.left -= size

    def flush(self):
        out = self.out
        if not out:
            return
        self.out = []
        self.queued = 0
        self.sent = self.sent or self.headers is None
        try:
            self.sock.sendall(out[0] if len(out) == 1 else b"".join(out))
        except OSError as e:
            raise ClientGone(e) from None

    def finish(self):
        """Queues the head if no body chunk carried it (an empty body), then RESP_END, and
        writes what is queued."""
        if self.status is None:
            raise AssertionError("the application returned without calling start_response()")
        if self.headers is not None:
            self.head()
        self.out.append(self.order.end)
        self.flush()

    def error(self):
        """Replaces what is queued (nothing of it written yet) with a 500."""
        self.out = [self.order.received] if not self.sent else []
        self.queued = 0
        self.status = "500 Internal Server Error"
        self.code = 500
        self.headers = ["Content-Type: text/plain; charset=utf-8",
                        "Content-Length: %d" % len(ERROR_BODY)]
        self.chunk(ERROR_BODY)
        self.finish()


def run_app(app, environ, sock, order):
    """Calls the app and writes its answer; True when the connection may carry another
    request (the answer ended with RESP_END)."""
    response = Response(sock, order)
    body = environ["wsgi.input"]
    result = None
    if environ.get("CORRAL_READY_PROBE") == "1":
        # corral asking whether the app is loaded (it is: this loop runs only once it is),
        # before the worker gets traffic. The app is not called.
        response.start_response("204 No Content", [])
        response.finish()
        return True
    try:
        result = app(environ, response.start_response)
        # A list or tuple is complete already and leaves whole with RESP_END (up to
        # FLUSH_AT per write), as does a file; any other iterable is written chunk by
        # chunk as it yields, since PEP 3333 forbids holding a block back.
        whole = type(result) in (list, tuple) or type(result) is FileWrapper
        ended = False
        for chunk in result:
            if type(chunk) is not bytes:
                raise TypeError("the app yielded %s, not bytes" % type(chunk).__name__)
            if chunk:
                if ended:
                    # RESP_END has gone: nothing can follow it on this connection.
                    log("%s %s: the application gave more than its Content-Length; the "
                        "connection closes" % (environ["REQUEST_METHOD"], request_uri(environ)))
                    return False
                if response.status is None:
                    raise AssertionError(
                        "the application gave a body chunk before calling start_response()")
                response.chunk(chunk)
                if response.left == 0:
                    # The body its Content-Length announced is whole: RESP_END leaves with
                    # its last bytes, not after the iterable ends. corral stops reading an
                    # answer once it has that many bytes and drops an exchange whose end
                    # has not come with them: an end written later finds the connection
                    # closed, and corral has lost a connection it could keep.
                    response.finish()
                    ended = True
                elif not whole or response.queued >= FLUSH_AT:
                    response.flush()
        if not ended:
            response.finish()
        return True
    except ClientGone as e:
        log("%s %s: connection closed while answering (%s)"
            % (environ["REQUEST_METHOD"], request_uri(environ), e))
        return False
    except Exception:
        log("%s %s: the application raised an error:\n%s"
            % (environ["REQUEST_METHOD"], request_uri(environ), traceback.format_exc()))
        if response.sent:
            # The answer is cut short: closing the connection without RESP_END is all
            # there is left to say.
            return False
        try:
            response.error()
        except ClientGone:
            return False
        return True
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                log("the response iterable's close() raised:\n%s" % traceback.format_exc())
        body.close()


def request_uri(environ):
    uri = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    if environ.get("QUERY_STRING"):
        uri += "?" + environ["QUERY_STRING"]
    return uri


def serve_connection(app, sock, stopper, listener):
    """Serves requests on one connection until corral closes it, a request breaks a rule,
    an answer cannot end cleanly, or a stop signal came."""
    # Reads time out after READ_TIMEOUT through SO_RCVTIMEO, set once on the connection
    # (see serve): the socket stays blocking, so a recv is one system call rather than a
    # poll and a recv.
    conn = Connection(sock)
    try:
        while not stopper.stopping:
            if not conn.buf:
                # Between requests: a stop signal ends the wait at once.
                stopper.idle = True
                try:
                    if stopper.stopping or stopper.promote:
                        return
                    data = sock.recv(CHUNK)
                except BlockingIOError:
                    # Idle for READ_TIMEOUT: keep waiting, unless corral is connecting
                    # anew, meaning it no longer holds this connection for reuse.
                    if select.select([listener], [], [], 0)[0]:
                        return
                    continue
                finally:
                    stopper.idle = False
                if not data:
                    return  # corral closed the connection (or only probed the socket)
                conn.buf = data
            try:
                request = read_request(conn)
            except BadRequest as e:
                log("bad LSAPI request, connection closed: %s" % e)
                return
            except (struct.error, IndexError, ValueError, TypeError) as e:
                log("bad LSAPI request, connection closed: %s: %s" % (type(e).__name__, e))
                return
            if request is None:
                return
            order, environ, body_len = request
            conn.served += 1
            try:
                environ = build_environ(environ, conn, body_len)
            except BadRequest as e:
                log("bad LSAPI request, connection closed: %s" % e)
                return
            if not run_app(app, environ, sock, order):
                return
    except OSError as e:
        log("connection failed: %s" % e)
    finally:
        sock.close()


# ---------------------------------------------------------------------------------------
# The accept loop and signals


class Stop(Exception):
    """A stop signal came while the worker waited for a connection."""


class Promote(Exception):
    """corral promoted this idle worker to be the template (docs/pools.md, "Reforking")."""


class Stopper:
    """SIGTERM and SIGINT raise a flag; a request in progress is finished first (Python
    retries interrupted system calls), and a worker waiting in accept() or for the next
    request on a kept connection stops at once (the handler raises out of the wait). The
    wakeup fd interrupts the preloader's select()."""

    def __init__(self):
        self.stopping = False
        self.idle = False
        self.promote = False
        self.channel = None
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

    def listen_for_promotion(self, channel):
        """PROMOTE_SIGNAL (SIGURG) from corral, after it wrote `promote` on `channel` (the
        worker's own control socket): between requests the wait is left at once; during
        one (corral drains the worker first, so only by a race) once it is answered."""
        self.channel = channel
        signal.signal(signal.SIGURG, self._promote)

    def _promote(self, signum, frame):
        try:
            msg = self.channel.recv(MAX_CONTROL, socket.MSG_DONTWAIT)
        except OSError:
            return  # a stray SIGURG (the app's own sockets): serve on
        if msg != b"promote":
            return
        self.promote = True
        if self.idle:
            raise Promote()


def serve(app, listener, stopper):
    # accept() waits at most ACCEPT_WAIT, then simply waits again: a stop or promotion
    # signal that arrived just before it blocked is handled when it returns. Linux copies
    # the listener's SO_RCVTIMEO to each accepted socket, which gets READ_TIMEOUT instead.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack("ll", ACCEPT_WAIT, 0))
    read_timeout = struct.pack("ll", READ_TIMEOUT, 0)
    while not stopper.stopping and not stopper.promote:
        stopper.idle = True
        try:
            if stopper.stopping or stopper.promote:
                return
            conn, _ = listener.accept()
        except (Stop, Promote):
            return
        except BlockingIOError:
            continue
        except OSError as e:
            log("accept failed: %s" % e)
            continue
        finally:
            stopper.idle = False
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, read_timeout)
            serve_connection(app, conn, stopper, listener)
        except (Stop, Promote):
            return
        except Exception:
            # Whatever went wrong belongs to that connection, which is closed: the worker
            # goes on with the next.
            log("connection failed:\n%s" % traceback.format_exc())


# ---------------------------------------------------------------------------------------
# The demo app of corral's embedded default configuration


DEMO_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>corral is running</title></head>
<body>
<h1>corral is running</h1>
<p>This page comes from <code>corral_demo</code>, a WSGI app served through corral's
embedded WSGI launcher (LSAPI on fd 0), one request at a time per worker.</p>
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


def become_template(app, listener, stopper):
    """The promoted worker, idle, becomes the template new workers are forked from
    (docs/pools.md, "Reforking"): its listener closed, its parent-death signal cleared
    (the old template retires), the database connections Django kept closed (each forked
    worker would otherwise share the socket), then the preloader's loop on the worker's
    own control socket."""
    listener.close()
    signal.signal(signal.SIGURG, signal.SIG_DFL)
    # The old template retires once its workers are gone: this one outlives it (and still
    # exits when corral closes the control socket).
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    except (OSError, AttributeError, ImportError) as e:
        log("cannot clear the parent-death signal: %s" % e)
    django_db = sys.modules.get("django.db")
    if django_db is not None:
        try:
            django_db.connections.close_all()
        except Exception:
            log("cannot close Django's database connections:\n%s" % traceback.format_exc())
    log("worker %d promoted to be the template" % os.getpid())
    try:
        preload(app, stopper.channel, stopper)
    except OSError as e:
        log("control socket failed: %s" % e)


def fork_worker(app, control, stopper, listener_fd, channel_fd=None):
    """Forks one worker serving `listener_fd` (and holding `channel_fd`, its own control
    socket, when the pool reforks); returns its pid (in the preloader)."""
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
        if channel_fd is not None:
            os.close(channel_fd)
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
        if channel_fd is not None:
            own.listen_for_promotion(socket.socket(fileno=channel_fd))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        serve(app, listener, own)
        if own.promote and not own.stopping:
            become_template(app, listener, own)
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
        # One descriptor: the worker's listening socket; two: also the worker's own control
        # socket (a pool that reforks).
        if len(words) != 2 or words[0] != b"fork" or not words[1].isdigit() or len(fds) not in (1, 2):
            for fd in fds:
                os.close(fd)
            log("ignoring a malformed control message (%d bytes, %d descriptors)" % (len(msg), len(fds)))
            continue
        pid = fork_worker(app, control, stopper, fds[0], fds[1] if len(fds) == 2 else None)
        control.send(b"forked %s %d" % (words[1], pid))


def make_undumpable():
    """No core dumps, and no ptrace or /proc/PID/mem by other processes of the same user
    (PR_SET_DUMPABLE 0): another pool's compromised worker running as this user must not
    read this one's memory or steer it. corral cannot set this for the launcher, since
    execve makes a process dumpable again; set before the app is loaded, it holds for the
    preloader and every worker it forks."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
            log("cannot make the process non-dumpable: %s" % os.strerror(ctypes.get_errno()))
    except (ImportError, OSError, AttributeError) as e:
        log("cannot make the process non-dumpable: %s" % e)


def main(argv):
    make_undumpable()
    install_stack_dump()
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
