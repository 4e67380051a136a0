"""A client on one node using queues homed on another: x-expires counts its declares, gets
and consumers, and basic.qos global holds over consumers on both nodes' queues (RabbitMQ's
rules for a cluster). The same scenarios as tests/workers/test_cross_worker.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pika
import pytest

from tests.cross_node import check_global_prefetch, fill, use_keeps_queue

from .helpers import ClusterNode, EtcdProc, node_pair

_names = itertools.count()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProc
         ) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    with node_pair(tmp_path_factory.mktemp("cross"), etcd, "cross") as nodes:
        yield nodes


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


@pytest.mark.parametrize("per_consumer", [0, 3])
def test_global_prefetch_across_nodes(
        pair: tuple[ClusterNode, ClusterNode], conns: list[pika.BlockingConnection],
        per_consumer: int) -> None:
    """A channel on a consuming a's queue and b's: one window of 5 for both (and 3 for
    each consumer with basic.qos global=false too)."""
    a, b = pair
    ca, cb = conns
    queues = [f"gq-a-{next(_names)}", f"gq-b-{next(_names)}"]
    fill(ca, queues[0], 20)
    fill(cb, queues[1], 20)
    homes = _homes(a)
    assert (homes[queues[0]], homes[queues[1]]) == (a.name, b.name)
    check_global_prefetch(ca, queues, limit=5, total=40, per_consumer=per_consumer)
