#!/usr/bin/env python3
"""Docker HEALTHCHECK for Hare: is the broker answering AMQP?

Connects to the AMQP port, sends the AMQP 0-9-1 protocol header and expects connection.start
(a method frame on channel 0, class 10 method 10) or, from a broker that wants another
protocol version, its own protocol header. Exits 0 when healthy, 1 otherwise, with one line
that `docker inspect` shows. Standard library only: it runs before anything else is known to
work.

    hare-healthcheck [--host 127.0.0.1] [--port $HARE_PORT or 5672] [--timeout 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_METHOD = 1
_FRAME_END = 0xCE
_CONNECTION_START = (10, 10)
_MAX_START_FRAME = 1 << 20  # server properties and mechanisms: a few KiB in practice
_ANY_ADDRESS = ("", "0.0.0.0", "::")


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = sock.recv(count - len(chunks))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(chunks)} of {count} bytes")
        chunks += chunk
    return bytes(chunks)


def probe(host: str, port: int, timeout_s: float) -> str:
    """Return what the broker answered; raise OSError or ValueError when it is not healthy."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(PROTOCOL_HEADER)
        head = _recv_exactly(sock, 7)
        if head.startswith(b"AMQP"):
            version = _recv_exactly(sock, 1)
            raw = head[4:] + version
            return "AMQP broker answered with protocol header " + ".".join(map(str, raw[1:]))
        frame_type, channel, size = struct.unpack(">BHI", head)
        if frame_type != _FRAME_METHOD or channel != 0 or size > _MAX_START_FRAME:
            raise ValueError(f"not an AMQP answer: {head!r}")
        payload = _recv_exactly(sock, size + 1)
        method = struct.unpack(">HH", payload[:4]) if size >= 4 else None
        if method != _CONNECTION_START or payload[-1] != _FRAME_END:
            raise ValueError(f"expected connection.start, got method {method}")
        return "AMQP broker sent connection.start"


def _default_host() -> str:
    host = os.environ.get("HARE_HOST", "")
    return "127.0.0.1" if host in _ANY_ADDRESS else host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hare-healthcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=_default_host(), help="default: HARE_HOST or 127.0.0.1")
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("HARE_PORT") or 5672),
        help="default: HARE_PORT or 5672",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    args = parser.parse_args(argv)
    try:
        answer = probe(args.host, args.port, args.timeout)
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {args.host}:{args.port}: {exc or type(exc).__name__}")
        return 1
    print(f"healthy: {args.host}:{args.port}: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
