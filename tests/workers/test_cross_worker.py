"""What a client sees of a queue does not depend on the worker its connection landed on:
x-expires counts a use on any worker (RabbitMQ's rule for a cluster's nodes)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pika
import pytest

from tests.cross_node import use_keeps_queue
from tests.workers.helpers import WorkersBroker, one_per_worker

_names = itertools.count()


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkersBroker]:
    b = WorkersBroker(tmp_path_factory.mktemp("cross") / "data", 2).start()
    yield b
    b.kill()


@pytest.fixture
def conns(two: WorkersBroker) -> Iterator[list[pika.BlockingConnection]]:
    """One connection on each worker."""
    found = one_per_worker(two)
    yield list(found.values())
    for conn in found.values():
        conn.close()


@pytest.mark.parametrize("use", ["declare", "passive", "get", "consume"])
def test_use_on_the_other_worker_resets_x_expires(
        two: WorkersBroker, conns: list[pika.BlockingConnection], use: str) -> None:
    home, other = conns
    name = f"exp-{use}-{next(_names)}"

    def exists(queue: str) -> bool:
        return any(q["name"] == queue for q in two.get("/api/queues"))

    use_keeps_queue(home, other, name, use, exists)
