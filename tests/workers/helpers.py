"""A multi-worker hare-server for the tests: its worker processes found through /proc."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pika

from tests.conftest import BrokerProc, children, workers
from tests.mgmt.helpers import MgmtBroker

__all__ = ["WorkersBroker", "alive", "children", "connect", "one_per_worker", "process_tree_gone",
           "wait_for", "workers"]


_probes = itertools.count()


def alive(pid: int) -> bool:
    """Running (a zombie, killed and not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(check: object, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met in {timeout} s")
        time.sleep(0.05)


class WorkersBroker(MgmtBroker):
    """MgmtBroker run with `--workers N`. Its queues live on the worker of the connection that
    declares them (client-local, unless `args` name a locator): these tests cross workers on
    purpose, by choosing the connection; the default, auto, spreads them (test_placement)."""

    def __init__(self, data_dir: Path, count: int = 2, args: list[str] | None = None) -> None:
        args = list(args or [])
        if not any(a.startswith("--queue-master-locator") for a in args):
            args.append("--queue-master-locator=client-local")
        super().__init__(data_dir, ["--workers", str(count), *args])
        self.count = count

    def start(self, timeout: float = 60.0) -> WorkersBroker:
        super().start(timeout)
        return self

    def workers(self) -> dict[int, int]:
        return workers(self.pid)

    def node_of(self, queue: str) -> str:
        for q in self.get("/api/queues"):
            if q["name"] == queue:
                return str(q["node"])
        raise AssertionError(f"queue {queue} not listed")


def process_tree_gone(pids: list[int]) -> bool:
    return not any(alive(p) for p in pids)


def connect(b: BrokerProc) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))


def one_per_worker(b: WorkersBroker,
                   opener: Callable[[], pika.BlockingConnection] | None = None
                   ) -> dict[str, pika.BlockingConnection]:
    """Connections (`opener`'s, default guest's) until one landed on each worker (each
    declares an exclusive queue on a channel it keeps open, which lives on its connection's
    worker, and the management API says where)."""
    found: dict[str, pika.BlockingConnection] = {}
    for _ in range(60):
        conn = opener() if opener is not None else connect(b)
        probe = f"probe-{next(_probes)}"  # a name never used before: an earlier call's
        conn.channel().queue_declare(probe, exclusive=True)  # may still be being deleted
        node = b.node_of(probe)
        if node in found:
            conn.close()
        else:
            found[node] = conn
        if len(found) == b.count:
            return found
    raise AssertionError(f"60 connections landed on {sorted(found)} only")
