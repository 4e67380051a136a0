"""A hare-server of a benchmark's own: `python -m broker` on a free AMQP port and a free
management port, in a data directory the caller gives, stopped with SIGTERM, its management
API read as guest (bench_workers, bench_consumer_memory)."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Server", "hare_server"]


@dataclass(frozen=True, slots=True)
class Server:
    pid: int
    url: str  # amqp://guest:guest@127.0.0.1:<port>/
    mgmt_port: int

    def api(self, path: str) -> Any:
        """GET /api/... as guest, decoded."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.mgmt_port}{path}",
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)


@contextlib.contextmanager
def hare_server(data: Path, args: list[str]) -> Iterator[Server]:
    with socket.socket() as probe:  # a free port for the management API (0 would turn it off)
        probe.bind(("127.0.0.1", 0))
        mgmt = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "--port", "0", "--management-port", str(mgmt),
         "--data-dir", str(data), *args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on port" not in line:
            raise RuntimeError(f"hare-server {' '.join(args)} did not start")
        yield Server(proc.pid, f"amqp://guest:guest@127.0.0.1:{int(line.rsplit(' ', 1)[1])}/",
                     mgmt)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
