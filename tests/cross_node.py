"""A client on one node using queues homed on another (a worker of a multi-worker server, or
a cluster node): the same scenarios for tests/workers and tests/cluster, on pika
connections the caller opened on the right nodes."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika

__all__ = ["EXPIRES_MS", "use_keeps_queue"]

EXPIRES_MS = 1500


def use_keeps_queue(home: pika.BlockingConnection, other: pika.BlockingConnection,
                    queue: str, use: str, exists: Callable[[str], bool]) -> None:
    """`queue` is declared with x-expires on home's node; `use` of it on other's node (a
    redeclare, a passive declare, a basic.get every 0.2 s, or a consumer) for twice its
    x-expires keeps it, and it expires once that stops (RabbitMQ's rule)."""
    hch = home.channel()
    hch.queue_declare(queue, arguments={"x-expires": EXPIRES_MS})
    hch.confirm_delivery()
    hch.basic_publish("", queue, b"marker")  # a queue expired and declared again has none
    ch = other.channel()
    deadline = time.monotonic() + 2 * EXPIRES_MS / 1000
    if use == "consume":
        tag = ch.basic_consume(queue, lambda *_: None, auto_ack=True)
        other.sleep(2 * EXPIRES_MS / 1000)
        ch.basic_cancel(tag)
    while time.monotonic() < deadline:  # a closed channel (404) raises here
        if use in ("declare", "passive"):
            ok = ch.queue_declare(queue, passive=use == "passive",
                                  arguments={"x-expires": EXPIRES_MS})
            assert ok.method.message_count == 1, f"{queue} expired and was declared again"
        elif use == "get":
            ch.basic_get(queue, auto_ack=True)
        other.sleep(0.2)
    assert exists(queue), f"{queue} expired while used on another node"
    deadline = time.monotonic() + 30
    while exists(queue):  # unused now: it goes
        assert time.monotonic() < deadline, f"{queue} did not expire"
        time.sleep(0.1)
