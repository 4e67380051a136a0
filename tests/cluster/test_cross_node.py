"""A client on one node using queues homed on another: x-expires counts its declares, gets
and consumers (RabbitMQ's rule for a cluster). The same scenarios as
tests/workers/test_cross_worker.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pika
import pytest

from tests.cross_node import use_keeps_queue

from .helpers import ClusterNode, EtcdProc

_names = itertools.count()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProc
         ) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    root = tmp_path_factory.mktemp("cross")
    a = ClusterNode(root / "a", etcd, "cross", "cross-a").start()
    b = ClusterNode(root / "b", etcd, "cross", "cross-b").start()
    yield a, b
    b.stop()
    a.stop()


@pytest.fixture
def conns(pair: tuple[ClusterNode, ClusterNode]) -> Iterator[list[pika.BlockingConnection]]:
    """A connection to each node."""
    opened = [pika.BlockingConnection(pika.URLParameters(n.url + "%2F?heartbeat=0"))
              for n in pair]
    yield opened
    for conn in opened:
        conn.close()


def _homes(node: ClusterNode) -> dict[str, str]:
    return {q["name"]: q["node"] for q in node.get("/api/queues/%2F")}


@pytest.mark.parametrize("use", ["declare", "passive", "get", "consume"])
def test_use_on_another_node_resets_x_expires(
        pair: tuple[ClusterNode, ClusterNode], conns: list[pika.BlockingConnection],
        use: str) -> None:
    a, _ = pair
    home, other = conns
    name = f"exp-{use}-{next(_names)}"
    use_keeps_queue(home, other, name, use, lambda q: q in _homes(a))
