"""A broker subprocess with the management listener on, and a small HTTP client for its API
(urllib: the same library hare-ctl uses)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import BrokerProc, held_port


def free_port() -> int:
    """A port nobody listens on right now (bind to 0, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_request(base: str, method: str, path: str, body: Any = None, *, user: str = "guest",
                password: str = "guest", headers: dict[str, str] | None = None,
                timeout: float = 10.0) -> tuple[int, Any]:
    """(status, decoded JSON or None) of one request to the management API at `base`
    (http://host:port); HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, (json.loads(raw) if raw.strip() else None)


class MgmtBroker(BrokerProc):
    """tests.conftest.BrokerProc with `--management-port` set to a free port; `start()` also
    waits for the management listener's line."""

    def __init__(self, data_dir: Path, args: list[str] | None = None) -> None:
        super().__init__(data_dir, args)
        self.mgmt_port = 0
        self._held_mgmt = 0

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.mgmt_port}"

    def start(self, timeout: float = 20.0) -> MgmtBroker:
        if self._held_mgmt == 0:  # the same port across restarts, held (held_port)
            self._held_mgmt = held_port(self)
        want = self._held_mgmt
        base_args = self.args
        self.args = [*base_args, "--management-host", "127.0.0.1",
                     "--management-port", str(want)]
        try:
            super().start(timeout)  # returns at the AMQP listener's line; ours comes next
        finally:
            self.args = base_args
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("hare-management listening on port"):
            self.proc.kill()
            raise RuntimeError(f"management listener did not start; log:\n{self.log()}")
        self.mgmt_port = int(line.rsplit(" ", 1)[1])
        assert self.mgmt_port == want
        return self

    def api(self, method: str, path: str, body: Any = None, *, user: str = "guest",
            password: str = "guest", headers: dict[str, str] | None = None
            ) -> tuple[int, Any]:
        """(status, decoded JSON or None) of one request; HTTP errors are returned, not raised."""
        return api_request(self.http, method, path, body, user=user, password=password,
                           headers=headers)

    def get(self, path: str, **kw: Any) -> Any:
        status, body = self.api("GET", path, **kw)
        assert status == 200, (path, status, body)
        return body

    async def until(self, path: str, check: Any, timeout: float = 5.0) -> Any:
        """Poll GET path until check(body) is true (counts settle a loop turn after AMQP).
        Async, so the test's AMQP clients keep running while it waits."""
        deadline = time.monotonic() + timeout
        body = await asyncio.to_thread(self.get, path)
        while not check(body):
            if time.monotonic() > deadline:
                raise AssertionError(f"{path}: condition not met; last answer {body!r}")
            await asyncio.sleep(0.05)
            body = await asyncio.to_thread(self.get, path)
        return body

    def raw(self, path: str) -> tuple[int, str, str]:
        """(status, content type, text) without credentials."""
        try:
            with urllib.request.urlopen(self.http + path, timeout=10) as resp:
                return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()
