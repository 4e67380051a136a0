"""Test fixtures: a real Hare broker in a subprocess, on an ephemeral port, over real sockets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
WORKER_ENV = "_HARE_WORKER"  # set in each worker's environment by broker/node/supervisor.py

# Every broker the suite starts is one process unless the run asks for workers (make
# test-workers: HARE_WORKERS=2); the default, auto, would make each a parent and a worker per
# core. CI runs the suite both ways. A test that pins --workers keeps its own.
os.environ.setdefault("HARE_WORKERS", "1")


# Hypothesis times each example (deadline) and the drawing of its inputs (too_slow): on a busy
# machine, the more so with the suite in several processes, both fail for the machine's sake,
# not the code's (test_definitions' round trip: "only generated 4 valid inputs after 1.07
# seconds"); no timed assertions in tests. A test's own @settings still sets the rest.
settings.register_profile("hare", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("hare")


def worker_share(low: int, high: int) -> range:
    """This pytest-xdist worker's own slice of range(low, high) (the whole range outside
    xdist): the workers of a parallel run pick fixed ports from disjoint slices."""
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    size = (high - low) // count
    return range(low + index * size, low + (index + 1) * size)


def held_port(owner: object, port: int = 0) -> int:
    """`port` (0: a free one) held for `owner` until it is collected: a socket of this process
    bound to it on every IPv4 address, SO_REUSEADDR and never listening. Linux gives a port a
    socket is bound to to no other connect() or bind(0), while a broker's SO_REUSEADDR listener
    still binds and listens beside it (broker/server/listener.py). Without it a port freed by a
    stop was at times taken by another process's connection before the restart ("AMQP port N
    is already in use"), the more often the more processes run tests. A port that cannot be
    held (something listens there) is returned as it is."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        return port
    weakref.finalize(owner, sock.close)
    return int(sock.getsockname()[1])


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def workers(parent: int) -> dict[int, int]:
    """Worker index -> pid of a multi-worker hare-server, read from each child's environment
    (empty for a single process)."""
    found: dict[int, int] = {}
    for pid in children(parent):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in env:
            if entry.startswith(WORKER_ENV.encode() + b"="):
                found[json.loads(entry.split(b"=", 1)[1])["index"]] = pid
    return found


def rss(pid: int) -> int:
    """A process's resident set, bytes."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class BrokerProc:
    """A hare-server process. `start()` waits for its "listening on port N" line."""

    def __init__(self, data_dir: Path, args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.args = list(args or [])
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self._held = 0  # the port held_port() holds for this broker
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def serving_pids(self) -> list[int]:
        """The processes that serve clients and hold queues: the workers of a multi-worker
        server (HARE_WORKERS, --workers), else the one process."""
        found = workers(self.pid)
        return [found[i] for i in sorted(found)] or [self.pid]

    def node_dirs(self) -> list[Path]:
        """The data directories of the nodes: <data_dir>/w<i> for each worker of a
        multi-worker tree, else the data directory itself. Works on a stopped broker."""
        from broker.store.layout import node_dirs

        return node_dirs(self.data_dir)

    def queue_dir(self, name: str, area: str = "queues", vhost: str = "/") -> Path:
        """The directory of a queue's files under `area` (layout.QUEUES, STREAMS,
        TRANSIENT_QUEUES) in whichever node's directory holds them (its home worker's)."""
        from broker.store.layout import queue_dir_name

        found = [d / area / queue_dir_name(vhost, name) for d in self.node_dirs()
                 if (d / area / queue_dir_name(vhost, name)).is_dir()]
        assert len(found) == 1, (name, area, found)
        return found[0]

    def hold_port(self) -> int:
        """The AMQP port, picked now if none was set, and held for this broker's restarts
        (held_port)."""
        if self._held == 0 or self._held != self.port:
            self.port = self._held = held_port(self, self.port)
        return self.port

    def start(self, timeout: float = 20.0) -> BrokerProc:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.hold_port()
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

    def kill(self, tree: bool = True) -> None:
        """SIGKILL: the crash path. A multi-worker server's workers are killed first (killed
        alone, the parent has them stop cleanly: PR_SET_PDEATHSIG sends them SIGTERM);
        `tree=False` kills the parent only."""
        if self.proc is not None:
            for pid in workers(self.proc.pid).values() if tree else ():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self, clean: bool = True) -> BrokerProc:
        if clean:
            self.stop()
        else:
            self.kill()
        return self.start()


# Parallel runs (`make test`: pytest-xdist, `-n N --dist loadgroup`). Every broker listens on
# an ephemeral port with a data directory under the worker's own tmp_path, so tests of different
# files may run at once. Each file is one group (its module-scoped brokers and etcds start once,
# in one worker). The tests that need the machine to themselves are one group, HEAVY, so they
# run one after another in one worker and never beside each other: tests/spark (a SparkSession,
# a JVM: its start and the driver kills ran past their timeouts beside each other's load),
# tests/docker (podman builds and containers) and the flow tests that push hundreds of
# thousands of messages against a memory watermark. The session fixtures of tests/spark and
# tests/docker are then made once a run.
HEAVY = "heavy"
HEAVY_PATHS = ("spark", "docker", "flow/test_paging_e2e.py", "flow/test_slow_consumer.py")


def xdist_group(path: str) -> str:
    """The xdist group of a test file, by its path under tests/."""
    if any(path == p or path.startswith(p + "/") for p in HEAVY_PATHS):
        return HEAVY
    return path


def _group_of_nodeid(nodeid: str) -> str:
    return xdist_group(nodeid.split("::", 1)[0].removeprefix("tests/"))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """--dist loadgroup by xdist_group() instead of xdist_group marks: xdist 3.8 names a
    marked test's group by rewriting item._nodeid, which pytest 9 no longer reads (its nodeid
    comes from item._id), so the marks grouped nothing and every worker started its own
    SparkSession."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of_nodeid(nodeid)

    # The groups go out in the order of the collection, which pytest_collection_modifyitems
    # makes, not by size alone
    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return  # one process: the files' own order
    # xdist hands the groups out in this order: the heavy group, the longest, first, so it does
    # not start last and set the run's length; then the groups with most tests first (xdist's
    # own order for --dist loadscope).
    sizes: dict[str, int] = {}
    for item in items:
        group = _group_of_nodeid(item.nodeid)
        sizes[group] = sizes.get(group, 0) + 1

    def rank(item: pytest.Item) -> tuple[bool, int]:
        group = _group_of_nodeid(item.nodeid)
        return group != HEAVY, -sizes[group]

    items.sort(key=rank)


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
