#!/usr/bin/env python3
"""Send LSAPI request files to a running lsphp and record its raw answers (I/O only).

Usage: capture.py SOCKET NAME...

For each NAME, connects to the unix socket SOCKET, writes NAME.request.bin (a BEGIN_REQUEST
packet plus raw body, written by corral's encoder: see tests/lsapi/captures.rs), shuts down
the writing half, and saves every byte lsphp sends until it closes the connection as
NAME.response.bin. The shutdown makes lsphp read EOF where the next request would start,
so it closes the connection right after RESP_END. One connection per request: LSAPI does
not pipeline. Files are read from and written to this script's folder.
"""
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def capture(sock_path, name):
    with open(os.path.join(HERE, name + ".request.bin"), "rb") as f:
        request = f.read()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(sock_path)
    s.sendall(request)
    s.shutdown(socket.SHUT_WR)
    chunks = []
    while True:
        data = s.recv(65536)
        if not data:
            break
        chunks.append(data)
    s.close()
    response = b"".join(chunks)
    with open(os.path.join(HERE, name + ".response.bin"), "wb") as f:
        f.write(response)
    print(f"{name}: sent {len(request)} bytes, received {len(response)} bytes")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for name in sys.argv[2:]:
        capture(sys.argv[1], name)


if __name__ == "__main__":
    main()
