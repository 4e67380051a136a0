"""What a client sees of a queue does not depend on the worker its connection landed on:
x-expires counts a use on any worker, and basic.qos global holds for a channel whose
consumers are on queues of both workers (RabbitMQ's rules for a cluster's nodes)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pika
import pytest

from tests.cross_node import check_global_prefetch, fill, use_keeps_queue
from tests.workers.helpers import WorkersBroker, one_per_worker

_names = itertools.count()


@pytest.fixture
def conns(two: WorkersBroker) -> Iterator[list[pika.BlockingConnection]]:
    """One connection on each worker."""
    found = one_per_worker(two)
    yield list(found.values())
    for conn in found.values():
        conn.close()


def _queue(conn: pika.BlockingConnection, prefix: str, messages: int) -> str:
    """A queue homed on conn's worker, with `messages`."""
    name = f"{prefix}-{next(_names)}"
    fill(conn, name, messages)
    return name


@pytest.mark.parametrize("use", ["declare", "passive", "get", "consume"])
def test_use_on_the_other_worker_resets_x_expires(
        two: WorkersBroker, conns: list[pika.BlockingConnection], use: str) -> None:
    home, other = conns
    name = f"exp-{use}-{next(_names)}"

    def exists(queue: str) -> bool:
        return any(q["name"] == queue for q in two.get("/api/queues"))

    use_keeps_queue(home, other, name, use, exists)


@pytest.mark.parametrize("homes", ["both", "other"])
def test_global_prefetch_across_workers(
        two: WorkersBroker, conns: list[pika.BlockingConnection], homes: str) -> None:
    """The consuming channel is on the first worker; its queues on both workers, or both
    on the other one."""
    first, second = conns
    queues = [_queue(first if homes == "both" else second, "gq", 20), _queue(second, "gq", 20)]
    homes_seen = {two.node_of(q) for q in queues}
    assert len(homes_seen) == (2 if homes == "both" else 1)
    check_global_prefetch(first, queues, limit=5, total=40)


def test_global_and_consumer_prefetch_across_workers(
        two: WorkersBroker, conns: list[pika.BlockingConnection]) -> None:
    """basic.qos global=false bounds each consumer, global=true the channel: both hold."""
    first, second = conns
    queues = [_queue(first, "gc", 15), _queue(second, "gc", 15)]
    check_global_prefetch(first, queues, limit=5, total=30, per_consumer=3)


def test_global_prefetch_set_after_consume(
        two: WorkersBroker, conns: list[pika.BlockingConnection]) -> None:
    """basic.qos global after the consumers started holds them too (RabbitMQ 3.10), the
    one on the other worker's queue included."""
    first, second = conns
    queues = [_queue(first, "ga", 0), _queue(second, "ga", 0)]

    def publish() -> None:
        fill(second, queues[0], 20)
        fill(second, queues[1], 20)

    check_global_prefetch(first, queues, limit=5, total=40, then_fill=publish)
