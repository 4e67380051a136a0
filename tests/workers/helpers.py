"""A multi-worker hare-server for the tests: its worker processes found through /proc."""

from __future__ import annotations

import time
from pathlib import Path

import pika

from tests.conftest import BrokerProc, children, workers
from tests.mgmt.helpers import MgmtBroker

__all__ = ["WorkersBroker", "alive", "children", "connect", "one_per_worker", "process_tree_gone",
           "wait_for", "workers"]


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
    """MgmtBroker run with `--workers N`."""

    def __init__(self, data_dir: Path, count: int = 2, args: list[str] | None = None) -> None:
        super().__init__(data_dir, ["--workers", str(count), *(args or [])])
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


def one_per_worker(b: WorkersBroker) -> dict[str, pika.BlockingConnection]:
    """Connections until one landed on each worker (each declares an exclusive queue, which
    lives on its connection's worker, and the management API says where)."""
    found: dict[str, pika.BlockingConnection] = {}
    for i in range(60):
        conn = connect(b)
        conn.channel().queue_declare(f"probe-{i}", exclusive=True)
        node = b.node_of(f"probe-{i}")
        if node in found:
            conn.close()
        else:
            found[node] = conn
        if len(found) == b.count:
            return found
    raise AssertionError(f"60 connections landed on {sorted(found)} only")
