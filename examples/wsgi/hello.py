"""A hello-world WSGI app for corral's embedded WSGI launcher (conf/wsgi.toml runs it):

    [pools.app]
    app = "wsgi:hello:application"
    cwd = "/path/to/examples/wsgi"

corral starts `python3 corral-wsgi.py hello:application` in `cwd` with the pool's socket on
fd 0 and speaks LSAPI to it; `curl http://127.0.0.1:8080/` then answers from here, and
`curl -d 'some text' http://127.0.0.1:8080/echo` sends the request body back.
Standard library only, like the launcher.
"""

import os
import platform


def application(environ, start_response):
    path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    if environ.get("PATH_INFO") == "/echo":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
    else:
        body = (
            "Hello from WSGI on Python %s, worker %d\nYou asked for %s\n"
            % (platform.python_version(), os.getpid(), path)
        ).encode("utf-8")
    start_response(
        "200 OK",
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
        ],
    )
    return [body]
