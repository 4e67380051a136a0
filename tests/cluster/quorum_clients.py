"""Clients for the quorum queue guarantee tests and the nemesis run: a publisher that publishes
numbered persistent messages one at a time with confirms (and again when one is not confirmed),
a consumer that acks and consumes again after basic.cancel or a lost connection, each in a
thread over pika against whichever node it is given; and the checker that says what was lost,
duplicated or reordered."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pika
from pika.exceptions import AMQPError, NackError, UnroutableError

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _params(url: str) -> pika.URLParameters:
    return pika.URLParameters(
        url + "%2F?heartbeat=0&socket_timeout=5&blocked_connection_timeout=30")


class _Client(threading.Thread):
    """What both clients share: a node to connect to (asked again after each failure) and
    the connection's life."""

    def __init__(self, url: Callable[[], str], name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.url = url
        self.failures = 0  # connections refused or lost
        self.stopping = threading.Event()

    def connect(self) -> pika.BlockingConnection | None:
        try:
            return pika.BlockingConnection(_params(self.url()))
        except AMQPError:
            self.failures += 1
            time.sleep(0.2)
            return None

    @staticmethod
    def close(conn: pika.BlockingConnection) -> None:
        try:
            if conn.is_open:
                conn.close()
        except (AMQPError, OSError):
            pass

    def stop(self) -> None:
        self.stopping.set()


class Publisher(_Client):
    """Publishes `<tag>:<i>` for i = 0, 1, ... (up to `count`), each until it is confirmed:
    `confirmed` lists them in confirm order. `url()` is asked again after a failure."""

    def __init__(self, url: Callable[[], str], queue: str, tag: str, *,
                 count: int | None = None, pace_s: float = 0.0) -> None:
        super().__init__(url, f"publisher-{tag}")
        self.queue = queue
        self.tag = tag
        self.count = count
        self.pace_s = pace_s
        self.confirmed: list[int] = []
        self.refused = 0  # nacks and returns (published again)

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set() and (self.count is None or i < self.count):
            conn = self.connect()
            if conn is None:
                continue
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stopping.is_set() and (self.count is None or i < self.count):
                    try:
                        ch.basic_publish("", self.queue, f"{self.tag}:{i}".encode(),
                                         PERSISTENT, mandatory=True)
                    except (NackError, UnroutableError):
                        self.refused += 1  # not confirmed: again, a little later
                        time.sleep(0.1)
                        continue
                    self.confirmed.append(i)
                    i += 1
                    if self.pace_s:
                        time.sleep(self.pace_s)
            except (AMQPError, OSError):
                self.failures += 1
                time.sleep(0.2)
            finally:
                self.close(conn)


class Consumer(_Client):
    """Consumes `queue` with acks (prefetch 50) and records every delivery (tag, i,
    redelivered) before acking it; consumes again after basic.cancel or a lost connection.
    `acked` holds the deliveries whose ack was written to the socket, with the time."""

    def __init__(self, url: Callable[[], str], queue: str, name: str = "consumer") -> None:
        super().__init__(url, name)
        self.queue = queue
        self.received: list[tuple[str, int, bool]] = []
        self.acked: list[tuple[str, int, float]] = []
        self.cancels = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            conn = self.connect()
            if conn is None:
                continue
            try:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=50)
                cancelled = threading.Event()
                ch.add_on_cancel_callback(lambda _, flag=cancelled: flag.set())
                ch.basic_consume(self.queue, self._on_message)
                while not self.stopping.is_set() and not cancelled.is_set():
                    conn.process_data_events(0.1)
                if cancelled.is_set():
                    self.cancels += 1
            except (AMQPError, OSError):
                self.failures += 1
            finally:
                self.close(conn)
            time.sleep(0.2)

    def _on_message(self, ch: pika.adapters.blocking_connection.BlockingChannel,
                    method: pika.spec.Basic.Deliver, _: pika.BasicProperties,
                    body: bytes) -> None:
        tag, _, number = body.decode().partition(":")
        self.received.append((tag, int(number), bool(method.redelivered)))
        ch.basic_ack(method.delivery_tag)
        self.acked.append((tag, int(number), time.monotonic()))


@dataclass
class Verdict:
    confirmed: int = 0
    delivered: int = 0
    lost: list[tuple[str, int]] = field(default_factory=list)
    duplicates: int = 0  # deliveries of a message delivered before (redeliveries)
    reordered: int = 0  # first deliveries of a publisher's message after a later one's

    def line(self) -> str:
        return (f"confirmed {self.confirmed}, delivered {self.delivered}, lost {len(self.lost)}"
                f", duplicated {self.duplicates}, reordered {self.reordered}")


def check(publishers: list[Publisher], consumers: list[Consumer]) -> Verdict:
    """Every confirmed message delivered at least once; duplicates counted; and per consumer
    and publisher, the messages delivered once and not as redeliveries in publish order (a
    returned message goes back to the head of the queue, as in RabbitMQ, so it may come
    again out of order; that is a duplicate, counted as such)."""
    v = Verdict()
    times: dict[tuple[str, int], int] = {}
    for c in consumers:
        for tag, i, _ in c.received:
            v.delivered += 1
            times[(tag, i)] = times.get((tag, i), 0) + 1
    v.duplicates = sum(n - 1 for n in times.values())
    for c in consumers:
        highest: dict[str, int] = {}
        for tag, i, redelivered in c.received:
            if redelivered or times[(tag, i)] > 1:
                continue
            if i < highest.get(tag, -1):
                v.reordered += 1
            highest[tag] = max(highest.get(tag, -1), i)
    for p in publishers:
        v.confirmed += len(p.confirmed)
        v.lost += [(p.tag, i) for i in p.confirmed if (p.tag, i) not in times]
    return v
