"""Test fixtures: a real Hare broker in a subprocess, on an ephemeral port, over real sockets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


class BrokerProc:
    """A hare-server process. `start()` waits for its "listening on port N" line."""

    def __init__(self, data_dir: Path, args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.args = list(args or [])
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> BrokerProc:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env.pop("HARE_CONFIG", None)
        cmd = [sys.executable, "-m", "broker", "--port", str(self.port or 0),
               "--data-dir", str(self.data_dir), "--log-format", "json",
               "--management-port", "0", *self.args]
        log = open(self.log_path, "a")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if "listening on port" in line:
                self.port = int(line.rsplit(" ", 1)[1])
                return self
        self.proc.kill()
        raise RuntimeError(f"broker did not start; log:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-5000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait: the clean shutdown path. Returns the exit code."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: the crash path."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self, clean: bool = True) -> BrokerProc:
        if clean:
            self.stop()
        else:
            self.kill()
        return self.start()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProc]:
    """One broker shared by the tests that don't restart it."""
    b = BrokerProc(tmp_path_factory.mktemp("shared") / "data").start()
    yield b
    b.stop()


@pytest.fixture
def pika_conns(broker: BrokerProc) -> Iterator[object]:
    """Open pika BlockingConnections to the shared broker (call it once per connection);
    they are closed after the test."""
    import pika

    made: list[pika.BlockingConnection] = []

    def make() -> pika.BlockingConnection:
        c = pika.BlockingConnection(pika.URLParameters(broker.url + "%2F?heartbeat=0"))
        made.append(c)
        return c

    yield make
    for c in made:
        if c.is_open:
            c.close()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProc]:
    """A broker of the test's own, for restarts, kills and special settings."""
    b = BrokerProc(tmp_path / "data")
    yield b
    b.kill()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    made: list[BrokerProc] = []

    def make(args: list[str] | None = None, env: dict[str, str] | None = None,
             name: str = "data") -> BrokerProc:
        b = BrokerProc(tmp_path / name, args, env)
        made.append(b)
        return b

    yield make
    for b in made:
        b.kill()
