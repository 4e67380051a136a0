"""A client on one node using queues homed on another (a worker of a multi-worker server, or
a cluster node): the same scenarios for tests/workers and tests/cluster, on pika
connections the caller opened on the right nodes."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pika

__all__ = ["EXPIRES_MS", "check_global_prefetch", "fill", "use_keeps_queue"]

EXPIRES_MS = 1500


def fill(conn: pika.BlockingConnection, queue: str, count: int) -> None:
    """Declare `queue` on conn's node (its home) and publish `count` messages to it."""
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, str(i).encode())
    ch.close()


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


def check_global_prefetch(conn: pika.BlockingConnection, queues: list[str], limit: int,
                          total: int, per_consumer: int = 0,
                          then_fill: Callable[[], None] | None = None) -> None:
    """A channel of conn's with basic.qos(limit, global) and a consumer on each of `queues`
    (together `total` messages) never has more than `limit` unacked deliveries, however the
    queues' homes lie; the window fills to `limit` and refills as acks free it, until all
    came. `per_consumer`: a basic.qos(global=false) before, which each consumer holds too.
    `then_fill`: the queues are empty, the consumers start before basic.qos (which then
    applies to them too), and then_fill() publishes."""
    ch = conn.channel()
    if per_consumer:
        ch.basic_qos(prefetch_count=per_consumer)
    if then_fill is None:
        ch.basic_qos(prefetch_count=limit, global_qos=True)
    outstanding: list[tuple[int, str]] = []  # (delivery tag, consumer tag), oldest first
    seen: Counter[str] = Counter()

    def check() -> None:
        assert len(outstanding) <= limit, f"{len(outstanding)} unacked, global prefetch {limit}"
        if per_consumer:
            held = Counter(c for _, c in outstanding)
            assert max(held.values(), default=0) <= per_consumer, held

    def on_message(_ch: object, method: pika.spec.Basic.Deliver, _props: object,
                   _body: bytes) -> None:
        outstanding.append((method.delivery_tag, method.consumer_tag))
        seen[method.consumer_tag] += 1
        check()

    for q in queues:
        ch.basic_consume(q, on_message)
    if then_fill is not None:
        ch.basic_qos(prefetch_count=limit, global_qos=True)
        then_fill()
    deadline = time.monotonic() + 30
    while len(outstanding) < limit:
        assert time.monotonic() < deadline, f"only {len(outstanding)} of {limit} came"
        conn.process_data_events(time_limit=0.1)
    conn.process_data_events(time_limit=1.0)  # anything beyond the window would come now
    assert len(outstanding) == limit
    while sum(seen.values()) < total:
        assert time.monotonic() < deadline + 60, f"{sum(seen.values())} of {total} came"
        if outstanding:  # the oldest two at once (multiple): the queues race to refill
            ch.basic_ack(outstanding[min(1, len(outstanding) - 1)][0], multiple=True)
            del outstanding[:2]
        conn.process_data_events(time_limit=0.05)
    assert sum(seen.values()) == total
    assert len(seen) == len(queues), f"some consumer got nothing: {seen}"
    ch.close()
